"""The fault soak's cluster and fault driver (not a benchmark itself; ``fault_soak.py`` and
``tests/integration/test_fault_soak.py`` run it).

Real processes on 127.0.0.1, with CURVE keys made by ``colocate keys generate`` in the run's folder:
one ``colocate scheduler`` (its SQLite state file), ``nodes`` x ``colocate node`` with simulated GPUs
(each its own state dir), and a stream of jobs submitted with ``colocate submit``: 2-worker gangs,
single-GPU guaranteed jobs and opportunistic jobs. Each worker is ``WORKER`` (plain Python, no torch):
one line per step to the shared progress file (``_soak_check.format_line``, one ``os.write`` on an
``O_APPEND`` descriptor, so a kill -9 loses no written line), its step count in a checkpoint file it
resumes from, and a "done" line after the last step.

A driver makes faults at random (``random.Random(seed)``; every one in ``faults.jsonl``): kill -9 of the
scheduler (restarted), kill -9 / SIGSTOP for a while then SIGCONT / SIGTERM of a node (restarted on its
state dir; a node whose workers are writing progress is drawn more often), kill -9 of one worker that
is writing progress, kill -9 of a node whose ``workers.json`` is then removed or corrupted (``CORRUPTIONS``) and
which is restarted within a second, and the deletion of a running node's whole state dir. Then, with no faults, the cluster drains
(bounded), every process this run started is stopped by pid, and ``collect`` reads the progress file
and the journal (read-only) for ``_soak_check.check``.
"""

from __future__ import annotations

import getpass
import heapq
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import _soak_check as SC

PY = sys.executable

WORKER = r'''
import os, sys, time
steps, period, progress, ckdir = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
env = os.environ
job, rank = env["COLOCATE_JOB_ID"], int(env.get("RANK", "0"))
gpus = env.get("COLOCATE_GPUS", "0").split(",")
gpu = gpus[int(env.get("LOCAL_RANK", "0")) % len(gpus)]
node = os.path.basename(env.get("COLOCATE_NODE", "?")).rsplit(".sock", 1)[0] or "?"
prio = env.get("COLOCATE_PRIORITY", "?")
placement = "?"
try:  # the launcher's --exit-file is LOG_DIR/JOB/worker-RANK.PLACEMENT.exit
    argv = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\0")
    name = os.path.basename(argv[argv.index(b"--exit-file") + 1].decode())
    placement = name.split(".", 1)[1].rsplit(".exit", 1)[0]
except (OSError, ValueError, IndexError):
    pass
ck = os.path.join(ckdir, f"{job}-{rank}")
try:
    start = int(open(ck).read())
except (OSError, ValueError):
    start = 0
fd = os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
head = f"{job} {placement} {rank} {node} {gpu} {prio} {os.getpid()}"
for step in range(start, steps):
    os.write(fd, f"step {head} {step} {time.time():.3f}\n".encode())
    tmp = f"{ck}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(step + 1))
    os.replace(tmp, ck)
    time.sleep(period)
os.write(fd, f"done {head} {steps} {time.time():.3f}\n".encode())
'''

POLICY = """\
plugins = ["multi_queue", "gang", "binpack", "opportunistic", "preemption"]
[plugin.multi_queue]
starvation_s = 10.0
"""

FAULTS = ("scheduler kill -9", "node kill -9", "node SIGSTOP", "node SIGTERM", "worker kill -9",
          "node kill -9, table lost", "node kill -9, table corrupt", "state dir deleted")
LOST_TABLE = FAULTS[5:7]  # the node is restarted within ``SoakConfig.table_restart_s`` (issue 22, item 2)
# what a corrupt table holds: the saved one cut in half, a placement stored as a list, not JSON, a wrong type
CORRUPTIONS = ("truncated", "placement as a list", "garbage", "pid as a string")
KINDS = ("gang", "single", "opportunistic")


