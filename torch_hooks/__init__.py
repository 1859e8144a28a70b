"""colocate's in-job runtime for PyTorch.

Nothing happens on import. ``install()`` (called by the launcher's injected
``sitecustomize`` right after ``import torch`` completes) runs the engine's resolver
(``colocate.base.engines``), reads the ``COLOCATE_*`` variables, registers with the node first
where the worker must (``torch_hooks.link.register_first``: a partition, a GPU the node
picks, ``COLOCATE_NODE_REQUIRED``, any worker with a node: a refusal stops it; before the device opens, so
before CUDA starts), then
installs the device (memory cap, busy clock), the mini-batch hooks and the statistics writer. Public, thread-safe API::

    torch_hooks.install(env=None) -> Runtime    # idempotent; env None: from os.environ (colocate.base.engines.prepare)
    torch_hooks.step()                          # explicit boundary (loops the hooks cannot see)
    torch_hooks.set_limits(mem_cap=None, sm_share=None)
    torch_hooks.limits() -> {"mem_cap", "sm_share", "seq"}
    torch_hooks.stats() -> dict                 # the --stats-file summary so far
    torch_hooks.mem_get_info() -> (free, total) # the cap is the total
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

from colocate.base.vocab import DeviceKind

_rt = None
_died_of_oom = False  # the process is ending on an uncaught out-of-memory error (its cap): said in its Goodbye
_lock = threading.Lock()
_fork_hooked = False


def install(env=None):
    """Install the runtime in this process once; returns the ``Runtime`` (None when the engine's resolver
    deferred it: ``colocate.base.engines.Deferred``)."""
    global _rt, _fork_hooked
    with _lock:
        if _rt is not None:
            return _rt
        from colocate.base.env import JobEnv
        from torch_hooks.device import job_device
        from torch_hooks.hooks import install_hooks
        from torch_hooks.runtime import Runtime

        globals()["runtime"] = _runtime_accessor  # the submodule import rebinds the name

        if env is None:
            from colocate.base.engine_api import Deferred
            from colocate.base.engines import prepare

            try:
                prepare(os.environ)  # the engine's resolver, then a token of its own: before anything reads them
            except Deferred as deferred:
                deferred.when(_install_deferred)  # the engine's worker is not set up yet: install once it is
                return None
            env = JobEnv.from_environ()
        logging.basicConfig(format="colocate[%(process)d] %(levelname)s %(message)s")
        logging.getLogger("colocate").setLevel(env.log.upper())
        if env.node:
            from torch_hooks.link import register_first

            picking = env.pick_gpu
            env = register_first(env)  # before the device opens: a refusal stops the process, a pick binds it
            if picking and env.device == DeviceKind.CUDA:
                _select_cuda_device(env.gpu)
        device = job_device(env)
        device.install()
        rt = Runtime(env, device, learn=True)
        install_hooks(rt)
        _install_excepthook(env.device)
        atexit.register(_at_exit, rt)
        if env.stats_dir:
            _snapshots(rt)
        if not _fork_hooked:  # once per process: it cannot be removed, and it acts on whatever runtime is installed
            os.register_at_fork(after_in_child=_forked)
            _fork_hooked = True
        if env.node:
            from torch_hooks.link import NodeLink

            link = NodeLink(env, rt)
            rt.link = link  # type: ignore[attr-defined]  # found by uninstall()
            link.start()
        _rt = rt
        return rt


def _install_deferred() -> None:
    """``install()`` called back by an engine once its worker is set up (``colocate.base.engines.Deferred``); a
    refusal ends the worker as the injected sitecustomize does: one line, exit 2."""
    try:
        install()
    except ValueError as exc:
        print(f"colocate: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def _select_cuda_device(gpu: int) -> None:
    """Make NVML GPU ``gpu`` this process's only CUDA device (``cuda:0``); CUDA must not have started."""
    import torch

    if torch.cuda.is_initialized():
        raise ValueError(f"COLOCATE_GPUS=node: CUDA started before the node's GPU {gpu} could be selected")
    from colocate.gpus.nvml import visible_device

    os.environ["CUDA_VISIBLE_DEVICES"] = visible_device(gpu)


def runtime():
    """The installed ``Runtime`` or None."""
    return _rt


_runtime_accessor = runtime


def _require():
    if _rt is None:
        raise RuntimeError("colocate runtime is not installed: run under `colocate run` or call torch_hooks.install()")
    return _rt


