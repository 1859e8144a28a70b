"""The node's worker manager: starts, stops and watches the worker processes of placements.

One small interface, which the scheduler link (``colocate.node.agent``) drives and which another cluster
manager (a Slurm prolog, a Ray worker hook, a Kubernetes node agent) could drive the same way::

    wm = WorkerManager(WorkerConfig(...))   # takes its state folder (one node per folder)
    wm.recover() -> events                  # once: re-adopt the last incarnation's live workers, report the dead
    wm.start(StartPlacement) -> events      # WorkerStarted per worker, or one StartRefused
    wm.stop(placement_id, grace_s)          # SIGTERM each worker's process group; SIGKILL after grace_s
    wm.promote(placement_id) -> job | None  # the placement's job is guaranteed from now on
    wm.poll(now) -> events                  # reap exits (WorkerExited), escalate kills; call often
    wm.status() -> [WorkerStatus]           # every worker of live and recently ended placements
    wm.close()

Events are the protocol's node -> scheduler messages (``WorkerStarted``, ``WorkerExited``,
``StartRefused``) carrying this node's id and epoch. Nothing blocks: ``start`` forks and returns,
``stop`` sends signals and returns, ``poll`` never waits. ``now`` is the wall clock (``time.time()``):
kill deadlines are persisted and survive a restart.

Rules:
  * idempotent per ``placement_id``: a placement the node has seen (running, ended, refused, or stopped
    before it started) never starts a worker again, across restarts too; a repeated start of a refused
    placement gets the same ``StartRefused`` again, a start after its own stop a ``StartRefused``, any
    other repeat gets nothing (``status()`` and ``NodeStatus`` show its workers);
  * each worker runs under the launcher, in its own session (process group), from the request's ``cwd``
    with the request's environment (``COLOCATE_*`` removed) plus torchrun's variables::

      python -m colocate run --node JOB_ENDPOINT --device KIND --gpus G --job-id JOB --priority P
             --exit-file F [--gpu-mem SIZE] [--sim-gpu-mem SIZE] -- COMMAND...

    ``--gpus``: when every worker has one GPU, all the placement's GPUs on this node in local-rank order
    (torchrun's layout: worker LOCAL_RANK=i is on GPU number i, its ``cuda:i``); otherwise its own;
  * stdout and stderr go to ``LOG_DIR/JOB/worker-RANK.log`` (appended; a header line per start);
  * a start is refused, with one reason, for: no workers, a worker without a GPU, a GPU the node does not
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
import time
from dataclasses import dataclass

import psutil

from colocate import protocol as P
from colocate.env import format_gpus
from colocate.launcher import PROJECT_ROOT, LaunchError, check_command
from colocate.node.worker_table import Placement, StateDirError, Worker, WorkerTable

log = logging.getLogger("colocate.node.workers")

UNKNOWN_EXIT = -1
KEEP_ENDED_S = 300.0  # ended placements stay in status() this long, then only their id is remembered

__all__ = ["WorkerConfig", "WorkerManager", "StateDirError", "port_in_use"]


@dataclass(frozen=True)
class WorkerConfig:
    node_id: str
    epoch: int  # this node incarnation's (the same as its NodeHello's)
    job_endpoint: str  # the node's job endpoint: ``colocate run --node``
    device: str  # sim | cuda
    gpus: dict  # node GPU index -> total memory in bytes
    log_dir: str
    state_dir: str
    python: str = sys.executable
    keep_ended_s: float = KEEP_ENDED_S


class WorkerManager:
    def __init__(self, cfg: WorkerConfig, clock=time.time):
        self.cfg = cfg
        self.clock = clock
        self.table = WorkerTable(cfg.state_dir)
        self.table.lock()
        self.table.load()
        self._procs: dict[tuple[str, int], subprocess.Popen] = {}  # our own children, by (placement, rank)

    # ------------------------------------------------------------------ interface
    def recover(self) -> list:
        """Re-adopt the workers of the table that still run (same pid and create time) and report the
        ones that died while no node watched. Call once, before anything else."""
        out = []
        for p in self.table.placements.values():
            for w in p.workers:
                if w.running and not _same_process(w.pid, w.create_time):
                    out += self._exited(p, w, self._adopted_code(w))
                elif w.running:
                    log.info("re-adopted worker %s rank %d (pid %d) of placement %s", p.job_id, w.rank, w.pid,
                             p.placement_id)
        self.table.save()
        return out

    def start(self, msg: P.StartPlacement) -> list:
        t = self.table
        if msg.placement_id in t.refused:
            return [self._refusal(msg, t.refused[msg.placement_id][1])]
        if msg.placement_id in t.stopped_unknown:
            return [self._refusal(msg, "the placement was stopped before it started")]
        if t.known(msg.placement_id):
            log.info("placement %s is known: nothing started again", msg.placement_id)
            return []
        reason = self._check(msg)
        if reason is None:
            try:
                return self._launch(msg)
            except OSError as exc:
                reason = f"cannot start the launcher: {exc.strerror or exc}"
        t.remember(t.refused, msg.placement_id, [msg.job_id, reason])
        t.save()
        log.warning("refused placement %s of job %s: %s", msg.placement_id, msg.job_id, reason)
        return [self._refusal(msg, reason)]

    def stop(self, placement_id: str, grace_s: float, job_id: str = "") -> None:
        """SIGTERM to each running worker's process group now; ``poll`` sends SIGKILL once ``grace_s`` has
        passed. Idempotent: a repeat only brings the deadline forward. An unknown placement is remembered
        as stopped, so a start that arrives after its stop (reordered) starts nothing."""
        t = self.table
        p = t.placements.get(placement_id)
        if p is None:
            if not t.known(placement_id):
                t.remember(t.stopped_unknown, placement_id, job_id)
                t.save()
            return
        now = self.clock()
        p.stopping = True
        for w in p.workers:
            if not w.running:
                continue
            deadline = now + max(0.0, grace_s)
            if w.kill_at is None:
                log.info("stopping %s rank %d (pid %d): SIGTERM, SIGKILL in %.1f s", p.job_id, w.rank, w.pid, grace_s)
                self._signal(w, signal.SIGTERM)
                w.kill_at = deadline
            else:
                w.kill_at = min(w.kill_at, deadline)
        t.save()

    def promote(self, placement_id: str) -> str | None:
        """Mark the placement's job guaranteed; returns the job id (None: an unknown or ended placement)."""
        p = self.table.placements.get(placement_id)
        if p is None or not p.running:
            return None
        if not p.promoted:
            p.promoted, p.priority = True, "guaranteed"
            self.table.save()
        return p.job_id

    def poll(self, now: float | None = None) -> list:
        now = self.clock() if now is None else now
        out, changed = [], False
        for p in list(self.table.placements.values()):
            for w in p.workers:
                if not w.running:
                    continue
                code = self._reap(p, w)
                if code is not None:
                    out += self._exited(p, w, code)
                    changed = True
                elif w.kill_at is not None and now >= w.kill_at and not w.killed:
                    log.warning("%s rank %d (pid %d) outlived its grace period: SIGKILL", p.job_id, w.rank, w.pid)
                    self._signal(w, signal.SIGKILL)
                    w.killed, changed = True, True
        if self.table.retire(now, self.cfg.keep_ended_s) or changed:
            self.table.save()
        return out

    def status(self) -> list:
        return [P.WorkerStatus(job_id=p.job_id, placement_id=p.placement_id, rank=w.rank, pid=w.pid,
                               running=w.running, exit_code=w.exit_code)
                for p in self.table.placements.values() for w in p.workers]

    def placements(self) -> list[Placement]:
        return list(self.table.placements.values())

    def close(self) -> None:
        """Save and let go of the folder; the workers keep running (a restarted node re-adopts them)."""
        self.table.save()
        self.table.unlock()

    # ------------------------------------------------------------------ starting
    def _check(self, msg: P.StartPlacement) -> str | None:
        req, gpus = msg.request, [g for w in msg.workers for g in w.gpus]
        if not msg.placement_id:
            return "the placement has no id"
        if not msg.workers:
            return "no workers for this node"
        for what, values in (("rank", [w.rank for w in msg.workers]), ("local rank", [w.local_rank for w in msg.workers])):
            if len(set(values)) != len(values):
                return f"two workers have the same {what}"
        if any(w.rank >= msg.world_size for w in msg.workers):
            return f"a rank is outside the world size {msg.world_size}"
        if any(not w.gpus for w in msg.workers):
            return "a worker without a GPU: this node runs workers on GPUs only"
        missing = sorted({g for g in gpus if g not in self.cfg.gpus})
        if missing:
            return f"GPU {missing[0]} is not on this node (it has {format_gpus(sorted(self.cfg.gpus)) or 'none'})"
        if len(set(gpus)) != len(gpus):
            return "two workers share a GPU"
        if msg.priority == "guaranteed":
            for p in self.table.placements.values():
                held = {g for w in p.workers if w.running for g in w.gpus} & set(gpus)
                if held and p.priority == "guaranteed":
                    return f"GPU {min(held)} already runs guaranteed job {p.job_id} (placement {p.placement_id})"
        if not os.path.isabs(req.cwd) or not os.path.isdir(req.cwd):
            return f"working directory {req.cwd!r} does not exist on this node"
        try:
            check_command(tuple(req.command), dict(req.env).get("PATH", os.defpath), cwd=req.cwd)
        except LaunchError as exc:
            return str(exc)
        if msg.group_rank == 0 and msg.master_port and port_in_use(msg.master_port):
            return f"master port {msg.master_port} is already bound on this host"
        return None

    def _launch(self, msg: P.StartPlacement) -> list:
        t, req = self.table, msg.request
        p = Placement(placement_id=msg.placement_id, job_id=msg.job_id, priority=msg.priority)
        one_each = all(len(w.gpus) == 1 for w in msg.workers)
        layout = [g for w in sorted(msg.workers, key=lambda w: w.local_rank) for g in w.gpus]
        folder = os.path.join(self.cfg.log_dir, _safe(msg.job_id))
        os.makedirs(folder, exist_ok=True)
        try:
            for w in msg.workers:
                gpus = layout if one_each else list(w.gpus)
                log_path = os.path.join(folder, f"worker-{w.rank}.log")
                exit_file = os.path.join(folder, f"worker-{w.rank}.{_safe(msg.placement_id)}.exit")
                argv = [self.cfg.python, "-m", "colocate", "run", "--node", self.cfg.job_endpoint,
                        "--device", self.cfg.device, "--gpus", format_gpus(gpus), "--job-id", msg.job_id,
                        "--priority", msg.priority, "--exit-file", exit_file]
                if req.gpu_mem:
                    argv += ["--gpu-mem", str(req.gpu_mem)]
                if self.cfg.device == "sim":
                    argv += ["--sim-gpu-mem", str(self.cfg.gpus[w.gpus[0]])]
                argv += ["--", *req.command]
                proc = self._spawn(argv, _worker_env(msg, w), req.cwd, log_path, msg)
                self._procs[(p.placement_id, w.rank)] = proc
                p.workers.append(Worker(rank=w.rank, local_rank=w.local_rank, gpus=list(w.gpus), pid=proc.pid,
                                        create_time=_create_time(proc.pid), log_path=log_path, exit_file=exit_file))
        except OSError:
            for w in p.workers:  # all or nothing: a half-started gang would only hang
                self._signal(w, signal.SIGKILL)
            raise
        t.placements[p.placement_id] = p
        t.save()
        log.info("started placement %s of job %s: %s", p.placement_id, p.job_id,
                 ", ".join(f"rank {w.rank} pid {w.pid} GPU {format_gpus(w.gpus)}" for w in p.workers))
        return [P.WorkerStarted(node_id=self.cfg.node_id, epoch=self.cfg.epoch, job_id=p.job_id,
                                placement_id=p.placement_id, rank=w.rank, pid=w.pid, log_path=w.log_path)
                for w in p.workers]

    def _spawn(self, argv, env, cwd, log_path, msg) -> subprocess.Popen:
        with open(log_path, "ab") as out:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(f"=== {stamp} node {self.cfg.node_id}: placement {msg.placement_id} of job {msg.job_id}: "
                      f"{' '.join(argv)}\n".encode(errors="replace"))
            out.flush()
            return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    def _refusal(self, msg: P.StartPlacement, reason: str) -> P.StartRefused:
        return P.StartRefused(node_id=self.cfg.node_id, epoch=self.cfg.epoch, job_id=msg.job_id,
                              placement_id=msg.placement_id, reason=reason[: P.MAX_TEXT_CHARS])

    # ------------------------------------------------------------------ watching
    def _reap(self, p: Placement, w: Worker) -> int | None:
        """The worker's exit code once it has ended, else None."""
        proc = self._procs.get((p.placement_id, w.rank))
        if proc is not None:
            rc = proc.poll()
            return None if rc is None else (128 - rc if rc < 0 else rc)
        if _same_process(w.pid, w.create_time):
            return None
        return self._adopted_code(w)

    def _adopted_code(self, w: Worker) -> int:
        try:
            with open(w.exit_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return 128 + signal.SIGKILL if w.killed else UNKNOWN_EXIT

    def _exited(self, p: Placement, w: Worker, code: int) -> list:
        w.exit_code, w.kill_at = code, None
        if self._procs.pop((p.placement_id, w.rank), None) is not None:
            try:  # what our child left behind in its process group (a pgid with members is never reused)
                os.killpg(w.pid, signal.SIGKILL)
            except OSError:
                pass
        if not p.running:
            p.ended_at = self.clock()
        log.info("%s rank %d (pid %d) of placement %s exited with %d", p.job_id, w.rank, w.pid, p.placement_id, code)
        return [P.WorkerExited(node_id=self.cfg.node_id, epoch=self.cfg.epoch, job_id=p.job_id,
                               placement_id=p.placement_id, rank=w.rank, exit_code=code)]

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


def _create_time(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def _same_process(pid: int, create_time: float) -> bool:
    """True while ``pid`` runs and is the process created at ``create_time`` (a zombie counts as gone)."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - create_time) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _safe(name: str) -> str:
    """A job or placement id as one path component."""
    out = re.sub(r"[^A-Za-z0-9._=+-]", "_", name).lstrip(".")
    return out[:120] or "_"
