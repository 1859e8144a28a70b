"""The whole cluster over real processes on loopback: `colocate scheduler`, `colocate node --scheduler`
daemons with simulated GPUs, jobs submitted through the client API. Every worker appends a start mark
(job, rank, pid, wall time) to a shared file before it does anything else, so what started, how often
and when is seen from outside the daemons.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import psutil
import pytest

from colocate.base import keys as K
from colocate.clients import rpc
from colocate.clients.scheduler import SchedulerClient, request_from_here
from tests.support import PY, REPO, Procs, free_port, read_log, wait_for, wait_until_scheduler_answers

EXAMPLES = REPO / "examples"
MARK = """\
import os, sys, time
with open(os.environ["MARKS"], "a") as f:
    f.write(f"{os.environ['COLOCATE_JOB_ID']} {os.environ.get('RANK', '0')} {os.getpid()} {time.time():.3f}\\n")
if sys.argv[1] == "--exec":
    if os.environ.get("MARK_YIELD_VIA"):  # the node strips COLOCATE_* from a request's environment
        os.environ["COLOCATE_YIELD_VIA"] = os.environ["MARK_YIELD_VIA"]
    os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
time.sleep(float(sys.argv[1]))
"""
POLICY = """\
plugins = ["multi_queue", "gang", "binpack", "opportunistic", "preemption"]
[plugin.multi_queue]
starvation_s = {starvation}
"""


class Cluster:
    def __init__(self, procs: Procs, tmp: Path, nodes: int = 3, gpus: int = 2, starvation_s: float = 10.0,
                 keys: Path | None = None):
        self.procs, self.tmp, self.keys = procs, tmp, keys
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.state = tmp / "sched.db"
        self.config = tmp / "policy.toml"
        self.config.write_text(POLICY.format(starvation=starvation_s))
        self.marks = tmp / "marks.txt"
        self.marks.touch()
        self.script = tmp / "mark.py"
        self.script.write_text(MARK)
        self.work = tmp / "work"
        self.work.mkdir()
        self.scheduler = None
        self.start_scheduler()
        self.nodes = {f"n{i}": self.start_node(f"n{i}", gpus) for i in range(nodes)}
        self.client = SchedulerClient(self.endpoint, str(keys) if keys else None, timeout_s=5.0)
        if nodes:
            wait_for(lambda: sum(n.up for n in self.client.nodes().nodes) == nodes, 60, what="every node to join")

    def start_scheduler(self):
        argv = [PY, "-m", "colocate", "scheduler", "--bind", self.endpoint, "--state", self.state, "--config",
                self.config, "--log-level", "info"] + (["--keys", self.keys] if self.keys else [])
        self.scheduler = self.procs.start(argv, "scheduler.log")
        client = SchedulerClient(self.endpoint, str(self.keys) if self.keys else None, timeout_s=0.5)

        wait_until_scheduler_answers(self.scheduler, client)

    def start_node(self, node_id: str, gpus: int, keys: Path | None | bool = True, sim_gpu_mem: str = "",
                   config: dict | None = None):
        """``keys``: True for the cluster's keys (the user's own folder without ``self.keys``), None for no
        CURVE (``--insecure``), or a key folder. ``config``: the node's config fields (``--config``)."""
        keys = (self.keys or "") if keys is True else keys
        argv = [PY, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", gpus, "--scheduler", self.endpoint,
                "--node-id", node_id, "--host", "127.0.0.1", "--endpoint", f"ipc://{self.tmp}/{node_id}.sock",
                "--log-dir", self.tmp / "logs", "--state-dir", self.tmp / node_id, "--log-level", "info"]
        argv += ["--sim-gpu-mem", sim_gpu_mem] if sim_gpu_mem else []
        if config:
            path = self.tmp / f"{node_id}.json"
            path.write_text(json.dumps(config))
            argv += ["--config", path]
        argv += ["--keys", keys] if keys else ["--insecure"] if keys is None else []
        return self.procs.start(argv, f"{node_id}.log")

    def submit(self, command, workers=1, priority="guaranteed", name="", estimate_s=None, gpu_mem=0,
               yield_via: str = "") -> str:
        """``yield_via``: the job's COLOCATE_YIELD_VIA (set by the job's wrapper, MARK)."""
        env = {**os.environ, "MARKS": str(self.marks)} | ({"MARK_YIELD_VIA": yield_via} if yield_via else {})
        req = request_from_here(command, workers=workers, gpus=1, priority=priority, name=name, environ=env,
                                estimate_s=estimate_s, cwd=str(self.work), gpu_mem=gpu_mem)
        return self.client.submit(req)

    def light(self, seconds: float, **kw) -> str:
        return self.submit([PY, str(self.script), f"{seconds:g}"], **kw)

    def example(self, script: str, *args, **kw) -> str:
        return self.submit([PY, str(self.script), "--exec", str(EXAMPLES / script), *map(str, args)], **kw)

    def jobs(self) -> dict:
        return {j.job_id: j for j in self.client.jobs()[0]}

    def starts(self) -> list[tuple[str, int, int, float]]:
        rows = [line.split() for line in self.marks.read_text().splitlines() if line.strip()]
        return [(j, int(r), int(p), float(t)) for j, r, p, t in rows]

    def db(self):
        return sqlite3.connect(f"file:{self.state}?mode=ro", uri=True)

    def logs(self) -> str:
        return "\n".join(f"==> {p.log_path.name}\n{read_log(p)[-4000:]}" for p in self.procs.all
                         if p.log_path.name.endswith(".log") and not p.log_path.name.startswith("job"))


