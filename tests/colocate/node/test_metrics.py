"""colocate/node/metrics.py: the node's Prometheus endpoint, scraped over real HTTP and parsed with
``prometheus_client``'s own parser.

One in-process node server (``tests.support.ServerHarness``, fake clock) with its metrics endpoint serves
the module, as one node serves many scrapes; each test starts and ends with no job on it and checks
differences between scrapes.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from colocate import protocol as P
from colocate.node.config import NodeConfig
from colocate.node.metrics import serve
from tests.support import GiB, MiB, ServerHarness, free_port, pack, sample, scrape

PID = os.getpid()


def serve_on_a_free_port(server) -> int:
    for _ in range(5):  # another process may take a free port before the exporter binds it
        port = free_port()
        try:
            serve(server, port)
            return port
        except OSError:
            continue
    raise AssertionError("no free port for the metrics endpoint")


@pytest.fixture(scope="module")
def module_node(module_ipc_dir):
    h = ServerHarness(module_ipc_dir, policy="static")
    h.port = serve_on_a_free_port(h.server)
    yield h
    h.close()


@pytest.fixture
def node(module_node):
    yield module_node

    def clear(core):  # a test that failed half-way may leave jobs behind: the next one starts without
        for job_id in list(core.jobs):
            core.handle(P.Goodbye(job_id=job_id, exit_code=None, reason="test cleanup"), module_node.clock())

    module_node.state(clear)


def families(node) -> dict:
    """{family name: (type, {(sample name, frozenset(labels)): value})} of one scrape."""
    out = {}
    for fam in text_string_to_metric_families(scrape(node.port)):
        out[fam.name] = (fam.type, {(s.name, frozenset(s.labels.items())): s.value for s in fam.samples})
    return out


def samples(node) -> dict:
    return {k: v for _, ss in families(node).values() for k, v in ss.items()}


def register(job_id, pid=PID, priority="opportunistic", mem_request=None):
    return P.Register(job_id=job_id, pid=pid, gpu=0, priority=priority, mem_request=mem_request, sm_share=1.0,
                      mem_cap=16 * GiB, epoch=1, token="", sm_request=1.0)


def report(job_id, seq, limits_seq, reserved=GiB):
    return P.BatchReport(job_id=job_id, seq=seq, t_end=1.0, duration_s=0.1, busy_s=0.05, device_start_s=0.0,
                         mem_allocated_peak=reserved // 2, mem_reserved=reserved, mem_floor=0, host_bytes=3 * MiB,
                         host_bytes_touched=0, limits_seq=limits_seq)


def sync(conn, job_id):
    assert isinstance(conn.ask(P.Heartbeat(job_id=job_id, sent_at=1.0)), P.Heartbeat)


def leave(conn, *job_ids):
    for job_id in job_ids:
        conn.send(P.Goodbye(job_id=job_id, exit_code=0, reason="done"))
    conn.send(P.Heartbeat(job_id=job_ids[-1], sent_at=1.0))
    assert conn.next().TYPE == "error"  # unknown now: every goodbye was handled


def register_then_end(conn, job_id: str) -> None:
    """Register a live child of this process as ``job_id`` (a registration may claim only the caller's own
    processes), then end it: exited and reaped."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert conn.ask(register(job_id, pid=child.pid)).TYPE == "welcome"
    finally:
        child.kill()
        child.wait(10)


def totals(node):
    s = samples(node)
    return sample(s, "colocate_node_jobs_exited_total"), sample(s, "colocate_node_jobs_lost_total")


def test_a_scrape_describes_the_gpus_and_the_jobs_as_the_core_has_them(node):
    conn = node.connect()
    before = samples(node)
    g = conn.ask(register("g", priority="guaranteed", mem_request=4 * GiB))
    o = conn.ask(register("o"))
    assert isinstance(g, P.Welcome) and isinstance(o, P.Welcome)
    conn.send(report("g", 0, g.limits.seq))
    conn.send(report("g", 1, g.limits.seq, reserved=2 * GiB))
    sync(conn, "g")
    s = samples(node)
    limits = node.state(lambda core: {j: core.jobs[j].limits for j in core.jobs})
    assert sample(s, "colocate_gpu_memory_total_bytes", gpu="0", kind="sim") == 16 * GiB
    assert sample(s, "colocate_gpu_jobs", gpu="0", priority="guaranteed") == 1
    assert sample(s, "colocate_gpu_jobs", gpu="0", priority="opportunistic") == 1
    assert 0.0 < sample(s, "colocate_gpu_utilization_ratio", gpu="0") <= 1.0
    for job_id, prio in (("g", "guaranteed"), ("o", "opportunistic")):
        labels = dict(job=job_id, gpu="0", priority=prio)
        assert sample(s, "colocate_job_memory_cap_bytes", **labels) == limits[job_id].mem_cap
        assert sample(s, "colocate_job_sm_share_ratio", **labels) == limits[job_id].sm_share
        assert sample(s, "colocate_job_limit_updates_total", **labels) == limits[job_id].seq
    assert limits["g"].mem_cap <= 4 * GiB  # its request is a ceiling
    assert sample(s, "colocate_job_iterations_total", job="g") == 2
    assert sample(s, "colocate_job_iterations_total", job="o") == 0
    assert sample(s, "colocate_job_memory_reserved_bytes", job="g") == 2 * GiB  # the last report
    assert sample(s, "colocate_job_memory_allocated_peak_bytes", job="g") == GiB
    assert sample(s, "colocate_job_host_bytes", job="g") == 3 * MiB
    assert sample(s, "colocate_job_memory_reserved_bytes", job="o") == 0  # no report yet

    def received(snapshot, kind):
        hits = [v for (n, ls), v in snapshot.items() if n == "colocate_node_messages_total" and dict(ls) == {"type": kind}]
        return hits[0] if hits else 0

    assert received(s, "register") - received(before, "register") == 2
    assert received(s, "batch_report") - received(before, "batch_report") == 2
    leave(conn, "g", "o")
    s = samples(node)
    assert not [k for k in s if dict(k[1]).get("job") in ("g", "o")]  # a job that left has no series
    assert sample(s, "colocate_gpu_jobs", gpu="0", priority="guaranteed") == 0