@dataclass
class SoakConfig:
    faults: int = 200  # faults to make
    every_s: float = 3.0  # mean seconds between faults (uniform in 0.5x..1.5x)
    submit_every_s: float = 1.5  # mean seconds between submissions
    steps: int = 40  # steps per worker
    step_s: float = 0.1  # seconds per step
    stop_s: tuple[float, float] = (1.0, 20.0)  # SIGSTOP length
    restart_s: tuple[float, float] = (0.5, 6.0)  # a node's downtime after kill -9 / SIGTERM
    sched_restart_s: tuple[float, float] = (0.2, 3.0)
    fault_weights: tuple[float, ...] = (1.0, 1.0, 1.5, 1.0, 1.0, 0.75, 0.75, 0.75)  # as FAULTS
    table_restart_s: tuple[float, float] = (0.1, 1.0)  # a node's downtime after kill -9 with its table lost
    kind_weights: tuple[float, ...] = (1.0, 1.0, 1.0)  # as KINDS
    nodes: int = 3
    gpus: int = 2  # simulated GPUs per node
    drain_s: float = 240.0  # most seconds to wait for every job to end after the last fault
    max_submitting: int = 3  # submit processes at once
    seed: int = 0


@dataclass
class Target:
    name: str
    argv: list
    log: Path
    proc: subprocess.Popen | None = None
    state: str = "down"  # up | stopped | down | terminating
    restarts: int = 0


@dataclass
class Outcome:
    report: SC.Report
    faults: dict  # fault kind -> count
    submitted: int
    unacked: int  # submits that were not acknowledged (scheduler away): nothing is promised for them
    bad_lines: int
    run_s: float
    drain_s: float
    drained: bool
    attempts: dict = field(default_factory=dict)  # attempts -> jobs
    reasons: dict = field(default_factory=dict)  # why acknowledged jobs failed (numbers as N) -> jobs


class SoakError(Exception):
    """The soak could not run (a daemon never started): not a verdict on the invariants."""