class GuaranteedWatch:
    """Samples the scheduler's per-GPU view while a test runs: no GPU may ever hold two guaranteed jobs."""

    def __init__(self, cluster: Cluster, period: float = 0.25):
        self.cluster, self.period = cluster, period
        self.samples, self.violations = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        keys = self.cluster.keys
        client = SchedulerClient(self.cluster.endpoint, str(keys) if keys else None, timeout_s=1.0)
        while not self._stop.wait(self.period):
            try:
                nodes = client.nodes().nodes
            except rpc.RpcError:
                continue  # the scheduler may be down on purpose
            self.samples += 1
            for n in nodes:
                for g in n.gpu_views:
                    if len(g.guaranteed) > 1:
                        self.violations.append((n.node_id, g.index, g.guaranteed))

    def stop(self):
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.cleanup()


def wait_all_done(cluster: Cluster, ids, timeout: float):
    def done():
        assert cluster.scheduler.poll() is None, cluster.logs()
        jobs = cluster.jobs()
        return jobs if all(jobs[i].state in ("succeeded", "failed", "cancelled") for i in ids) else None
    return wait_for(done, timeout, interval=0.5, what=f"{len(ids)} jobs to finish")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fifty_mixed_jobs_finish_through_a_scheduler_kill9(procs, tmp_path, sim_ext):
    c = Cluster(procs, tmp_path, nodes=3, gpus=2, starvation_s=10.0)
    watch = GuaranteedWatch(c)
    ids, gangs, plan = [], {}, []
    for i, workers in enumerate((2, 3, 4, 2)):  # DDP gangs: every step all-reduces, so a partial gang hangs
        plan.append(("ddp", dict(workers=workers, name=f"ddp{i}")))
    plan += [("cnn", dict(name=f"cnn{i}")) for i in range(3)]
    # the opportunistic jobs yield by the gate only, not by device priority: under the suite's load (other
    # tests on the same 2 cores), an idle-class job in a session of its own gets no CPU time until the cores
    # go idle, and this test is about placement and faults, not co-location (tests/torch_hooks, benchmarks)
    plan += [("opp", dict(priority="opportunistic", name=f"opp{i}", yield_via="gate")) for i in range(3)]
    plan += [("light", dict(seconds=1.0 + (i % 4), name=f"light{i}")) for i in range(20)]
    plan += [("light", dict(seconds=2.0, workers=2, name=f"pair{i}")) for i in range(4)]
    big_at = len(plan)
    plan.append(("light", dict(seconds=3.0, workers=4, name="big")))  # a 4-GPU gang among a stream of 1-GPU jobs
    plan += [("light", dict(seconds=3.0, name=f"stream{i}")) for i in range(15)]
    assert len(plan) == 50
    killed_at = 20
    for k, (kind, kw) in enumerate(plan):
        if k == killed_at:  # kill -9 the scheduler mid-run, and start it again on the same state file
            before = {j.job_id: j.state for j in c.client.jobs()[0]}
            c.scheduler.send_signal(signal.SIGKILL)
            c.scheduler.wait(10)
            c.start_scheduler()
            after = {j.job_id: j.state for j in c.client.jobs()[0]}
            assert set(after) == set(before) == set(ids)  # 0 jobs lost
        if kind == "ddp":
            jid = c.example("train_ddp.py", "--iters", 12, "--host-ms", 5, "--dist-timeout", 60, "--log-every", 0,
                            **kw)
            gangs[jid] = kw["workers"]
        elif kind == "cnn":
            jid = c.example("train_cnn.py", "--iters", 15, "--log-every", 0, **kw)
        elif kind == "opp":
            jid = c.example("train_transformer.py", "--iters", 15, "--log-every", 0, **kw)
        else:
            jid = c.light(kw.pop("seconds"), **kw)
            if kw.get("workers", 1) > 1:
                gangs[jid] = kw["workers"]
        ids.append(jid)
        if k == big_at:
            big = jid
        time.sleep(0.3)  # a stream, not a batch: pacing only; every check below waits on a condition
    jobs = wait_all_done(c, ids, 420)
    watch.stop()
    failed = {i: (jobs[i].state, jobs[i].reason) for i in ids if jobs[i].state != "succeeded"}
    assert not failed, (failed, c.logs())
    starts = c.starts()
    per_worker = {}
    for job, rank, _pid, t in starts:
        per_worker.setdefault((job, rank), []).append(t)
    assert {k: len(v) for k, v in per_worker.items() if len(v) != 1} == {}  # 0 started twice
    assert {j for j, _ in per_worker} == set(ids)
    spread = {g: max(per_worker[(g, r)][0] for r in range(w)) - min(per_worker[(g, r)][0] for r in range(w))
              for g, w in gangs.items()}
    assert max(spread.values()) <= 1.0, spread  # every gang's workers start within 1 s of each other
    assert watch.samples > 50 and watch.violations == []  # no GPU ever held two guaranteed jobs
    assert all(jobs[i].attempts == 1 for i in ids)
    # not starved: a 1-GPU job submitted after the gang starts before it only within the aging window
    # (the gang's queue waits starvation_s = 10 s before the small queue holds for it)
    stream_ids = ids[big_at + 1:]
    jumped = [s for s in stream_ids if jobs[s].started_at < jobs[big].started_at
              and jobs[s].started_at > jobs[big].submitted_at + 10.0 + 1.0]
    assert jumped == [], (jumped, jobs[big])
    later = sum(1 for s in stream_ids if jobs[s].started_at >= jobs[big].started_at)
    print(f"\n50 jobs: {len(gangs)} gangs, start spread max {max(spread.values()):.3f} s; "
          f"{watch.samples} samples, 0 GPUs with two guaranteed jobs; the 4-GPU gang waited "
          f"{jobs[big].started_at - jobs[big].submitted_at:.1f} s, {later} of {len(stream_ids)} later 1-GPU jobs "
          f"started after it")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_killed_node_is_down_within_3s_and_its_gang_finishes_elsewhere(procs, tmp_path):
    c = Cluster(procs, tmp_path, nodes=3, gpus=2)
    gang = c.light(8.0, workers=4, name="gang")  # two nodes of two GPUs each; killed within a second of running
    wait_for(lambda: c.jobs()[gang].state == "running", 60, what="the gang to run")
    first = set(c.jobs()[gang].nodes)
    assert len(first) == 2
    victim = sorted(first)[0]
    node = c.nodes[victim]
    tree = [node.pid] + [p.pid for p in psutil.Process(node.pid).children(recursive=True)]
    t_kill = time.monotonic()
    for pid in tree:  # the machine dies: the node and every worker on it
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not next(n for n in c.client.nodes().nodes if n.node_id == victim).up, 10, interval=0.05,
             what="the node to be marked down")
    down_s = time.monotonic() - t_kill
    jobs = wait_all_done(c, [gang], 120)
    job = jobs[gang]
    assert job.state == "succeeded", (job.reason, c.logs())
    assert job.attempts == 2 and victim not in job.nodes and len(job.nodes) == 2
    assert down_s <= 3.0, down_s  # 2.4 s of silence (3 heartbeats of 0.8 s), the 0.1 s tick, this poll's RPC
    print(f"\nnode {victim} marked down {down_s:.2f} s after kill -9; the gang reran on {','.join(job.nodes)}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_preempted_opportunistic_job_resumes_from_its_checkpoint(procs, tmp_path, sim_ext):
    c = Cluster(procs, tmp_path, nodes=1, gpus=1)
    opp = c.example("train_cnn.py", "--iters", 300, "--host-ms", 5, "--log-every", 50, "--checkpoint", "opp.pt",
                    priority="opportunistic", name="opp", gpu_mem=12 << 30)

    def log_text() -> str:  # LOG_DIR/CLUSTER/JOB/worker-0.PLACEMENT.log: every placement's, oldest first
        logs = sorted(c.tmp.glob(f"logs/*/{opp}/worker-0.*.log"), key=lambda p: p.stat().st_mtime)
        return "".join(p.read_text() for p in logs)

    wait_for(lambda: "iter 50/" in log_text(), 120, what="the opportunistic job to train")
    # a guaranteed job runs beside opportunistic ones (AntMan: the node takes memory back from them),
    # unless their stated memory is in the way: 12 GiB held of 16, and this one needs 8, so it is preempted
    g = c.light(3.0, name="guaranteed", gpu_mem=8 << 30)
    jobs = wait_all_done(c, [g, opp], 240)
    assert jobs[g].state == jobs[opp].state == "succeeded", c.logs()
    assert jobs[opp].attempts == 2
    text = log_text()
    resumed = [int(x) for x in __import__("re").findall(r"resum\w* from iteration (\d+)", text)]
    assert resumed and resumed[-1] >= 50, text[-2000:]
    assert "done: 300 iterations" in text or "300 iterations" in text, text[-1500:]
    print(f"\npreempted after iteration >= 50, resumed from iteration {resumed[-1]}")


HOLDS = """\
import os, sys, time, torch
role, flag, finish = sys.argv[1:4]
m = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
held = None
for i in range(10 ** 6):
    opt.zero_grad(); m(torch.randn(32, 64)).sum().backward(); opt.step()  # a mini-batch boundary each
    time.sleep(0.01)
    if role == "opp" and held is None and i >= 3:  # its live set: 900 MiB it never frees
        held = torch.ones(900 << 20, dtype=torch.uint8)
        open(flag, "w").close()
    if role == "g" and held is None and os.path.exists(flag):  # a burst once the other holds its memory
        held = torch.ones(1200 << 20, dtype=torch.uint8)
    if role == "g" and os.path.exists(finish):
        break
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_memory_an_opportunistic_job_cannot_give_back_is_reclaimed_and_the_job_queued_again(procs, tmp_path, sim_ext):
    """A 2 GiB simulated GPU: the opportunistic job holds 900 MiB it cannot free; the guaranteed job's 1200 MiB burst
    finds the GPU full (the node's ledger) and is served from host. The node stops the opportunistic placement; the
    scheduler queues the job again, neither failed nor a failed start; the guaranteed job runs on and succeeds."""
    c = Cluster(procs, tmp_path, nodes=0)
    node = c.start_node("n0", 1, sim_gpu_mem="2GiB", config={"reclaim_after_s": 1.0, "opp_start_mem_fraction": 1.0})
    wait_for(lambda: [n.node_id for n in c.client.nodes().nodes] == ["n0"], 60, what="the node to join")
    script, flag, finish = tmp_path / "holds.py", tmp_path / "opp-holds", tmp_path / "finish"
    script.write_text(HOLDS)
    g = c.submit([PY, str(script), "g", str(flag), str(finish)], name="g", gpu_mem=1800 << 20)
    wait_for(lambda: c.jobs()[g].state == "running", 120, what="the guaranteed job to run")
    o = c.submit([PY, str(script), "opp", str(flag), str(finish)], name="opp", priority="opportunistic",
                 yield_via="gate")  # not the idle class: under the suite's load it would get no CPU (test above)
    wait_for(lambda: "(stopped: its memory was reclaimed)" in read_log(node), 180,
             what="the node to reclaim the opportunistic job's memory")
    assert "paused holding GPU memory the guaranteed job beside it needs" in read_log(node)
    wait_for(lambda: c.jobs()[o].attempts >= 2 or "needed the memory it held" in c.jobs()[o].reason, 60,
             what="the scheduler to queue the job again")
    assert c.jobs()[o].state != "failed", c.jobs()[o]
    finish.touch()
    jobs = wait_all_done(c, [g], 120)
    assert jobs[g].state == "succeeded", c.logs()
    c.client.cancel(o)
    assert wait_all_done(c, [o], 60)[o].state == "cancelled"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_with_curve_an_unauthenticated_node_and_client_are_refused(procs, tmp_path):
    keys, other = tmp_path / "keys", tmp_path / "other"
    K.generate(str(keys), K.NODE, "good")
    K.generate(str(keys), K.USER, "tester")
    K.generate(str(other), K.NODE, "stranger")  # keys the scheduler never admitted
    K.generate(str(other), K.USER, "tester")
    (other / "scheduler.key").write_bytes((keys / "scheduler.key").read_bytes())
    c = Cluster(procs, tmp_path, nodes=0, keys=keys)
    good = c.start_node("good", 1)
    plain = c.start_node("plain", 1, keys=None)  # no CURVE at all
    stranger = c.start_node("stranger", 1, keys=other)
    wait_for(lambda: [n.node_id for n in c.client.nodes().nodes] == ["good"], 60, what="the admitted node to join")
    with pytest.raises(rpc.NoAnswer):
        SchedulerClient(c.endpoint, "", timeout_s=1.5).nodes()
    with pytest.raises(rpc.NoAnswer):
        SchedulerClient(c.endpoint, str(other), timeout_s=1.5).nodes()
    for refused in (plain, stranger):  # each said hello, heard nothing, and is trying again
        wait_for(lambda: "reconnecting in" in read_log(refused), 30,  # noqa: B023 (waited here)
                 what="a refused node to retry")
    assert [n.node_id for n in c.client.nodes().nodes] == ["good"]
    assert good.poll() is None and plain.poll() is None and stranger.poll() is None


@pytest.mark.timeout(180)
def test_a_node_forgets_ended_placements_once_the_scheduler_has_settled_them(procs, tmp_path):
    """Without PlacementsSettled a node keeps an ended placement in its table and its status for 300 s."""
    import json

    c = Cluster(procs, tmp_path, nodes=1, gpus=2)
    ids = [c.light(0.2, name=f"short{i}") for i in range(4)]
    jobs = wait_all_done(c, ids, 120)
    assert all(jobs[i].state == "succeeded" for i in ids), (jobs, c.logs())
    table, done = tmp_path / "n0" / "workers.json", tmp_path / "n0" / "done.log"
    wait_for(lambda: json.loads(table.read_text())["placements"] == [], 30,
             what="the node to forget the settled placements", interval=0.2)
    retired = {line.split()[1] for line in done.read_text().splitlines()}
    assert retired == set(ids)  # each job's placement id is remembered (it never starts again)
