"""Starting and stopping a Ray node with colocate (``colocate ray start`` / ``colocate ray stop``).

``start(setup)`` runs ``colocate node`` (standalone, on ``setup.endpoint``), waits until it answers, then runs
``ray start --block`` with ``node_environment`` added to its environment and the ``colocate_opportunistic``
resource advertised, and waits until Ray says it started (or either process ends: ``StartFailed``, one line
naming the log, and the other one is stopped). Both run in sessions of their own with logs in the state
folder; their process ids go to ``STATE_DIR/ray.json``, which ``stop`` reads: it stops Ray, then the node, each
by process id (SIGTERM, SIGKILL after ``STOP_GRACE_S``), after checking that the id is still that process.
``ray start --block`` stops the raylet, its agents and its workers when it gets SIGTERM.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from colocate.base.endpoints import node_endpoint
from colocate.base.vocab import AUTO_DEVICE, DeviceKind
from colocate.ray.fields import OPPORTUNISTIC_RESOURCE
from colocate.ray.node import node_environment

STATE_FILE = "ray.json"
NODE_START_S = 30.0  # bound on the node coordinator's start
RAY_START_S = 120.0  # bound on `ray start` (a head on a loaded 2-core machine takes tens of seconds)
STOP_GRACE_S = 20.0  # SIGTERM, then SIGKILL after this
RAY_STARTED = "Ray runtime started"  # what `ray start` prints once its processes are up
LOOPBACK = ("127.0.0.1", "localhost")


class StartFailed(Exception):
    """A process did not start; the message is one line."""


@dataclass(frozen=True)
class NodeSetup:
    device: str  # resolved: sim | cuda
    sim_gpus: int
    sim_gpu_mem: int
    endpoint: str
    policy: str | None
    slots: int
    state_dir: str
    ray_args: tuple[str, ...]

    @classmethod
    def from_args(cls, args, extra: list[str], state_dir: str) -> NodeSetup:
        """From ``colocate ray start``'s options; ``extra``: what goes to ``ray start``. ValueError: one line."""
        device = args.device
        gpus = args.sim_gpus
        if device == AUTO_DEVICE or device == DeviceKind.CUDA:
            count = _nvml_count()
            if device == DeviceKind.CUDA and not count:
                raise ValueError("--device cuda: NVML sees no GPU on this machine")
            device = DeviceKind.CUDA if count else DeviceKind.SIM
            gpus = count or gpus
        slots = args.opportunistic_slots if args.opportunistic_slots is not None else gpus
        if slots < 0:
            raise ValueError(f"--opportunistic-slots must be 0 or more, got {slots}")
        if any(a == "--block" or a.startswith("--block=") for a in extra):
            raise ValueError("--block is colocate ray start's own option")
        endpoint = args.endpoint or node_endpoint()  # where `colocate top` and `colocate ctl` look by default
        return cls(device=device, sim_gpus=gpus, sim_gpu_mem=args.sim_gpu_mem, endpoint=endpoint,
                   policy=args.policy, slots=slots, state_dir=state_dir, ray_args=tuple(extra))

    def node_command(self) -> list[str]:
        argv = [sys.executable, "-m", "colocate", "node", "--device", self.device, "--endpoint", self.endpoint]
        if self.device == DeviceKind.SIM:
            argv += ["--sim-gpus", str(self.sim_gpus), "--sim-gpu-mem", str(self.sim_gpu_mem)]
        if self.policy:
            argv += ["--policy", self.policy]
        return argv

    def ray_command(self) -> list[str]:
        """``ray start --block`` with the user's options, the opportunistic resource merged into
        ``--resources`` and, for simulated GPUs, ``--num-gpus`` unless given."""
        if importlib.util.find_spec("ray") is None:
            raise StartFailed(f"Ray is not installed for {sys.executable}: install colocate with its ray extra "
                              "(pip install '.[ray]' in a checkout, 'colocate_gpu-VERSION-py3-none-any.whl[ray]' "
                              "from a wheel)")
        args = list(self.ray_args)
        resources: dict = {}
        for i, arg in enumerate(args):
            if arg == "--resources" or arg.startswith("--resources="):
                raw = arg.partition("=")[2] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
                try:
                    resources = json.loads(raw)
                except ValueError:
                    raise ValueError(f"--resources must be a JSON object, got {raw[:60]!r}") from None
                if not isinstance(resources, dict):
                    raise ValueError(f"--resources must be a JSON object, got {raw[:60]!r}")
                del args[i:i + (1 if "=" in arg else 2)]
                break
        if self.slots:
            resources.setdefault(OPPORTUNISTIC_RESOURCE, self.slots)
        if resources:
            args += ["--resources", json.dumps(resources)]
        if self.device == DeviceKind.SIM and not any(a == "--num-gpus" or a.startswith("--num-gpus=") for a in args):
            args += ["--num-gpus", str(self.sim_gpus)]
        return [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *args]

    def ray_environment(self, base: dict) -> dict:
        env = dict(base)
        env.update(node_environment(self.endpoint, self.device,
                                    self.sim_gpu_mem if self.device == DeviceKind.SIM else None, base))
        if _option(self.ray_args, "--node-ip-address") in LOOPBACK:
            # Ray turns a loopback address into the host's own unless told that this is a one-machine cluster
            env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        return env


