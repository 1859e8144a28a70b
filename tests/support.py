"""Helpers shared by the test modules (fixtures live in ``tests/conftest.py``; no test module imports another).

* processes: ``clean_env``/``child_env``, ``run_py``/``run_py_json`` (code in a fresh interpreter),
  ``colocate_run`` and ``colocate_cli`` (the real command), ``Procs`` (every background process of a
  test, killed by group at the end), ``NodeProc`` (a real ``colocate node``), ``start_job``, ``finish``;
* waiting: ``wait_for`` polls a condition with a deadline; there is no other way to wait in this suite;
* Prometheus: ``metric_samples`` and ``sample`` parse the text format with ``prometheus_client``;
* ZeroMQ: ``dealer``, ``ask`` and ``pack`` speak to a node's sockets frame by frame; ``FakeScheduler`` is a
  scheduler ROUTER a node's agent connects to (the test decides every answer);
* files: ``tiny_script`` writes a small Python script for worker processes.

Anything that installs the simulated allocator or the runtime into a process is process-global and
irreversible, so those tests run their code in a fresh Python subprocess or under the real launcher,
never in the pytest process.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
RESULT_MARK = "@@RESULT@@"
# Generous: the first process on a fresh machine compiles the allocator extension.
SUBPROCESS_TIMEOUT = 300
# Fuzz tests generate examples(N) cases: N x FUZZ_SCALE (0.4 in the suite; FUZZ_SCALE=4 for a deep run,
# e.g. `FUZZ_SCALE=4 python3 -m pytest -q tests -k fuzz`). The counts N are what a deep run of scale 1 does.
FUZZ_SCALE = float(os.environ.get("FUZZ_SCALE") or 0.4)


def examples(n: int) -> int:
    """How many examples a fuzz test of nominal size ``n`` generates in this run (at least 20)."""
    return max(20, round(n * FUZZ_SCALE))


JOB_START_S = 120  # a job registers once torch is imported (longer when the allocator extension is built)


# ---------------------------------------------------------------- environments and one-shot processes


def clean_env(extra: dict | None = None) -> dict:
    """os.environ without any COLOCATE_* variable, one intra-op thread (unless set), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def child_env(extra: dict | None = None) -> dict:
    """os.environ without any COLOCATE_* variable, one intra-op thread, unbuffered output, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLOCATE_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def run_py(code: str, *, env: dict | None = None, cwd=None, timeout: float = SUBPROCESS_TIMEOUT):
    """Run ``code`` with ``python -c`` in a fresh interpreter; returns CompletedProcess."""
    return subprocess.run([PY, "-c", code], cwd=str(cwd or REPO), env=clean_env(env),
                          capture_output=True, text=True, timeout=timeout)


def run_py_json(code: str, **kw) -> dict:
    """Run ``code``; it must exit 0 and print one line ``@@RESULT@@<json>``; returns the object.

    The code may call ``emit(obj)`` (predefined) to print that line.
    """
    prelude = (
        "import json as _json, sys as _sys\n"
        f"def emit(obj):\n    print({RESULT_MARK!r} + _json.dumps(obj), flush=True)\n"
    )
    proc = run_py(prelude + code, **kw)
    assert proc.returncode == 0, f"subprocess failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return result_of(proc.stdout, proc.stderr)


def result_of(stdout: str, stderr: str = "") -> dict:
    """The object of the last ``@@RESULT@@<json>`` line of ``stdout``."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_MARK)]
    assert lines, f"the process printed no result:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    return json.loads(lines[-1][len(RESULT_MARK):])


def colocate_run(args, *, cwd=None, env: dict | None = None, timeout: float = SUBPROCESS_TIMEOUT):
    """``python -m colocate ARGS...`` as a real subprocess (clean environment); returns CompletedProcess."""
    return subprocess.run([PY, "-m", "colocate", *map(str, args)], cwd=str(cwd or REPO), env=clean_env(env),
                          capture_output=True, text=True, timeout=timeout)


