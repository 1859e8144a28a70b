"""``colocate run``: start an unmodified command with the job runtime injected.

Spec/runtime split in the style of torchrun: ``RunSpec`` is the validated,
immutable description of the job; ``launch(spec)`` is the runtime that builds
the environment, starts the command, forwards signals, merges the per-process
statistics into ``--stats-file`` and returns the child's exit code
(128 + N when the child died of signal N).

A job may be several processes (``torchrun --nproc-per-node N``): ``RunSpec.gpus``
lists the job's GPUs (``COLOCATE_GPUS``; on CUDA, ``CUDA_VISIBLE_DEVICES`` names the
same GPUs by NVML UUID in the same order), and each process with torchrun's
``LOCAL_RANK`` manages GPU number LOCAL_RANK of the list, which is its
``cuda:LOCAL_RANK``. Under a node each such worker registers as ``JOB/RANK``.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import colocate
from colocate.base import autogroup, stats
from colocate.base.commandline import python_script
from colocate.base.env import JobEnv, format_gpus
from colocate.base.files import write_json_atomic
from colocate.base.vocab import DeviceKind, JobClass, OnCap, member

INJECT_DIR = str(Path(__file__).with_name("_inject"))
PROJECT_ROOT = str(Path(colocate.__file__).resolve().parent.parent)
FORWARDED = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGCONT")
PER_JOB = ("COLOCATE_GPU", "COLOCATE_GPUS", "COLOCATE_ENGINE", "COLOCATE_PARTITION", "COLOCATE_RANK",
           "COLOCATE_WORLD_SIZE", "COLOCATE_LOCAL_RANK", "COLOCATE_ITERATIONS", "COLOCATE_EPOCHS")  # never inherited: the launcher decides them
MAX_JOB_ID_CHARS = 112  # the wire allows 128: room for a worker's "/RANK"


class LaunchError(Exception):
    """A bad command line or command; the CLI prints it and exits ``code``: 2, or a shell's 127 (the command is
    not found) and 126 (found, but it cannot be run)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


NOT_FOUND, NOT_EXECUTABLE = 127, 126  # the exit codes a shell gives for these


@dataclass(frozen=True)
class RunSpec:
    command: tuple[str, ...]
    device: DeviceKind = DeviceKind.SIM  # resolved (never auto)
    gpu: int = 0  # the job's one GPU when ``gpus`` is empty (the older single-GPU form)
    gpus: tuple[int, ...] = ()  # the job's GPUs, distinct node indices in order; () = (gpu,)
    gpu_mem: int | None = None
    sm_share: float = 1.0
    klass: JobClass = JobClass.GUARANTEED  # the job class (--priority)
    on_cap: OnCap = OnCap.HOST
    stats_file: str | None = None
    job_id: str | None = None
    node: str | None = None
    sim_gpu_mem: int | None = None
    log: str = "warning"
    exit_file: str | None = None  # where the exit code is written when the command ends
    lease_file: str | None = None  # a node's lease (``colocate.base.lease``): the command is stopped when it lapses
    partition: bool = False  # a guaranteed fixed partition: gpu_mem and sm_share are its own, never changed
    iterations: int | None = None  # the job's total mini-batches, as its submitter said (COLOCATE_ITERATIONS)
    epochs: int | None = None  # its epochs (COLOCATE_EPOCHS)

    def __post_init__(self) -> None:
        """A vocabulary field given as its string becomes the member (ValueError, one line, for another string)."""
        for name, vocab in (("device", DeviceKind), ("klass", JobClass), ("on_cap", OnCap)):
            object.__setattr__(self, name, member(vocab, getattr(self, name), name))

    @property
    def job_gpus(self) -> tuple[int, ...]:
        return tuple(self.gpus) or (self.gpu,)


def check_command(command: tuple[str, ...], path: str | None, cwd: str | None = None) -> None:
    """Raise LaunchError if the program or the Python script cannot be found (relative paths are taken
    from ``cwd``, default the current directory; bare names are searched on ``path``)."""
    if not command:
        raise LaunchError("no command given: usage is `colocate run [options] -- CMD [ARGS...]`")

    def here(p: str) -> str:
        return os.path.join(cwd, p) if cwd else p

    program = command[0]
    if os.sep in program:
        if not os.path.exists(here(program)):
            raise LaunchError(f"command not found: {program}", NOT_FOUND)
    elif shutil.which(program, path=path) is None:
        raise LaunchError(f"command not found: {program}", NOT_FOUND)
    if os.path.basename(program).startswith("python"):
        script = python_script(command[1:])
        if script is not None and script != "-" and not os.path.exists(here(script)):
            raise LaunchError(f"script not found: {script}")