def step() -> None:
    """Mark a mini-batch boundary (source ``step``) for a loop the hooks cannot see:
    no optimizer and no ``backward()`` (see ``torch_hooks.hooks``)."""
    _require().on_boundary("step")


def set_limits(mem_cap: int | None = None, sm_share: float | None = None) -> None:
    _require().set_limits(mem_cap=mem_cap, sm_share=sm_share)


def limits() -> dict:
    return _require().limits()


def stats() -> dict:
    return _require().summary()


def mem_get_info() -> tuple[int, int]:
    return _require().device.mem_get_info()


def _forked() -> None:
    """``os.register_at_fork``'s child hook: a forked child (a multiprocessing worker, a plain fork) runs on with
    the runtime; it counts from the fork, leaves the parent's link alone (ZeroMQ sockets do not survive a fork)
    and writes its own statistics as it exits: at exit as any process, or, a multiprocessing child that ends
    with ``os._exit``, among multiprocessing's exit finalizers (registered once its bootstrap has cleared the
    parent's)."""
    global _forked_child
    rt = _rt
    if rt is None:
        return
    _forked_child = True
    link = getattr(rt, "link", None)
    rt.forked((link, getattr(link, "publisher", None)) if link is not None else ())
    rt.link = None  # set by install() where there is a node
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        mp_util.register_after_fork(rt, _mp_child)


def _mp_child(rt) -> None:
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _write_stats, args=(rt,), exitpriority=0)


def _at_exit(rt) -> None:
    rt.close()
    link = getattr(rt, "link", None)
    if link is not None:
        from colocate.protocol import GOODBYE_OOM

        link.stop(GOODBYE_OOM if _died_of_oom else "exit")  # the node tells the scheduler the run's exit state
    _write_stats(rt)


_written_by = 0  # the pid that wrote its statistics (a forked child may reach both exit paths)
_forked_child = False  # this process is a child os.fork made of the job's (``_forked``)
_stats_lock = threading.Lock()  # the final write and the snapshots (one file per process)
SNAPSHOT_S = 5.0  # seconds between the statistics snapshots of a running process


def _write_stats(rt, final: bool = True) -> None:
    """This process's summary into ``COLOCATE_STATS_DIR`` as ``stats-PID.json``: a snapshot (``final`` False, every
    ``SNAPSHOT_S``: what a process killed by a signal leaves), then once at exit; none from a forked child that ran
    no mini-batch (a DataLoader's worker: its CPU time is no device time, as a simulated GPU counts it)."""
    global _written_by
    stats_dir = rt.env.stats_dir
    with _stats_lock:
        if _written_by == os.getpid() or (_forked_child and not rt.book.iterations):
            return
        if final:
            _written_by = os.getpid()
        if not stats_dir:
            return
        from colocate.base.files import write_json_atomic

        try:
            os.makedirs(stats_dir, exist_ok=True)
            write_json_atomic(os.path.join(stats_dir, f"stats-{os.getpid()}.json"), rt.summary())
        except OSError as exc:
            if final:
                print(f"colocate: could not write statistics to {stats_dir}: {exc}", file=sys.stderr)


def _snapshots(rt) -> None:
    """Write ``rt``'s statistics every ``SNAPSHOT_S`` until the final write (a daemon thread of the process that
    installed the runtime; a forked child writes at its exit only)."""
    pid = os.getpid()

    def loop() -> None:
        import time

        while True:
            time.sleep(SNAPSHOT_S)  # read at each wait
            if os.getpid() != pid or _written_by == pid:  # a forked copy, or the final write done: it ends
                return
            _write_stats(rt, final=False)

    threading.Thread(target=loop, name="colocate-stats", daemon=True).start()


def _install_excepthook(device: str) -> None:
    """Print the cap error as one line instead of a traceback (``--on-cap error``)."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        global _died_of_oom
        text = str(exc)
        marker = text.find("colocate: device memory cap")
        if marker >= 0:
            _died_of_oom = True
            print(text[marker:].splitlines()[0], file=sys.stderr)
            return
        if device == DeviceKind.CUDA and exc_type.__name__ == "OutOfMemoryError" and _rt is not None:
            _died_of_oom = True
            from colocate.base.units import format_size

            cap = _rt.limits()["mem_cap"]
            first = text.strip().splitlines()[0] if text.strip() else "out of memory"
            print(f"colocate: device memory cap of {format_size(cap)} exceeded: {first}", file=sys.stderr)
            return
        previous(exc_type, exc, tb)

    sys.excepthook = hook