class Interrupted(BaseException):
    """SIGTERM or SIGHUP came while ``start`` was starting: what it had started is stopped (``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``Interrupted`` in the block (once: a second one while it cleans up is ignored),
    as SIGINT raises KeyboardInterrupt, so that an interrupted start (``timeout``, a service stop) stops what it
    started; the previous handlers come back after."""
    def interrupt(signum, frame):
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def start(setup: NodeSetup, block: bool = False, out=sys.stdout) -> int:
    """Start both; returns 0 once Ray started (``block``: once both stopped after SIGTERM/SIGINT, 1 when one
    of them ended by itself). Raises StartFailed with one line; ``Interrupted`` (SIGTERM, SIGHUP) or
    KeyboardInterrupt (SIGINT) before both are up, once it has stopped what it had started."""
    state = Path(setup.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    recorded = _read_state(state)
    if recorded and any(_is_ours(recorded.get(k), w) for k, w in (("ray_pid", "ray"), ("node_pid", "colocate"))):
        raise StartFailed(f"already running (process ids in {state / STATE_FILE}): `colocate ray stop` first")
    setup.ray_command()  # a bad --resources is a usage error before anything starts
    with _interruptible():
        node = _spawn(setup.node_command(), state / "node.log", dict(os.environ), block)
        try:
            _wait_node(node, setup.endpoint, state / "node.log")
            ray_log = state / "ray.log"  # appended to: an earlier start's "Ray runtime started" is before `since`
            since = ray_log.stat().st_size if ray_log.exists() else 0
            ray = _spawn(setup.ray_command(), ray_log, setup.ray_environment(dict(os.environ)), block)
            try:
                _wait_ray(ray, ray_log, since)
            except BaseException:
                _stop_pid(ray.pid)
                raise
        except BaseException:
            _stop_pid(node.pid)
            raise
        (state / STATE_FILE).write_text(json.dumps({"node_pid": node.pid, "ray_pid": ray.pid,
                                                    "endpoint": setup.endpoint}) + "\n")
    print(f"colocate ray: node coordinator (pid {node.pid}) on {setup.endpoint}, Ray (pid {ray.pid}) with the "
          f"colocate plugin; logs in {state}; stop with `colocate ray stop`", file=out, flush=True)
    if not block:
        return 0
    return _supervise(node, ray, state)


def stop(state_dir: str) -> str:
    """Stop what ``start`` recorded in ``state_dir`` (Ray, then the node); returns one line saying what."""
    state = Path(state_dir)
    recorded = _read_state(state)
    if not recorded:
        return f"colocate ray: nothing to stop (no {state / STATE_FILE})"
    stopped = []
    for key, word, what in (("ray_pid", "ray", "Ray"), ("node_pid", "colocate", "the node coordinator")):
        pid = recorded.get(key)
        if isinstance(pid, int) and _is_ours(pid, word):
            _stop_pid(pid)
            stopped.append(f"{what} (pid {pid})")
    (state / STATE_FILE).unlink(missing_ok=True)
    return "colocate ray: stopped " + (" and ".join(stopped) if stopped else "nothing (both had ended)")


# ---------------------------------------------------------------- processes


def _spawn(argv: list[str], log: Path, env: dict, block: bool) -> subprocess.Popen:
    with open(log, "ab") as f:
        try:
            return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=not block)
        except OSError as exc:
            raise StartFailed(f"cannot start {argv[0]}: {exc.strerror}") from None