def job_environment(spec: RunSpec, base: dict, stats_dir: str) -> dict:
    """The child's environment: ``base`` plus the COLOCATE_* table and injection."""
    env = {k: v for k, v in base.items() if k not in PER_JOB}  # this job's own only
    # only the simulated GPU's settings are inherited; a COLOCATE_NODE_REQUIRED=1 of the caller stays in the
    # environment and is checked in the job, against the job's own COLOCATE_NODE (--node)
    inherited = JobEnv.from_environ({k: v for k, v in env.items() if k != "COLOCATE_NODE_REQUIRED"})
    gpus = spec.job_gpus
    job = JobEnv(
        enabled=True,
        job_id=spec.job_id or f"job-{os.getpid()}",
        token=os.urandom(16).hex(),  # secrets.token_hex, without importing hashlib at every start
        device=spec.device,
        gpu=gpus[0],
        gpus=gpus,
        gpu_mem=spec.gpu_mem,
        sm_share=spec.sm_share,
        klass=spec.klass,
        on_cap=spec.on_cap,
        stats_dir=stats_dir,
        node=spec.node,
        sim_core=inherited.sim_core,
        sim_gpu_mem=spec.sim_gpu_mem or inherited.sim_gpu_mem,
        log=spec.log,
        partition=spec.partition,
        iterations=spec.iterations,
        epochs=spec.epochs,
    )
    env.update(job.to_environ())
    old_pp = base.get("PYTHONPATH", "")
    env["COLOCATE_CHAIN_SITECUSTOMIZE"] = os.pathsep.join([p for p in old_pp.split(os.pathsep) if p] + sys.path)
    env["PYTHONPATH"] = os.pathsep.join([INJECT_DIR, PROJECT_ROOT] + ([old_pp] if old_pp else []))
    if spec.device == DeviceKind.SIM:
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("MKL_NUM_THREADS", "1")
    else:
        from colocate.gpus.nvml import visible_device

        # by UUID: CUDA's own device order (fastest first) need not be NVML's, whose indices --gpus are;
        # in --gpus order, so a worker's cuda:LOCAL_RANK is GPU number LOCAL_RANK of the list
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_device(g) for g in gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def merge_stats(stats_dir: str) -> dict:
    """One summary for the job from its processes' ``stats-<pid>.json`` files (``colocate.base.stats``)."""
    procs = []
    for path in sorted(glob.glob(os.path.join(stats_dir, "stats-*.json"))):
        try:
            with open(path) as f:
                procs.append(json.load(f))
        except (OSError, ValueError):
            continue
    return stats.merge(procs)


def check_job_id(job_id: str) -> None:
    """Raise LaunchError unless ``job_id`` is one the job can register with: 1 to ``MAX_JOB_ID_CHARS`` characters,
    and what the wire accepts as a job id (``colocate.protocol.JOB_ID``: no control characters)."""
    if not 1 <= len(job_id) <= MAX_JOB_ID_CHARS:
        raise LaunchError(f"--job-id: 1 to {MAX_JOB_ID_CHARS} characters, got {len(job_id)}")
    from colocate.protocol import JOB_ID, ProtocolError  # only for a job id given: most launches have none

    try:
        JOB_ID.check(job_id, "--job-id")
    except ProtocolError as exc:
        raise LaunchError(str(exc)) from None


