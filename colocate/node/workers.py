"""The node's worker manager: the placement edge of the node's one pure core (``colocate.node.core.NodeCore``; its
placement rules are ``colocate.node.placements``) that starts, stops and watches the worker processes of placements.

One small interface, which the scheduler link (``colocate.node.agent``) drives and which another cluster
manager (a Slurm prolog, a Ray worker hook, a Kubernetes node agent) could drive the same way::

    wm = WorkerManager(WorkerConfig(...))   # takes its state folder (one node per folder)
    wm.recover() -> events                  # once: re-adopt the last incarnation's live workers, report the dead
    wm.start(StartPlacement) -> events      # WorkerStarted per worker, or one StartRefused
    wm.stop(placement_id, grace_s)          # SIGTERM each worker's process group; SIGKILL after grace_s
    wm.promote(placement_id) -> job | None  # the placement's job is guaranteed from now on
    wm.welcomed(cluster_id) -> events       # a scheduler welcomed the node: other clusters' workers are stopped
    wm.fence(lapsed) -> events              # the node's lease lapsed / is held again
    wm.poll(wall) -> events                 # reap exits (WorkerExited), escalate kills; call often
    wm.status() -> [WorkerStatus]           # every worker of live and recently ended placements
    wm.close()

Events are the protocol's node -> scheduler messages (``WorkerStarted``, ``WorkerExited``,
``StartRefused``) carrying this node's id and epoch. Nothing blocks: ``start`` forks and returns,
``stop`` sends signals and returns, ``poll`` never waits. Kill deadlines are on the wall clock (``wall``,
``time.time()``): they are persisted and survive a restart; the core's ``now`` is ``clock`` (the node's monotonic
clock, the job edge's too). The core is shared with the job edge (``colocate.node.server``): every call into it
holds ``lock``, and the limits a promotion changes are sent by ``jobs`` (the server), when there is one.

Rules (the core's; ``cluster_id`` arguments default to "" for a scheduler that names no cluster):
  * idempotent per ``(cluster_id, placement_id)``: a placement the node has seen (running, ended, refused, or stopped
    before it started) never starts a worker again, across restarts too; a repeated start of a refused
    placement gets the same ``StartRefused`` again, a start after its own stop a ``StartRefused``, any
    other repeat gets nothing (``status()`` and ``NodeStatus`` show its workers);
  * each worker runs under the launcher, in its own session (process group), as the job's Unix account
    (``accounts``: ``colocate.node.accounts``; a user without one refuses the start in one line; its log is
    the account's, 0600), from the request's ``cwd`` with the request's environment (``COLOCATE_*``
    removed; the account's ``HOME``/``USER``/``LOGNAME``) plus torchrun's variables::

      python -m colocate run --node JOB_ENDPOINT --device KIND --gpus G --job-id JOB --priority P
             --exit-file F [--lease-file L] [--gpu-mem SIZE] [--sim-gpu-mem SIZE] [--iterations N] [--epochs E]
             -- COMMAND...

    ``--gpus``: when every worker has one GPU, all the placement's GPUs on this node in local-rank order
    (torchrun's layout: worker LOCAL_RANK=i is on GPU number i, its ``cuda:i``); otherwise its own;
  * stdout and stderr go to ``LOG_DIR/CLUSTER/JOB/worker-RANK.PLACEMENT.log`` (a header line first), and the
    launcher's exit code to ``LOG_DIR/CLUSTER/JOB/worker-RANK.PLACEMENT.exit`` (``worker_files``): scoped by the
    placement's identity, ``(cluster_id, placement_id)``, since job ids restart at 1 with a new scheduler state
    file. So no job of another cluster (a new state file's job 1 on the same node) and no other placement reads,
    appends to or trips over a worker's files, and a re-adopted worker never takes another cluster's exit file for
    its own. ``CLUSTER`` is the cluster id (``unnamed`` for a scheduler that names none), the node's own folder;
    ``JOB`` is the job's account's (``accounts``). The files are flat in ``JOB`` (no placement folder): the
    account owns ``JOB``, and a folder of its own inside could be swapped for a link between the node's checks
    and its open, while a file there is opened with ``O_NOFOLLOW``. The worker table keeps each worker's paths,
    so a worker re-adopted after a restart (one started before this layout too) finds its files where they are;
  * a start is refused, with one reason and a code (``StartRefused.code``: ``stale`` when only placements
    this node is stopping hold the GPUs, else ``refused``), for: no workers, a worker without a GPU, a GPU the node does not
    have or that two workers share, a GPU that already runs another placement's guaranteed worker (for a
    guaranteed placement), a ``cwd`` that is not an existing absolute folder, a command or Python script
    that cannot be found, or (on the node of group rank 0) a master port already bound on this host;
  * exit codes are the launcher's (the command's own; 128+N when killed by signal N). A re-adopted worker
    is not this process's child: its code comes from the launcher's ``--exit-file``, else 137 if this node
    SIGKILLed it, else -1 (unknown: it died while no node watched and left no exit status).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Protocol, assert_never

import psutil

from colocate import protocol as P
from colocate.base.env import format_gpus
from colocate.base.vocab import DeviceKind
from colocate.launcher import PROJECT_ROOT, LaunchError, check_command
from colocate.node import accounts as A
from colocate.node import events as E
from colocate.node import fencing
from colocate.node.commands import Command, Launch, Note, Reply, Report, Save, Send, Signal
from colocate.node.core import NodeCore
from colocate.node.placements import KEEP_ENDED_S
from colocate.node.worker_table import LocalPlacement, StateDirError, Worker, WorkerTable, scoped

log = logging.getLogger("colocate.node.workers")

UNKNOWN_EXIT = -1

__all__ = ["WorkerConfig", "WorkerManager", "StateDirError", "port_in_use"]


@dataclass(frozen=True)
class WorkerConfig:
    node_id: str
    epoch: int  # this node incarnation's (the same as its NodeHello's)
    job_endpoint: str  # the node's job endpoint: ``colocate run --node``
    device: DeviceKind
    gpus: dict  # node GPU index -> total memory in bytes
    log_dir: str
    state_dir: str
    python: str = sys.executable
    keep_ended_s: float = KEEP_ENDED_S
    cluster_id: str | None = ""  # whose placements are reported before a welcome names one (None: wait for it)
    lease_file: str | None = None  # the node's lease (``colocate.base.lease``): placed workers' launchers watch it


class JobEdge(Protocol):
    """Where a command for a registered worker goes (the node server)."""

    def send_to_job(self, cmd: Send) -> None: ...


class WorkerManager:
    """The placement edge of ``NodeCore``: every decision is the core's; this class runs processes, sends
    signals, reaps exits and saves the table as the core's commands say."""

    def __init__(self, cfg: WorkerConfig, clock=time.monotonic, wall=time.time, core: NodeCore | None = None,
                 lock: threading.Lock | None = None):
        """``core``: the node's core (default: one of its own, for a manager without a job edge); ``lock``: held
        around every call into it (the node server's)."""
        self.cfg = cfg
        self.clock, self.wall = clock, wall
        self.table = WorkerTable(cfg.state_dir)
        self.table.lock()
        self.table.load()
        if core is None:
            from colocate.gpus import GpuSpec
            from colocate.node.config import NodeConfig

            core = NodeCore([GpuSpec(index=i, kind=cfg.device, mem_total=m) for i, m in sorted(cfg.gpus.items())],
                            NodeConfig(), node_epoch=cfg.epoch)
        core.take_placements(cfg.node_id, self.table, cfg.keep_ended_s, cfg.cluster_id)
        self.core = core
        self.lock = lock or threading.Lock()
        self.jobs: JobEdge | None = None  # the node server, which sends the limits a promotion changes
        self._procs: dict[tuple[str, int], subprocess.Popen] = {}  # our own children, by (placement key, rank)
        self.accounts: A.Accounts | None = None  # who runs a job's workers (``colocate.node.accounts``); None: us

    # ------------------------------------------------------------------ interface
    def recover(self) -> list:
        """Re-adopt the workers of the table that still run (same pid and create time), kill the orphans of
        this state folder that the table does not hold (``colocate.node.fencing``: found from the processes'
        markers; waits until they are gone) and report the workers that died while no node watched. Call once,
        before anything else."""
        out = []
        held = {(key, w.epoch) for key, p in self.table.placements.items() for w in p.workers
                if w.running and _same_process(w.pid, w.create_time)}
        fencing.kill_orphans(self.cfg.state_dir, held)  # found from the processes, not only from the table
        for key, p in list(self.table.placements.items()):
            for w in p.workers:
                if w.running and not _same_process(w.pid, w.create_time):
                    out += self._do(E.Exited(key, w.rank, self._adopted_code(w), wall=self.wall()))
                elif w.running:
                    log.info("re-adopted worker %s rank %d (pid %d) of placement %s", p.job_id, w.rank, w.pid,
                             p.placement_id)
        self.table.save()
        return out + self._do(E.Recovered())

    def start(self, msg: P.StartPlacement) -> list:
        return self._do(E.Start(msg))

    def stop(self, placement_id: str, grace_s: float, job_id: str = "", cluster_id: str = "") -> list:
        """SIGTERM to each running worker's process group now; ``poll`` sends SIGKILL once ``grace_s`` has
        passed. Idempotent: a repeat only brings the deadline forward. An unknown placement is remembered
        as stopped, so a start that arrives after its stop (reordered) starts nothing."""
        return self._do(E.Stop(placement_id, job_id, grace_s, cluster_id, wall=self.wall()))

    def promote(self, placement_id: str, cluster_id: str = "") -> str | None:
        """Mark the placement's job guaranteed; returns the job id (None: an unknown or ended placement)."""
        self._do(E.Promoted(placement_id, cluster_id))
        p = self.table.placements.get(scoped(cluster_id, placement_id))
        return p.job_id if p is not None and p.promoted and p.running else None

    def settled(self, placement_ids: tuple[str, ...], cluster_id: str = "") -> bool:
        """The scheduler of ``cluster_id`` journaled the end of these placements: those that ended here are
        forgotten now (their ids kept). True if any was."""
        before = len(self.table.placements)
        self._do(E.Settled(tuple(placement_ids), cluster_id))
        return len(self.table.placements) < before

    def welcomed(self, cluster_id: str) -> list:
        """The scheduler of ``cluster_id`` welcomed the node: the events held for it; other clusters' workers
        are stopped."""
        from colocate.base.endpoints import FENCE_GRACE_S

        return self._do(E.Welcomed(cluster_id, grace_s=FENCE_GRACE_S, wall=self.wall()))

    def fence(self, lapsed: bool) -> list:
        """The node's lease has lapsed (True) or is held (False)."""
        return self._do(E.Fence(lapsed))

    def poll(self, wall: float | None = None) -> list:
        """Reap exits and send the kill signals due at ``wall`` (default: now on the wall clock)."""
        wall = self.wall() if wall is None else wall
        out: list = []
        save = False  # one save for every exit of this poll, before any of their messages is sent
        for key, p in list(self.table.placements.items()):
            for w in p.workers:
                if w.running:
                    code = self._reap(key, w)
                    if code is not None:
                        sub, s = self._handle(E.Exited(key, w.rank, code, wall=wall))
                        out += sub
                        save |= s
        sub, s = self._handle(E.WallTick(wall))
        if save or s:
            self.table.save()
        return out + sub

    def status(self) -> list:
        return self.core.status()

    def left_with_progress(self) -> bool:
        """Whether a worker left (said goodbye, or was lost) with progress the scheduler has not been sent."""
        with self.lock:
            return bool(self.core.final)

    def progress(self, told: dict[str, int]) -> list:
        """The registered workers' progress for the scheduler (``NodeCore.progress``; ``told`` updated)."""
        with self.lock:
            return self.core.progress(self.clock(), told)

    def epochs(self) -> set[int]:
        """The node incarnations whose workers this node holds (its own included): what its lease covers."""
        return {self.cfg.epoch} | {w.epoch for p in self.table.placements.values() for w in p.workers if w.running}

    def launchers(self, job_id: str) -> list[int]:
        """Pids of the live launchers this node started for job ``job_id`` (none: not one of its placements)."""
        return [w.pid for p in self.table.placements.values() if p.job_id == job_id and p.running
                for w in p.workers if w.running and _same_process(w.pid, w.create_time)]

    def log_of(self, job_id: str, rank: int, cluster_id: str = "") -> str | None:
        """The log of worker ``rank`` of the newest placement of job ``job_id`` of cluster ``cluster_id`` that the
        table holds (running or recently ended; one started before the current layout too), else None."""
        with self.lock:
            for p in reversed(list(self.table.placements.values())):
                if p.cluster == cluster_id and p.job_id == job_id:
                    for w in p.workers:
                        if w.rank == rank and w.log_path:
                            return w.log_path
        return None

    def placements(self) -> list[LocalPlacement]:
        return list(self.table.placements.values())

    def close(self) -> None:
        """Save and let go of the folder; the workers keep running (a restarted node re-adopts them)."""
        self.table.save()
        self.table.unlock()

    # ------------------------------------------------------------------ carrying out the core's commands
    def _do(self, event: object) -> list:
        """Hand ``event`` to the core and carry out its commands; the messages for the scheduler, which the
        caller sends only after this returns: the table is saved (once, whatever the event led to: a start and
        the launch it caused) before any of them can reach the scheduler."""
        out, save = self._handle(event)
        if save:
            self.table.save()
        return out

    def _handle(self, event: object) -> tuple[list, bool]:
        """``event`` to the core and its commands carried out (a launch's outcome handled in turn): the messages
        for the scheduler, and whether the table must be saved before they are sent."""
        with self.lock:
            cmds = self.core.handle(event, self.clock())
        out: list = []
        save = False
        for c in cmds:
            save |= self._carry_out(c, out)
        return out, save

    def _carry_out(self, c: Command, out: list) -> bool:
        """Carry out one command; messages for the scheduler go to ``out``. True: the table must be saved."""
        match c:
            case Report():
                out.append(c.msg)
            case Save():
                return True
            case Signal():
                self._signal_rank(c.key, c.rank, c.sig)
            case Note():
                log.log(logging.WARNING if c.level == "warning" else logging.INFO, "%s", c.text)
            case Launch():
                sub, save = self._handle(self._launch(c.msg, c.key))
                out += sub
                return save
            case Send():
                if self.jobs is not None:
                    self.jobs.send_to_job(c)
            case Reply():  # a placement event has no sender to answer
                log.warning("placement event answered with %s", c.msg)
            case _:
                assert_never(c)
        return False

    def _signal_rank(self, key: str, rank: int, sig: int) -> None:
        p = self.table.placements.get(key)
        w = next((w for w in p.workers if w.rank == rank), None) if p is not None else None
        if w is not None:
            self._signal(w, sig)

    # ------------------------------------------------------------------ starting
    def _local_problem(self, msg: P.StartPlacement) -> str | None:
        """What on this host stops the placement (the checks that need the file system or sockets)."""
        req = msg.request
        if not os.path.isabs(req.cwd) or not os.path.isdir(req.cwd):
            return f"working directory {req.cwd!r} does not exist on this node"
        try:
            check_command(tuple(req.command), dict(req.env).get("PATH", os.defpath), cwd=req.cwd)
        except LaunchError as exc:
            return str(exc)
        if msg.group_rank == 0 and msg.master_port and port_in_use(msg.master_port):
            return f"master port {msg.master_port} is already bound on this host"
        return None

    def _launch(self, msg: P.StartPlacement, key: str) -> E.Launched | E.LaunchFailed:
        """Start every worker of ``msg`` (all or nothing): ``Launched`` or ``LaunchFailed`` for the core."""
        reason = self._local_problem(msg)
        if reason is not None:
            return E.LaunchFailed(msg, reason)
        req = msg.request
        try:
            acct = self.accounts.for_user(req.user) if self.accounts is not None else None
        except A.AccountError as exc:
            return E.LaunchFailed(msg, str(exc))
        closed = A.unreachable(self.cfg.lease_file, acct) if self.cfg.lease_file else None
        if closed:
            return E.LaunchFailed(msg, f"the node's lease file is closed to the job's account: {closed} "
                                        "(give the node a --state-dir others may pass through)")
        one_each = all(len(w.gpus) == 1 for w in msg.workers)
        layout = [g for w in sorted(msg.workers, key=lambda w: w.local_rank) for g in w.gpus]
        folder = job_log_folder(self.cfg.log_dir, msg.cluster_id, msg.job_id)
        workers: list[Worker] = []
        try:
            A.log_root(self.cfg.log_dir)
            A.node_folder(os.path.dirname(folder))
            A.job_folder(folder, acct)
            for w in msg.workers:
                gpus = layout if one_each else list(w.gpus)
                log_path, exit_file = worker_files(folder, w.rank, msg.placement_id)
                _remove_stale(exit_file)
                argv = [self.cfg.python, "-m", "colocate", "run", "--node", self.cfg.job_endpoint,
                        "--device", self.cfg.device, "--gpus", format_gpus(gpus), "--job-id", msg.job_id,
                        "--priority", msg.priority, "--exit-file", exit_file]
                if self.cfg.lease_file:
                    argv += ["--lease-file", self.cfg.lease_file]
                if req.gpu_mem:
                    argv += ["--gpu-mem", str(req.gpu_mem)]
                if req.sm_share is not None:
                    argv += ["--sm-share", repr(req.sm_share)]
                if msg.cap_recommended and req.gpu_mem:  # over a recommended cap: stop, to be restarted larger
                    argv += ["--on-cap", "error"]
                if self.cfg.device == DeviceKind.SIM:
                    argv += ["--sim-gpu-mem", str(self.cfg.gpus[w.gpus[0]])]
                for opt, value in (("--iterations", req.iterations), ("--epochs", req.epochs)):
                    if value is not None:
                        argv += [opt, str(value)]
                argv += ["--", *req.command]
                env = {**_worker_env(msg, w), **fencing.marker_env(self.cfg.state_dir, key, self.cfg.epoch),
                       **(acct.env() if acct is not None else {})}
                proc, created = self._spawn(argv, env, req.cwd, log_path, msg, acct)
                self._procs[(key, w.rank)] = proc
                workers.append(Worker(rank=w.rank, local_rank=w.local_rank, gpus=list(w.gpus), pid=proc.pid,
                                      create_time=created, log_path=log_path, exit_file=exit_file,
                                      epoch=self.cfg.epoch))
        except OSError as exc:
            for w in workers:  # all or nothing: a half-started gang would only hang
                self._signal(w, signal.SIGKILL)
                self._procs.pop((key, w.rank), None)
            return E.LaunchFailed(msg, f"cannot start the launcher: {_os_reason(exc)}")
        return E.Launched(msg, tuple(workers))

    def _spawn(self, argv, env, cwd, log_path, msg, acct=None) -> tuple[subprocess.Popen, float]:
        """The launcher's process and its ``create_time`` (``_create_time``)."""
        with A.open_log(log_path, acct) as out:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(f"=== {stamp} node {self.cfg.node_id}: placement {msg.placement_id} of job {msg.job_id}: "
                      f"{' '.join(argv)}\n".encode(errors="replace"))
            out.flush()
            before = _boot_ticks()
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                    **A.spawn_kwargs(acct))
            return proc, _create_time(proc.pid, before, _boot_ticks())

    # ------------------------------------------------------------------ watching
    def _reap(self, key: str, w: Worker) -> int | None:
        """The worker's exit code once it has ended, else None. What our own child left behind in its
        process group is SIGKILLed (a pgid with members is never reused)."""
        proc = self._procs.get((key, w.rank))
        if proc is not None:
            rc = proc.poll()
            if rc is None:
                return None
            del self._procs[(key, w.rank)]
            try:
                os.killpg(w.pid, signal.SIGKILL)
            except OSError:
                pass
            return 128 - rc if rc < 0 else rc
        if _same_process(w.pid, w.create_time):
            return None
        return self._adopted_code(w)

    def _adopted_code(self, w: Worker) -> int:
        try:
            with open(w.exit_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return 128 + signal.SIGKILL if w.killed else UNKNOWN_EXIT

    def _signal(self, w: Worker, sig: int) -> None:
        """Signal the worker's process group, only if the pid is still that worker (pid and create time)."""
        if not _same_process(w.pid, w.create_time):
            return
        try:
            os.killpg(w.pid, sig)
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                log.warning("cannot signal worker pid %d: %s", w.pid, exc.strerror)


def _worker_env(msg: P.StartPlacement, w: P.WorkerLaunch) -> dict:
    """The request's environment without COLOCATE_* variables, plus torchrun's contract for this worker."""
    env = {k: v for k, v in msg.request.env if not k.startswith("COLOCATE_")}
    env.setdefault("PATH", os.defpath)
    env.setdefault("PYTHONUNBUFFERED", "1")  # the log file gets lines as they are printed
    # ``python -m colocate`` must import the same colocate as this node, installed or not
    env["PYTHONPATH"] = os.pathsep.join([PROJECT_ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(RANK=str(w.rank), LOCAL_RANK=str(w.local_rank), WORLD_SIZE=str(msg.world_size),
               LOCAL_WORLD_SIZE=str(len(msg.workers)), GROUP_RANK=str(msg.group_rank), ROLE_RANK=str(w.rank),
               ROLE_WORLD_SIZE=str(msg.world_size), ROLE_NAME="default", TORCHELASTIC_RUN_ID=msg.job_id,
               MASTER_ADDR=msg.master_addr or "127.0.0.1")
    if msg.master_port:
        env["MASTER_PORT"] = str(msg.master_port)
    return env


def port_in_use(port: int) -> bool:
    """True when a socket on this host listens on TCP ``port`` (any address, IPv4 or IPv6)."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
            s.bind((addr, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
        finally:
            s.close()
    return False


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _boot_ticks() -> int | None:
    """Clock ticks since boot now, the unit the kernel records a process's start in (``/proc/PID/stat``'s
    ``starttime``); None where there is no boot clock (not Linux)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return None if boottime is None else int(time.clock_gettime(boottime) * CLOCK_TICKS)


def _create_time(pid: int, before: int | None = None, after: int | None = None) -> float:
    """``psutil.Process(pid).create_time()`` (seconds since the epoch; 0.0 if it is gone). Given the boot ticks
    read just ``before`` the process was forked and just ``after`` (its start lies between), at most one tick
    apart: the same figure computed as psutil computes it (ticks / CLOCK_TICKS + boot time), at most a tick
    early, well within ``_same_process``'s tolerance, without reading the new process's ``/proc/PID/stat``,
    which waits until the child's exec is done (2-5 ms measured on the start path). Further apart (a slow
    fork): read, as without them."""
    try:
        if before is not None and after is not None and after - before <= 1:
            return before / CLOCK_TICKS + psutil.boot_time()
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return 0.0


def _same_process(pid: int, create_time: float) -> bool:
    """True while ``pid`` runs and is the process created at ``create_time`` (a zombie counts as gone)."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - create_time) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


UNNAMED_CLUSTER = "unnamed"  # the log folder of the placements of a scheduler that names no cluster


def job_log_folder(log_dir: str, cluster_id: str, job_id: str) -> str:
    """``LOG_DIR/CLUSTER/JOB``: the folder of job ``job_id``'s worker files, for placements of ``cluster_id``."""
    return os.path.join(log_dir, _safe(cluster_id) if cluster_id else UNNAMED_CLUSTER, _safe(job_id))


def worker_files(folder: str, rank: int, placement_id: str) -> tuple[str, str]:
    """``(log, exit file)`` of worker ``rank`` of placement ``placement_id`` in its job's ``folder``."""
    stem = os.path.join(folder, f"worker-{int(rank)}.{_safe(placement_id)}")
    return stem + ".log", stem + ".exit"


def _remove_stale(path: str) -> None:
    """Remove a file left at a new worker's exit-file path (never read as the new worker's code). Raises OSError
    (the start then fails) when it is there and cannot be removed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _os_reason(exc: OSError) -> str:
    """One line for ``exc`` that names the file it is about (``strerror`` alone drops it)."""
    if not exc.strerror:
        return str(exc)
    names = [n for n in (exc.filename, exc.filename2) if n is not None]
    return f"{exc.strerror}: {' -> '.join(os.fsdecode(n) if isinstance(n, bytes) else str(n) for n in names)}" \
        if names else exc.strerror


def _safe(name: str) -> str:
    """A job or placement id as one path component."""
    out = re.sub(r"[^A-Za-z0-9._=+-]", "_", name).lstrip(".")
    return out[:120] or "_"