class Soak:
    def __init__(self, tmp: Path, cfg: SoakConfig, say=print):
        self.tmp, self.cfg, self.say = Path(tmp), cfg, say
        self.rng = random.Random(cfg.seed)
        self.endpoint = f"tcp://127.0.0.1:{_free_port()}"
        self.keys = self.tmp / "keys"
        self.state = self.tmp / "sched.db"
        self.progress = self.tmp / "progress.txt"
        self.ckdir = self.tmp / "ck"
        self.work = self.tmp / "work"
        self.worker = self.tmp / "worker.py"
        self.fault_log = self.tmp / "faults.jsonl"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}
        self.env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        self.sched: Target | None = None
        self.nodes: dict[str, Target] = {}
        self.submitting: list[tuple[subprocess.Popen, str, int]] = []
        self.acked: dict[str, int] = {}
        self.submitted = self.unacked = 0
        self.faults: dict[str, int] = {f: 0 for f in FAULTS}
        self.events: list = []  # heap of (time, seq, action, target name); the action: restart
        self._seq = 0
        self._read_at = 0
        self._recent: dict[int, float] = {}  # pid -> time of its last step line (worker kill candidates)
        self._where: dict[int, str] = {}  # pid -> its node
        self._done_pids: set[int] = set()
        self.t0 = time.monotonic()

    # ------------------------------------------------------------------ processes
    def _spawn(self, t: Target) -> None:
        with open(t.log, "ab") as log:
            t.proc = subprocess.Popen([str(a) for a in t.argv], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                      cwd=self.tmp, start_new_session=True)
        t.state = "up"

    def start(self) -> None:
        for d in (self.ckdir, self.work, self.tmp / "logs"):
            d.mkdir(parents=True, exist_ok=True)
        self.progress.touch()
        self.worker.write_text(WORKER)
        (self.tmp / "policy.toml").write_text(POLICY)
        for args in self._key_commands():
            res = subprocess.run([PY, "-m", "colocate", "keys", "generate", self.keys, *args], env=self.env,
                                 capture_output=True, text=True, timeout=60, check=False)
            if res.returncode != 0:
                raise SoakError(f"colocate keys generate failed: {res.stderr.strip()[-500:]}")
        # the nodes' user map (docs/security.md): the soak's user has no Unix account, its jobs run as this one
        (self.keys / "users").write_text(f"soak {getpass.getuser()}\n")
        self.sched = Target("scheduler", [PY, "-m", "colocate", "scheduler", "--bind", self.endpoint, "--state",
                                          self.state, "--config", self.tmp / "policy.toml", "--keys", self.keys,
                                          "--log-level", "info"], self.tmp / "scheduler.log")
        self._spawn(self.sched)
        for i in range(self.cfg.nodes):
            nid = f"n{i}"
            self.nodes[nid] = Target(nid, [PY, "-m", "colocate", "node", "--device", "sim", "--sim-gpus",
                                           self.cfg.gpus, "--scheduler", self.endpoint, "--node-id", nid, "--host",
                                           "127.0.0.1", "--endpoint", f"ipc://{self.tmp}/{nid}.sock", "--log-dir",
                                           self.tmp / "logs", "--state-dir", self.tmp / nid, "--keys", self.keys,
                                           "--log-level", "info"], self.tmp / f"{nid}.log")
            self._spawn(self.nodes[nid])
        self._wait(lambda: self._nodes_up() == self.cfg.nodes, 90, "every node to join the scheduler")

    def _key_commands(self) -> list[list[str]]:
        """The ``colocate keys generate DIR ...`` arguments for one folder of the scheduler's, the nodes' and a
        client's keys: role-named keys (``--node NAME --user NAME``) where the command has them, else one
        admitted key per peer (``--name NAME``; the nodes and the client then use the ``client`` key)."""
        nodes = [f"n{i}" for i in range(self.cfg.nodes)]
        res = subprocess.run([PY, "-m", "colocate", "keys", "generate", "--help"], env=self.env, capture_output=True,
                             text=True, timeout=60, check=False)
        if "--node" in res.stdout:
            return [[arg for n in nodes for arg in ("--node", n)] + ["--user", "soak"]]
        return [[]] + [["--name", n] for n in nodes]

    def _nodes_up(self) -> int:
        from colocate.clients import rpc
        from colocate.clients.scheduler import SchedulerClient

        if self.sched.proc.poll() is not None:
            raise SoakError(f"the scheduler exited ({self.sched.proc.returncode}): {_tail(self.sched.log)}")
        try:
            return sum(n.up for n in SchedulerClient(self.endpoint, str(self.keys), timeout_s=1.0).nodes().nodes)
        except rpc.RpcError:
            return 0

    def _wait(self, pred, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            value = pred()
            if value:
                return value
            if time.monotonic() > deadline:
                raise SoakError(f"timed out after {timeout:g} s waiting for {what}")
            time.sleep(0.1)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _at(self, delay: float, action: str, name: str) -> None:
        self._seq += 1
        heapq.heappush(self.events, (time.monotonic() + delay, self._seq, action, name))

    def _target(self, name: str) -> Target:
        return self.sched if name == "scheduler" else self.nodes[name]

    def _kill(self, t: Target, sig: int) -> None:
        if t.proc is not None and t.proc.poll() is None:
            os.kill(t.proc.pid, sig)

    def _reap(self, t: Target, timeout: float = 15.0) -> None:
        """Wait for ``t``'s process to end; SIGKILL it (and SIGCONT, in case it is stopped) after ``timeout``."""
        if t.proc is None:
            return
        try:
            t.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill(t, signal.SIGKILL)
            self._kill(t, signal.SIGCONT)
            t.proc.wait(15)

    def _restart(self, t: Target) -> None:
        if t.state == "up":
            return
        if t.state == "stopped":
            self._kill(t, signal.SIGCONT)
            t.state = "up"
            return
        self._reap(t)
        t.restarts += 1
        self._spawn(t)

    # ------------------------------------------------------------------ the workload
    def _submit(self) -> None:
        kind = self.rng.choices(KINDS, weights=self.cfg.kind_weights)[0]
        workers = 2 if kind == "gang" else 1
        prio = "opportunistic" if kind == "opportunistic" else "guaranteed"
        self.submitted += 1
        argv = [PY, "-m", "colocate", "submit", "--name", f"{kind}-{self.submitted}", "--gpus", "1", "--workers",
                workers, "--priority", prio, "--scheduler", self.endpoint, "--keys", self.keys, "--timeout", "5",
                "--", PY, self.worker, self.cfg.steps, self.cfg.step_s, self.progress, self.ckdir]
        proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env, cwd=self.work, start_new_session=True)
        self.submitting.append((proc, kind, workers))

    def _poll_submits(self, block: bool = False) -> None:
        still = []
        for proc, kind, workers in self.submitting:
            if block:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if proc.poll() is None:
                still.append((proc, kind, workers))
                continue
            out, err = proc.communicate()
            words = out.split()
            if proc.returncode == 0 and words:
                self.acked[words[-1]] = workers
            else:
                self.unacked += 1
                self._log_fault("submit not acknowledged", "scheduler",
                                f"rc {proc.returncode}: {(err.strip().splitlines() or [''])[-1][:200]}", count=False)
        self.submitting = still

    def _read_progress(self) -> None:
        """Follow the progress file: the live workers a 'worker kill -9' may pick."""
        with open(self.progress, "rb") as f:
            f.seek(self._read_at)
            data = f.read()
        cut = data.rfind(b"\n") + 1
        self._read_at += cut
        lines, _ = SC.parse(data[:cut].decode(errors="replace"))
        for ln in lines:
            if ln.kind == SC.DONE:
                self._done_pids.add(ln.pid)
                self._recent.pop(ln.pid, None)
            else:
                self._recent[ln.pid] = ln.t
                self._where[ln.pid] = ln.node
        for pid in [p for p, t in self._recent.items() if time.time() - t > 10.0]:
            del self._recent[pid]  # gone (killed, or stopped by its node)
            self._where.pop(pid, None)

    def _is_worker(self, pid: int) -> bool:
        """True while ``pid`` is a process of this run's worker script (never signal a reused pid)."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return str(self.worker).encode() in f.read().split(b"\0")
        except OSError:
            return False

    # ------------------------------------------------------------------ faults
    def _log_fault(self, kind: str, target: str, detail: str, count: bool = True) -> None:
        if count:
            self.faults[kind] += 1
        with open(self.fault_log, "a") as f:
            f.write(json.dumps({"t": round(self.now(), 3), "fault": kind, "target": target, "detail": detail}) + "\n")

    def _fault(self) -> str | None:
        """Make one fault of a kind drawn by weight among those possible now; its description, or None."""
        nodes_up = [n for n in self.nodes.values() if n.state == "up"]
        now = time.time()
        workers = [pid for pid, t in self._recent.items() if now - t < 0.5 and self._is_worker(pid)]
        possible = {"scheduler kill -9": self.sched.state == "up", "node kill -9": bool(nodes_up),
                    "node SIGSTOP": bool(nodes_up), "node SIGTERM": bool(nodes_up), "worker kill -9": bool(workers),
                    **{k: bool(nodes_up) for k in FAULTS[5:]}}
        kinds = [k for k in FAULTS if possible[k]]
        if not kinds:
            return None
        weights = [w for k, w in zip(FAULTS, self.cfg.fault_weights) if possible[k]]
        kind = self.rng.choices(kinds, weights=weights)[0]
        lo, hi = self.cfg.restart_s
        if kind == "scheduler kill -9":
            self._kill(self.sched, signal.SIGKILL)
            self._reap(self.sched)
            self.sched.state = "down"
            delay = self.rng.uniform(*self.cfg.sched_restart_s)
            self._at(delay, "restart", "scheduler")
            target, detail = "scheduler", f"restart in {delay:.1f} s"
        elif kind == "worker kill -9":
            pid = self.rng.choice(sorted(workers))
            os.kill(pid, signal.SIGKILL)
            self._recent.pop(pid, None)
            target, detail = f"pid {pid}", ""
        else:
            busy = [sum(1 for pid in workers if self._where.get(pid) == n.name) for n in nodes_up]
            node = self.rng.choices(nodes_up, weights=[1 + 2 * b for b in busy])[0]  # busy nodes more often
            target = node.name
            if kind in LOST_TABLE:  # kill -9, then the table is lost or corrupt, and the node is back at once
                self._kill(node, signal.SIGKILL)
                self._reap(node)
                node.state = "down"
                damage = self._damage_table(node.name, lost=kind == LOST_TABLE[0])
                delay = self.rng.uniform(*self.cfg.table_restart_s)
                self._at(delay, "restart", node.name)
                detail = f"{damage}, restart in {delay:.1f} s"
            elif kind == "state dir deleted":  # under the running node
                shutil.rmtree(self.tmp / node.name, ignore_errors=True)
                detail = ""
            elif kind == "node SIGSTOP":
                length = self.rng.uniform(*self.cfg.stop_s)
                self._kill(node, signal.SIGSTOP)
                node.state = "stopped"
                self._at(length, "restart", node.name)
                detail = f"SIGCONT in {length:.1f} s"
            else:
                self._kill(node, signal.SIGKILL if kind == "node kill -9" else signal.SIGTERM)
                node.state = "down"
                delay = self.rng.uniform(lo, hi)
                self._at(delay, "restart", node.name)
                detail = f"restart in {delay:.1f} s"
        self._log_fault(kind, target, detail)
        return f"{kind} {target} {detail}".rstrip()

    def _damage_table(self, node: str, lost: bool) -> str:
        """Remove (``lost``) or corrupt the node's ``workers.json``; what was done."""
        table = self.tmp / node / "workers.json"
        if lost:
            table.unlink(missing_ok=True)
            return "table removed"
        how = self.rng.choice(CORRUPTIONS)
        try:
            text = table.read_text(errors="replace")
        except OSError:
            text = ""
        if how == "truncated":
            bad = text[: len(text) // 2]
        elif how == "placement as a list":
            bad = json.dumps({"format": 1, "placements": [["1.1", "1", "guaranteed"]]})
        elif how == "garbage":
            bad = "\x00\xff not a table"
        else:
            bad = re.sub(r'"pid":\s*(\d+)', r'"pid": "\1"', text) if '"pid"' in text else '{"format": "1"}'
        try:
            table.write_text(bad)
        except OSError:  # the folder itself is gone
            return f"table {how} (not written)"
        return f"table {how}"

    # ------------------------------------------------------------------ the run
    def run(self) -> None:
        """Submit and make faults until ``cfg.faults`` faults are made."""
        cfg = self.cfg
        next_fault = time.monotonic() + self.rng.uniform(0.5, 1.5) * cfg.every_s
        next_submit = time.monotonic()
        made = 0
        while made < cfg.faults:
            t = time.monotonic()
            while self.events and self.events[0][0] <= t:
                name = heapq.heappop(self.events)[3]
                self._restart(self._target(name))
            self._poll_submits()
            self._read_progress()
            if t >= next_submit and len(self.submitting) < cfg.max_submitting:
                self._submit()
                next_submit = t + self.rng.uniform(0.5, 1.5) * cfg.submit_every_s
            if t >= next_fault:
                what = self._fault()
                next_fault = t + self.rng.uniform(0.5, 1.5) * cfg.every_s
                if what is not None:
                    made += 1
                    live = sum(1 for t_line in self._recent.values() if time.time() - t_line < 1.0)
                    self.say(f"[{made:4d}/{cfg.faults}] {self.now():7.1f} s  {what:48s} submitted {self.submitted}, "
                             f"acked {len(self.acked)}, workers progressing {live}")
            time.sleep(0.05)

    def drain(self) -> tuple[bool, float]:
        """No more faults: bring every daemon back and wait (at most ``cfg.drain_s``) until every job in
        the journal has ended. Returns (drained, seconds)."""
        t0 = time.monotonic()
        self.events.clear()
        for t in [self.sched, *self.nodes.values()]:
            self._restart(t)
        self._poll_submits(block=True)

        def ended():
            self._read_progress()
            for t in [self.sched, *self.nodes.values()]:
                if t.proc.poll() is not None:  # a daemon that exited on its own is a finding; bring it back
                    self._log_fault("daemon exited", t.name, f"rc {t.proc.returncode}", count=False)
                    self._spawn(t)
            return not self.active()

        try:
            self._wait(ended, self.cfg.drain_s, "every job to end")
            return True, time.monotonic() - t0
        except SoakError:
            return False, time.monotonic() - t0

    def active(self) -> list[str]:
        """Jobs of the journal not yet ended (and acknowledged jobs it does not hold)."""
        rows = self.journal()
        return [j for j, r in rows.items() if r.state not in SC.TERMINAL] + [j for j in self.acked if j not in rows]

    def journal(self) -> dict[str, SC.JobRow]:
        if not self.state.exists():
            return {}
        db = sqlite3.connect(f"file:{self.state}?mode=ro", uri=True, timeout=10)
        try:
            rows = db.execute("SELECT job_id, state, reason, spec, attempt FROM jobs").fetchall()
        except sqlite3.Error:
            return {}
        finally:
            db.close()
        out = {}
        for job, state, reason, spec, attempt in rows:
            s = json.loads(spec)
            out[job] = SC.JobRow(job, state, reason or "", int(s.get("workers", 1)), s.get("priority", "guaranteed"),
                                 int(attempt or 0))
        return out

    def stop(self) -> None:
        """Stop every process this run started, by pid: daemons (SIGCONT first), submits, then every worker
        and launcher still running this run's worker script."""
        import psutil

        for t in [self.sched, *self.nodes.values()]:
            if t is not None and t.proc is not None and t.proc.poll() is None:
                self._kill(t, signal.SIGCONT)
                self._kill(t, signal.SIGTERM)
        for t in [self.sched, *self.nodes.values()]:
            if t is not None:
                self._reap(t, 10)
        for proc, _, _ in self.submitting:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        mine = str(self.worker)
        left = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if mine in (p.info["cmdline"] or []):
                    left.append(p)
            except psutil.Error:
                continue
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=10)

    def outcome(self, run_s: float, drained: bool, drain_s: float) -> Outcome:
        self._poll_submits(block=True)
        lines, bad = SC.parse(self.progress.read_text(errors="replace"))
        rows = self.journal()
        report = SC.check(lines, self.acked, rows)
        attempts: dict[int, int] = {}
        reasons: dict[str, int] = {}
        for job in self.acked:
            if job in rows:
                a = rows[job].attempt
                attempts[a] = attempts.get(a, 0) + 1
                if rows[job].state == "failed":
                    why = re.sub(r"\b[nN]?\d+(\.\d+)*\b", "N", rows[job].reason)[:120]
                    reasons[why] = reasons.get(why, 0) + 1
        return Outcome(report, dict(self.faults), self.submitted, self.unacked, bad, run_s, drain_s, drained,
                       dict(sorted(attempts.items())), dict(sorted(reasons.items(), key=lambda kv: -kv[1])))


def run_soak(tmp: Path, cfg: SoakConfig, say=print) -> Outcome:
    """Start the cluster, run the faults, drain, stop everything, judge."""
    soak = Soak(tmp, cfg, say)
    try:
        soak.start()
        t0 = time.monotonic()
        soak.run()
        run_s = time.monotonic() - t0
        say(f"faults done after {run_s:.0f} s; draining (at most {cfg.drain_s:g} s)")
        drained, drain_s = soak.drain()
        say(f"drained: {drained} after {drain_s:.0f} s; still active: {soak.active()[:10]}")
    finally:
        soak.stop()
    return soak.outcome(run_s, drained, drain_s)


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""




def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