def launch(spec: RunSpec) -> int:
    """Run the job to completion; returns the exit code for the launcher."""
    base = dict(os.environ)
    check_command(spec.command, base.get("PATH"))
    gpus = spec.job_gpus
    if len(set(gpus)) != len(gpus):
        raise LaunchError(f"--gpus {format_gpus(gpus)}: lists a GPU twice")
    if spec.job_id is not None:
        check_job_id(spec.job_id)
    if spec.device == DeviceKind.CUDA:
        from colocate.gpus.nvml import device_count as nvml_device_count

        count = nvml_device_count()
        if count and max(gpus) >= count:
            raise LaunchError(f"--gpus {format_gpus(gpus)}: this machine has {count} CUDA GPU(s), "
                              f"indices 0..{count - 1}")
    check_exit_file(spec.exit_file)
    remove_stale_stats_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{STATS_PREFIX}{os.getpid()}-") as stats_dir:
        env = job_environment(spec, base, stats_dir)
        if spec.device == DeviceKind.SIM:
            # the launcher, and the job until its runtime pins it, stay off the simulated GPU's core
            from colocate.gpus.sim import core_of, keep_off_cores

            job = JobEnv.from_environ(env)
            keep_off_cores({core_of(replace(job, gpu=g)) for g in gpus})
        session_nice = autogroup.nice()
        watch = _lease_watch(spec.lease_file)  # read once before the command starts: what the node promised
        try:  # in every mode: a launcher killed by SIGKILL takes its command with it
            child = subprocess.Popen(list(spec.command), env=env, preexec_fn=_die_with_parent(os.getpid()))
        except OSError as exc:
            code = NOT_FOUND if isinstance(exc, FileNotFoundError) else NOT_EXECUTABLE
            raise LaunchError(f"cannot start {spec.command[0]}: {exc.strerror}", code) from None
        previous = _forward_signals(child, spec.device == DeviceKind.SIM)
        try:
            code = _wait_fenced(child, watch, spec.device == DeviceKind.SIM) if watch is not None else child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            restore_autogroup(session_nice)
        if spec.stats_file:
            summary = merge_stats(stats_dir)
            summary["exit_code"] = 128 - code if code < 0 else code  # as this command exits: 128+N for signal N
            try:
                write_json_atomic(spec.stats_file, summary)
            except OSError as exc:
                print(f"colocate run: cannot write --stats-file {spec.stats_file}: {exc.strerror}", file=sys.stderr)
    code = 128 - code if code < 0 else code
    write_exit_file(spec.exit_file, code)
    return code


def _lease_watch(lease_file: str | None):
    """The ``LeaseWatch`` of ``--lease-file`` (None without one), checked once: the node incarnation that started
    this worker is ``COLOCATE_PLACEMENT``'s epoch (none: not checked)."""
    if not lease_file:
        return None
    from colocate.base.lease import LeaseWatch, lease_clock, parse_marker

    marker = parse_marker(os.environ.get("COLOCATE_PLACEMENT"))
    watch = LeaseWatch(lease_file, marker[1] if marker else None)
    watch.check(lease_clock())
    return watch