def colocate_cli(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m colocate ARGS...`` for the node/ctl/top tests (``child_env``); returns CompletedProcess."""
    return subprocess.run([PY, "-m", "colocate", *map(str, args)], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- waiting


def wait_for(pred, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll ``pred()`` until it returns a truthy value; returns it, or fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- background processes


class Procs:
    """Every process a test starts, each in its own session; ``cleanup`` SIGKILLs the groups still alive."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.all: list[subprocess.Popen] = []

    def start(self, argv, log_name: str, env_extra: dict | None = None, **kw) -> subprocess.Popen:
        log = open(self.tmp / log_name, "ab")
        try:
            proc = subprocess.Popen([str(a) for a in argv], cwd=REPO, env=child_env(env_extra), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, **kw)
        finally:
            log.close()
        proc.log_path = self.tmp / log_name
        self.all.append(proc)
        return proc

    def log_tails(self, lines: int = 60) -> list[tuple[str, str]]:
        """(log file name, its last ``lines`` lines) of each process started, in start order."""
        out = []
        for proc in self.all:
            text = read_log(proc)
            out.append((Path(proc.log_path).name, "\n".join(text.splitlines()[-lines:])))
        return out

    def cleanup(self) -> None:
        for proc in self.all:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for proc in self.all:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def wait_until_scheduler_answers(proc, client, timeout: float = 30.0):
    """Poll ``client.nodes()`` (a ``SchedulerClient``) until the scheduler started as ``proc`` answers;
    fails at once, with its log, if it exited."""
    from colocate.clients import rpc

    def answers():
        assert proc.poll() is None, read_log(proc)[-3000:]
        try:
            return client.nodes()
        except rpc.NoAnswer:
            return None
    return wait_for(answers, timeout, what="the scheduler to answer")


def read_log(proc) -> str:
    try:
        return Path(proc.log_path).read_text(errors="replace")
    except OSError:
        return ""


class NodeProc:
    """A `colocate node --device sim` subprocess on ``ipc://DIR/node.sock``."""

    def __init__(self, procs: Procs, tmp: Path, *extra, metrics: bool = True, record: bool = True,
                 config: dict | None = None):
        self.procs, self.tmp, self.extra = procs, tmp, [str(e) for e in extra]
        self.endpoint = f"ipc://{tmp}/node.sock"
        self.ctl = self.endpoint + ".ctl"
        self.metrics_port = free_port() if metrics else None
        self.record = tmp / "record.jsonl" if record else None
        self.config = None
        if config:
            self.config = tmp / "node-config.json"
            self.config.write_text(json.dumps(config))
        self.proc = None
        self.starts = 0

    def start(self, timeout: float = 30.0) -> NodeProc:
        argv = [PY, "-m", "colocate", "node", "--device", "sim", "--endpoint", self.endpoint, "--log-level", "info"]
        if self.metrics_port is not None:
            argv += ["--metrics-port", self.metrics_port]
        if self.record is not None:
            argv += ["--record", self.record]
        if self.config is not None:
            argv += ["--config", self.config]
        self.starts += 1
        self.proc = self.procs.start(argv + self.extra, f"node-{self.starts}.log")
        wait_for(lambda: self.listing() is not None or self.proc.poll() is not None, timeout, what="the node to answer")
        assert self.proc.poll() is None, f"node exited with {self.proc.returncode}:\n{read_log(self.proc)}"
        return self

    def listing(self, timeout: float = 0.5):
        from colocate.clients import node as C

        try:
            return C.list_jobs(self.ctl, timeout)
        except C.CtlClientError:
            return None

    def jobs(self) -> dict:
        listing = self.listing(timeout=1.0)
        return {} if listing is None else {j.job_id: j for j in listing.jobs}

    def log(self) -> str:
        return "".join(Path(self.tmp / f"node-{i}.log").read_text(errors="replace") for i in range(1, self.starts + 1))

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def records(self) -> list[dict]:
        if self.record is None or not self.record.exists():
            return []
        rows = []
        for line in self.record.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line being written
                pass
        return rows

    def metrics(self) -> str:
        return scrape(self.metrics_port)


def start_job(procs: Procs, node: NodeProc | str, job_id: str, *script, priority: str = "guaranteed",
              run_opts=(), stats: bool = True) -> subprocess.Popen:
    """`colocate run --device sim --node ENDPOINT --job-id ID ... -- python SCRIPT...` in the background."""
    endpoint = node.endpoint if isinstance(node, NodeProc) else node
    argv = [PY, "-m", "colocate", "run", "--device", "sim", "--node", endpoint, "--job-id", job_id,
            "--priority", priority, "--log", "info", *run_opts]
    stats_path = procs.tmp / f"{job_id}.stats.json"
    if stats:
        argv += ["--stats-file", stats_path]
    proc = procs.start(argv + ["--", PY, *script], f"{job_id}.log")
    proc.stats_path = stats_path
    proc.job_id = job_id
    return proc


def cnn(*args) -> list[str]:
    """``examples/train_cnn.py`` without progress lines, plus ``args``."""
    return [str(REPO / "examples" / "train_cnn.py"), "--log-every", "0", *map(str, args)]


def finish(proc, timeout: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{getattr(proc, 'job_id', proc.args)} did not finish in {timeout}s:\n"
                             f"{read_log(proc)[-3000:]}") from None


def stats_of(proc) -> dict:
    return json.loads(Path(proc.stats_path).read_text())


def half_share_run(run_once, attempts: int = 3):
    """A job under ``--sm-share 0.5`` on the simulated GPU (``run_once() -> (proc, stats)``): run until its core
    was its own, at most ``attempts`` times, and return ``(proc, stats, info)`` of that run.

    The simulated GPU is a real CPU core, which the suite's other tests may take: a job that got less than 0.8
    of its core's time outside the throttle's idling, and so stayed under 0.45 busy, could not reach its share
    at all, and that says nothing about colocate. Such a run is done again; after ``attempts`` of them the
    test skips with the last one's figures. Whatever the core did, no run may go above its share (0.55)."""
    import pytest

    for _ in range(attempts):
        proc, s = run_once()
        info = {k: s[k] for k in ("busy_fraction", "wall_s", "device_busy_s", "throttle_idle_s", "iterations")}
        assert s["busy_fraction"] <= 0.55, info  # the throttle never lets the job above its share
        got = s["device_busy_s"] / max(1e-9, s["wall_s"] - s["throttle_idle_s"] - s["paused_s"])
        if not (s["busy_fraction"] < 0.45 and got < 0.8):  # alone, a job is on its core ~0.98 of that time
            return proc, s, info
    pytest.skip(f"the simulated GPU's core was contended by other processes in {attempts} runs (the last job got "
                f"{got:.2f} of it): {info}")


# a job that appends a time stamp to file argv[2] every 50 ms and writes its pid to argv[2] + ".pid";
# argv[1] "ignore": it ignores SIGTERM (only SIGKILL stops it)
TICKER = """\
import os, signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[2] + ".pid", "w").write(str(os.getpid()))
while True:
    with open(sys.argv[2], "a") as f:
        f.write(f"{time.time()}\\n")
    time.sleep(0.05)
"""


def dists_with_requirements(names) -> list:
    """The installed distributions ``names`` and, transitively, what they require (extras left out)."""
    seen: dict = {}
    todo = list(names)
    while todo:
        name = re.split(r"[\s;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if not name or name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # a requirement for another Python version
            continue
        seen[name] = dist
        todo += [r for r in (dist.requires or []) if "extra ==" not in r]
    return list(seen.values())


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its parent counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------- Prometheus


def scrape(port: int) -> str:
    """GET http://127.0.0.1:PORT/metrics; the text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        return resp.read().decode()


def metric_samples(text: str) -> dict:
    """{(name, frozenset(labels.items())): value} from Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def sample(samples: dict, name: str, **labels):
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0]


# ---------------------------------------------------------------- raw ZeroMQ frames


def dealer(ctx, endpoint: str):
    """A DEALER socket connected to ``endpoint`` (no linger)."""
    import zmq

    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def ask(sock, data, timeout_s: float = 5.0):
    """Send one frame (bytes or a protocol message; a list sends several) and return the decoded reply."""
    from colocate import protocol as P

    if isinstance(data, list):
        sock.send_multipart(data)
    else:
        sock.send(data if isinstance(data, bytes) else P.encode(data))
    return receive(sock, timeout_s)


def receive(sock, timeout_s: float = 5.0):
    """The next message on ``sock``, decoded; fails when none comes within ``timeout_s``."""
    from colocate import protocol as P

    assert sock.poll(int(timeout_s * 1000)), f"no message within {timeout_s}s"
    return P.decode(sock.recv())


def pack(obj) -> bytes:
    import msgpack

    return msgpack.packb(obj, use_bin_type=True)


# ---------------------------------------------------------------- in-process clock, node server and sockets


class FakeClock:
    """A clock that moves only when a test says so (``advance``); it counts its reads, so a test can wait
    until another thread has looked at it again (``wait_reads``) instead of sleeping."""

    def __init__(self, t: float = 1000.0):
        import threading

        self.t = t
        self.reads = 0
        self._cond = threading.Condition()

    def __call__(self) -> float:
        with self._cond:
            self.reads += 1
            self._cond.notify_all()
            return self.t

    def advance(self, dt: float) -> float:
        with self._cond:
            self.t += dt
            return self.t

    def wait_reads(self, n: int, timeout: float = 5.0) -> None:
        """Wait until the clock has been read ``n`` more times (by any thread)."""
        with self._cond:
            target = self.reads + n
            assert self._cond.wait_for(lambda: self.reads >= target, timeout), \
                f"the clock was read {self.reads - target + n} of {n} times in {timeout}s"


class Conn:
    """A DEALER connection to a node endpoint. ``ask`` sends and returns the reply; ``SetLimits`` the node
    pushes on its own are kept apart in ``limits`` (a job's socket gets them at any time)."""

    def __init__(self, ctx, endpoint: str):
        self.sock = dealer(ctx, endpoint)
        self.limits: list = []

    def send(self, data) -> None:
        from colocate import protocol as P

        if isinstance(data, list):
            self.sock.send_multipart(data)
        else:
            self.sock.send(data if isinstance(data, bytes) else P.encode(data))

    def next(self, timeout_s: float = 5.0):
        """The next message that is not a pushed ``SetLimits``."""
        from colocate import protocol as P

        deadline = time.monotonic() + timeout_s
        while True:
            msg = receive(self.sock, max(0.0, deadline - time.monotonic()))
            if not isinstance(msg, P.SetLimits):
                return msg
            self.limits.append(msg)

    def ask(self, data, timeout_s: float = 5.0):
        self.send(data)
        return self.next(timeout_s)

    def wait_limits(self, pred, timeout_s: float = 5.0):
        """The first pushed ``SetLimits`` (kept or arriving) for which ``pred`` holds."""
        deadline = time.monotonic() + timeout_s
        while True:
            for m in self.limits:
                if pred(m):
                    return m
            self.limits.append(receive(self.sock, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        self.sock.close(0)


class ServerHarness:
    """A real ``NodeServer`` (real ROUTER sockets on ``ipc://DIR/node.sock`` and ``.ctl``) serving in a thread,
    on a ``FakeClock``: nothing time-driven happens (ticks, silence) until the test advances the clock. Its
    core and counters are read under the server's lock (``state``)."""

    def __init__(self, tmp: Path, policy: str = "static", mem: int = 16 << 30, node_epoch: int = 42, **cfg):
        import threading

        import zmq

        from colocate.gpus import GpuSpec
        from colocate.node.config import NodeConfig
        from colocate.node.core import NodeCore
        from colocate.node.server import NodeServer

        self.clock = FakeClock()
        self.core = NodeCore([GpuSpec(index=0, kind="sim", mem_total=mem)], NodeConfig(policy=policy, **cfg),
                             node_epoch=node_epoch)
        self.endpoint = f"ipc://{tmp}/node.sock"
        self.record_path = tmp / "record.jsonl"
        self.ticks = 0
        self._tick_cond = threading.Condition()
        harness = self

        class TickCountingServer(NodeServer):  # the real server; the test only learns when a tick has run
            def _tick(self):
                super()._tick()
                with harness._tick_cond:
                    harness.ticks += 1
                    harness._tick_cond.notify_all()

        self.server = TickCountingServer(self.core, self.endpoint, record_path=str(self.record_path),
                                         clock=self.clock)
        self.ctx = zmq.Context()
        self._conns: list[Conn] = []
        self._thread = threading.Thread(target=self.server.serve_forever, name="node-server", daemon=True)
        self._thread.start()
        with self._tick_cond:  # the loop's first tick runs at once; later ones only when the clock moves
            assert self._tick_cond.wait_for(lambda: self.ticks >= 1, 10), "the server never started"

    def connect(self, ctl: bool = False) -> Conn:
        conn = Conn(self.ctx, self.server.ctl_endpoint if ctl else self.endpoint)
        self._conns.append(conn)
        return conn

    def state(self, fn):
        with self.server.lock:
            return fn(self.core)

    def tick(self, dt: float | None = None, timeout: float = 5.0) -> None:
        """Advance the clock by ``dt`` (default: past the next tick) and wait until the server has ticked."""
        from colocate.node.server import TICK_S

        with self._tick_cond:
            seen = self.ticks
            self.clock.advance(TICK_S * 1.5 if dt is None else max(dt, TICK_S * 1.5))
            assert self._tick_cond.wait_for(lambda: self.ticks > seen, timeout), "the server did not tick"

    def close(self) -> None:
        self.server.stop()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the server did not stop"
        for conn in self._conns:
            conn.close()
        self.ctx.destroy(linger=0)


# ---------------------------------------------------------------- a fake scheduler for node tests


class FakeScheduler:
    """A ROUTER on ``tcp://127.0.0.1:PORT`` playing the scheduler: it records every message a node sends
    (``log``: (identity, message), undecodable frames as their ProtocolError) and answers only what the test
    tells it to, except heartbeats: ``expect`` echoes them while it waits (``echo=False`` to stay silent).

    ``background=True`` gives the socket to a thread that receives all the time and echoes every heartbeat at
    once (while ``echoing`` is set), so a real node stays connected while the test waits on something else;
    ``recv``/``expect``/``send`` then go through queues. Without it the test's own thread does everything
    (for an agent the test pumps itself). ``keys_dir`` makes it a CURVE server with that folder's keys."""

    def __init__(self, ctx=None, port: int | None = None, background: bool = False, keys_dir: str | None = None):
        import queue
        import threading

        import zmq

        self.ctx = ctx or zmq.Context.instance()
        self.port = port or free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if keys_dir is not None:  # a CURVE server (the context needs an authenticator: keys.start_authenticator)
            from colocate.base import keys

            keys.serve(self.sock, keys_dir)
        self.sock.bind(self.endpoint)
        self.log: list = []
        self.epoch = 1
        self.echoing = threading.Event()
        self.echoing.set()
        self._inbox, self._outbox = queue.Queue(), queue.Queue()
        self._stop = threading.Event()
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._serve, name="fake-scheduler", daemon=True)
            self._thread.start()

    def _take(self):
        from colocate import protocol as P

        frames = self.sock.recv_multipart()
        ident, data = frames[0], b"".join(frames[1:2])
        try:
            msg = P.decode(data)
        except P.ProtocolError as exc:
            msg = exc
        self.log.append((ident, msg))
        return ident, msg

    def _serve(self) -> None:
        import queue

        from colocate import protocol as P

        while not self._stop.is_set():
            while True:
                try:
                    self.sock.send_multipart(self._outbox.get_nowait())
                except queue.Empty:
                    break
            if self.sock.poll(10):
                ident, msg = self._take()
                if isinstance(msg, P.NodeHeartbeat) and self.echoing.is_set():
                    self.sock.send_multipart([ident, P.encode(P.NodeHeartbeat(node_id=msg.node_id, epoch=self.epoch))])
                self._inbox.put((ident, msg))

    def recv(self, timeout_s: float):
        """The next (identity, message) within ``timeout_s``, else None."""
        import queue

        if self._thread is not None:
            try:
                return self._inbox.get(timeout=max(0.001, timeout_s))
            except queue.Empty:
                return None
        if not self.sock.poll(max(1, int(timeout_s * 1000))):
            return None
        return self._take()

    def expect(self, cls, timeout_s: float = 10.0, pred=None, echo: bool = True, between=None):
        """Receive until a message of type ``cls`` (and ``pred(msg)``) arrives; returns (identity, message).
        Heartbeats are echoed while waiting unless ``echo`` is False (the background thread echoes on its
        own); ``between()`` runs after each poll (e.g. to pump an agent driven by the test). Fails after
        ``timeout_s``."""
        from colocate import protocol as P

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if between is not None:
                between()
            got = self.recv(0.02 if between is not None else min(0.2, max(0.001, deadline - time.monotonic())))
            if got is None:
                continue
            ident, msg = got
            if (echo and self._thread is None and isinstance(msg, P.NodeHeartbeat)
                    and cls is not P.NodeHeartbeat):
                self.send(ident, P.NodeHeartbeat(node_id=msg.node_id, epoch=self.epoch))
            if isinstance(msg, cls) and (pred is None or pred(msg)):
                return ident, msg
        raise AssertionError(f"no {cls.__name__} within {timeout_s}s; got "
                             f"{[type(m).__name__ for _, m in self.log[-12:]]}")

    def send(self, ident: bytes, msg) -> None:
        from colocate import protocol as P

        frames = [ident, msg if isinstance(msg, bytes) else P.encode(msg)]
        if self._thread is not None:
            self._outbox.put(frames)
        else:
            self.sock.send_multipart(frames)

    def welcome(self, ident: bytes, node_id: str, heartbeat_s: float = 0.2, liveness: int = 3) -> None:
        from colocate import protocol as P

        self.send(ident, P.NodeWelcome(node_id=node_id, scheduler_epoch=self.epoch, heartbeat_s=heartbeat_s,
                                       liveness=liveness))

    def of(self, cls) -> list:
        """Every recorded message of type ``cls``."""
        return [m for _, m in list(self.log) if isinstance(m, cls)]

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(5)
        self.sock.close(0)


def tiny_script(folder: Path, name: str, body: str) -> Path:
    """Write ``body`` as ``folder/name`` (a Python script a worker runs); returns its path."""
    path = Path(folder) / name
    path.write_text(body)
    return path