def test_a_placed_worker_that_never_registers_is_counted_on_its_gpu(node):
    from colocate.node import events as E
    from tests.colocate.node.test_placements import run, start

    msg = start("m.1", "m", gpus=(0,), priority="opportunistic", cluster="")
    node.state(lambda core: [core.handle(e, 1.0) for e in run(msg)])
    try:
        s = samples(node)
        assert sample(s, "colocate_gpu_jobs", gpu="0", priority="opportunistic") == 1
        assert sample(s, "colocate_gpu_jobs", gpu="0", priority="guaranteed") == 0
    finally:
        node.state(lambda core: core.handle(E.Exited("m.1", 0, 0, wall=2.0), 1.0))
    assert sample(samples(node), "colocate_gpu_jobs", gpu="0", priority="opportunistic") == 0


def test_counters_only_go_up(node):
    conn, ctl = node.connect(), node.connect(ctl=True)
    counter_types = ("counter", "summary")

    def counters():
        return {k: v for t, ss in families(node).values() if t in counter_types for k, v in ss.items()}

    steps = []
    last = counters()

    def step(name):
        nonlocal last
        now = counters()
        for key in last.keys() & now.keys():
            assert now[key] >= last[key], f"{key} went down after {name}: {last[key]} -> {now[key]}"
        for key in last.keys() - now.keys():  # only a job's own series end, when the job does
            assert "job" in dict(key[1]), f"{key} disappeared after {name}"
        steps.append((name, sum(1 for k in now if now[k] > last.get(k, 0.0))))  # a new series starts at 0
        last = now

    w = conn.ask(register("a"))
    step("register")
    for i in range(3):
        conn.send(report("a", i, w.limits.seq))
    sync(conn, "a")
    step("reports")
    assert conn.ask(b"garbage").TYPE == "error"
    assert conn.ask(pack({"v": 99})).TYPE == "error"
    step("bad frames")
    assert ctl.ask(P.CtlSet(job_id="a", mem_cap=GiB, sm_share=None)).TYPE == "ctl_ok"
    pushed = conn.wait_limits(lambda m: m.limits.mem_cap == GiB)
    node.clock.advance(0.1)
    conn.send(P.LimitsApplied(job_id="a", limits_seq=pushed.limits.seq, applied_at=1.0))
    sync(conn, "a")
    step("override acknowledged")
    register_then_end(conn, "b")
    node.tick()
    step("a job lost")
    leave(conn, "a")
    step("a job exited")
    assert all(n > 0 for _, n in steps), steps  # every step moved some counter, none moved one back


def test_jobs_exited_and_jobs_lost_are_counted_apart(node):
    conn = node.connect()
    cfg = NodeConfig()
    exited0, lost0 = totals(node)
    assert conn.ask(register("bye")).TYPE == "welcome"
    leave(conn, "bye")
    assert totals(node) == (exited0 + 1, lost0)  # said goodbye: exited, not lost
    register_then_end(conn, "vanished")
    node.tick()
    assert totals(node) == (exited0 + 1, lost0 + 1)  # its process is gone: lost
    assert conn.ask(register("silent")).TYPE == "welcome"
    node.tick(cfg.heartbeat_s * cfg.liveness + 0.5)
    assert totals(node) == (exited0 + 1, lost0 + 2)  # no word for longer than its liveness: lost
    assert node.state(lambda core: (core.jobs_exited, core.jobs_lost)) == (exited0 + 1, lost0 + 2)


def test_the_control_latency_summary_is_the_cores_totals(node):
    conn, ctl = node.connect(), node.connect(ctl=True)

    def summary():
        s = samples(node)
        return (sample(s, "colocate_node_control_latency_seconds_count"),
                sample(s, "colocate_node_control_latency_seconds_sum"))

    count0, sum0 = summary()
    w = conn.ask(register("c"))  # the Welcome's limits are in force at the job's first device work ...
    node.clock.advance(5.0)
    conn.send(P.LimitsApplied(job_id="c", limits_seq=w.limits.seq, applied_at=5.0))  # ... after its start-up:
    sync(conn, "c")
    assert summary() == (count0, pytest.approx(sum0, abs=1e-9))  # not a control latency (QA: it made p50 5 s)
    for share, dt in ((0.5, 0.25), (0.4, 0.5)):
        assert ctl.ask(P.CtlSet(job_id="c", mem_cap=None, sm_share=share)).TYPE == "ctl_ok"
        pushed = conn.wait_limits(lambda m, share=share: m.limits.sm_share == share)
        node.clock.advance(dt)
        for _ in range(2):  # an acknowledgement repeated counts once
            conn.send(P.LimitsApplied(job_id="c", limits_seq=pushed.limits.seq, applied_at=6.0))
        sync(conn, "c")
    count, total = summary()
    assert (count, total) == (count0 + 2, pytest.approx(sum0 + 0.75, abs=1e-9))
    assert (count, total) == node.state(lambda core: (core.control_count, core.control_sum_s))
    s = samples(node)
    for q in ("0.5", "0.99"):
        assert sample(s, "colocate_node_control_latency_quantile_seconds", quantile=q) in (0.25, 0.5)
    leave(conn, "c")