def _wait_fenced(child: subprocess.Popen, watch, sim: bool = False) -> int:
    """Wait for ``child`` while its node's lease holds for it (``watch``: a ``colocate.base.lease.LeaseWatch``, checked
    every ``LEASE_CHECK_S``). Once it lapses: SIGTERM to this process group (the launcher, placed by its node in a
    session of its own, ignores it), SIGKILL to the group ``grace_s`` later (the launcher dies with it; the node
    reports the exit as fenced)."""
    from colocate.base.endpoints import LEASE_CHECK_S
    from colocate.base.lease import lease_clock

    while True:
        try:
            return child.wait(timeout=LEASE_CHECK_S)
        except subprocess.TimeoutExpired:
            pass
        why = watch.check(lease_clock())
        if why is not None:
            break
    grace_s = watch.grace_s
    print(f"colocate run: {why}: stopping the job (SIGTERM, SIGKILL in {grace_s:g} s)", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sim:
        _release_for_exit(child)
    group = os.getpgrp()
    if group == os.getpid():
        os.killpg(group, signal.SIGTERM)
    else:  # not a group of our own (started by hand): the child alone
        child.send_signal(signal.SIGTERM)
    try:
        return child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    if group == os.getpid():
        os.killpg(group, signal.SIGKILL)  # ourselves included
    child.kill()
    return child.wait()


def _die_with_parent(parent: int):
    """A ``preexec_fn``: the child gets SIGKILL when its launcher dies (``PR_SET_PDEATHSIG``), so a killed
    launcher (standalone, ``--node`` or fenced) never leaves its job behind; a launcher that died before the
    setting took effect (the parent is no longer ``parent``) ends the child at once."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    PR_SET_PDEATHSIG = 1

    def set_pdeathsig() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(137)

    return set_pdeathsig


def check_exit_file(path: str | None) -> None:
    """Raise LaunchError unless ``path`` can take the exit code: a regular file or none yet, in a folder this user
    may write (a missing folder is made when the code is written: a node's log folder may be deleted and made
    again). Checked before the command starts, so that a job never runs to lose its exit code."""
    if not path:
        return
    if os.path.exists(path) and not os.path.isfile(path):
        raise LaunchError(f"--exit-file {path}: not a regular file (the exit code is written by replacing it)")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
        raise LaunchError(f"--exit-file {path}: the folder {folder} is not writable")


def write_exit_file(path: str | None, code: int) -> None:
    """Record the launcher's exit code in ``path`` (atomically; a node reads it for workers it re-adopted). Its
    folder is made again if it was removed meanwhile (a node's deleted state folder); never over a file that is not
    a regular one. A failure is said in one line on stderr."""
    if not path:
        return
    if os.path.exists(path) and not os.path.isfile(path):
        print(f"colocate run: cannot write the exit file {path}: not a regular file", file=sys.stderr)
        return
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_json_atomic(path, code)  # "CODE\n"
    except OSError as exc:
        print(f"colocate run: cannot write the exit file {path}: {exc.strerror or exc}", file=sys.stderr)


# ---------------------------------------------------------------- what the launcher leaves behind

STATS_PREFIX = "colocate-stats-"  # + the launcher's pid + "-" + random: the folder of one launch's stats files


def remove_stale_stats_dirs(tmp: str | None = None) -> list[str]:
    """Remove this user's stats folders (``STATS_PREFIX``PID-...) whose launcher is gone (killed before it could
    remove its own); returns those removed. Called by every launcher before it makes its own."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    for path in glob.glob(os.path.join(glob.escape(tmp), f"{STATS_PREFIX}*-*")):
        pid = os.path.basename(path)[len(STATS_PREFIX):].split("-", 1)[0]
        try:
            if not pid.isdigit() or os.lstat(path).st_uid != os.getuid() or _pid_exists(int(pid)):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (another user's counts), as ``psutil.pid_exists`` says on POSIX; without
    importing psutil, which every launcher would pay for at its start."""
    if pid <= 0:
        return pid == 0
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: beyond any pid (a folder named by hand)
        return False
    except PermissionError:
        return True
    return True


def restore_autogroup(before: int | None) -> None:
    """Put the session's autogroup nice back to ``before`` (read before the command started): the job's runtime
    lowers its session while it runs opportunistic work and restores it only at its own exit, which a killed job
    never reaches; the launcher, in the same session, outlives it. Needs ``CAP_SYS_NICE`` to raise the weight
    again; a refusal is said in one line."""
    now = autogroup.nice()
    if before is None or now is None or now == before:
        return
    try:
        autogroup.set_nice(before)
    except OSError as exc:
        print(f"colocate run: cannot restore the session's autogroup nice {before} (the job left it at {now}): "
              f"{exc.strerror or exc}", file=sys.stderr)


STOPS = frozenset(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, n))


def _release_for_exit(child: subprocess.Popen) -> None:
    """A job on a simulated GPU is about to be stopped: its processes (this launcher's group, or the child alone)
    leave the GPU's core and its idle class, so they end at once (``colocate.gpus.sim.release_for_exit``)."""
    from colocate.gpus.sim import group_members, release_for_exit

    group = os.getpgrp()
    release_for_exit(group_members(group) if group == os.getpid() else [child.pid])


def _forward_signals(child: subprocess.Popen, sim: bool = False) -> dict:
    interactive = sys.stdin is not None and sys.stdin.isatty()

    def forward(signum, frame):
        # Ctrl-C at a terminal already reached the child (same process group).
        if signum == signal.SIGINT and interactive:
            return
        if sim and signum in STOPS:
            _release_for_exit(child)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {}
    for name in FORWARDED:
        sig = getattr(signal, name, None)
        if sig is not None:
            previous[sig] = signal.signal(sig, forward)
    return previous