def _read_from(log: Path, since: int = 0) -> str:
    """What ``log`` holds from byte ``since`` on ("" when it cannot be read)."""
    try:
        with open(log, "rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _last_line(log: Path, since: int = 0) -> str:
    lines = [ln.strip() for ln in _read_from(log, since).splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def _wait_node(proc: subprocess.Popen, endpoint: str, log: Path) -> None:
    from colocate.clients.node import NoAnswer, list_jobs, resolve_ctl_endpoint

    ctl = resolve_ctl_endpoint(endpoint, None)
    deadline = time.monotonic() + NODE_START_S
    while True:
        if proc.poll() is not None:
            raise StartFailed(f"the colocate node exited ({proc.returncode}): {_last_line(log)} (log: {log})")
        try:
            list_jobs(ctl, timeout_s=0.5)
            return
        except NoAnswer:
            pass
        if time.monotonic() > deadline:
            raise StartFailed(f"the colocate node did not answer on {ctl} within {NODE_START_S:g} s (log: {log})")


def _wait_ray(proc: subprocess.Popen, log: Path, since: int = 0) -> None:
    """Return once ``proc`` (a ``ray start``) wrote RAY_STARTED to ``log`` after byte ``since`` (the log is
    appended to: an earlier start's line does not count); StartFailed when it exits first or after RAY_START_S."""
    deadline = time.monotonic() + RAY_START_S
    while True:
        if RAY_STARTED in _read_from(log, since):
            return
        if proc.poll() is not None:
            raise StartFailed(f"`ray start` exited ({proc.returncode}): {_last_line(log, since)} (log: {log})")
        if time.monotonic() > deadline:
            raise StartFailed(f"`ray start` did not start within {RAY_START_S:g} s (log: {log})")
        time.sleep(0.2)


def _supervise(node: subprocess.Popen, ray: subprocess.Popen, state: Path) -> int:
    """``--block``: wait for SIGTERM/SIGINT or for one process to end; then stop both."""
    asked = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: asked.append(signum))
    while not asked and node.poll() is None and ray.poll() is None:
        time.sleep(0.2)
    ended = [name for name, p in (("Ray", ray), ("the colocate node", node)) if p.poll() is not None]
    _stop_pid(ray.pid)
    _stop_pid(node.pid)
    (state / STATE_FILE).unlink(missing_ok=True)
    if asked:
        return 0
    print(f"colocate ray: {' and '.join(ended)} ended by itself (logs in {state}): stopped the other",
          file=sys.stderr)
    return 1


def _is_ours(pid, word: str) -> bool:
    """``pid`` is alive, not a zombie, and its command line names ``word`` (so a reused id is left alone)."""
    import psutil

    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and any(word in part for part in proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _stop_pid(pid: int) -> None:
    """SIGTERM ``pid``, SIGKILL it after ``STOP_GRACE_S``; returns once it is gone (or a zombie)."""
    import psutil

    def gone(proc) -> bool:
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            return
        deadline = time.monotonic() + STOP_GRACE_S
        while not gone(proc) and time.monotonic() < deadline:
            time.sleep(0.1)
        if gone(proc):
            return


def _read_state(state: Path) -> dict:
    try:
        value = json.loads((state / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _option(args, name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.partition("=")[2]
    return None


def _nvml_count() -> int:
    try:
        from colocate.gpus.nvml import device_count

        return int(device_count())
    except Exception:  # no NVML binding or driver: no CUDA GPU to manage
        return 0
