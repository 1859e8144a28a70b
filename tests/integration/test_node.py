"""The node coordinator end to end: real `colocate node` and `colocate run` processes on real ipc sockets.

Each test gets its own short temporary directory for its endpoints, its own node process and jobs, and kills
every process it started (process groups, SIGKILL) when it ends, pass or fail. Waits poll with deadlines;
deadlines that are the specification (re-registration, a memory burst) are measured on the node's own clock
(its ``--record`` rows' ``node_t``).
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path

import pytest

from colocate.gpus import ledger
from tests.support import (
    JOB_START_S,
    PY,
    GiB,
    MiB,
    NodeProc,
    alive,
    cnn,
    colocate_cli,
    finish,
    metric_samples,
    read_log,
    sample,
    start_job,
    stats_of,
    wait_for,
)

# jobs start in here: on a fresh machine the first one also builds the allocator extension
pytestmark = pytest.mark.timeout(300)


# A job that trains until the test says stop: its life is the test's to end, not a wall-clock duration
# (on a loaded machine a job with --duration may end before the test has checked what it needs).
STEADY = """\
import os, sys, time
import torch
stop = sys.argv[1]
device = "cuda" if torch.cuda.is_available() else "cpu"  # the simulated GPU under colocate run
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256, device=device)
deadline = time.monotonic() + 240
while not os.path.exists(stop):
    if time.monotonic() > deadline:
        sys.exit("never told to stop")
    time.sleep(0.01)  # the host phase of a mini-batch (a data loader)
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
"""


def steady(tmp: Path, stop: Path) -> list:
    """The arguments of a STEADY job that runs until ``stop`` exists."""
    script = tmp / "steady.py"
    if not script.exists():
        script.write_text(STEADY)
    return [script, stop]


# ---------------------------------------------------------------- tests


@pytest.mark.slow
def test_two_jobs_register_adapt_report_metrics_and_obey_ctl(sim_ext, procs, ipc_dir):
    node = NodeProc(procs, ipc_dir).start()
    stop = ipc_dir / "stop"
    g = start_job(procs, node, "g1", *steady(ipc_dir, stop))
    o = start_job(procs, node, "o1", *steady(ipc_dir, stop), priority="opportunistic")

    jobs = wait_for(lambda: (lambda js: js if {"g1", "o1"} <= set(js) else None)(node.jobs()), JOB_START_S,
                    what="both jobs in the node's listing")
    assert jobs["g1"].priority == "guaranteed" and jobs["o1"].priority == "opportunistic"
    assert jobs["g1"].pid != jobs["o1"].pid and jobs["g1"].gpu == jobs["o1"].gpu == 0
    if hasattr(os, "SCHED_IDLE"):  # the opportunistic job yields the simulated GPU's core: idle class
        wait_for(lambda: os.sched_getscheduler(jobs["o1"].pid) == os.SCHED_IDLE, 30,
                 what="the opportunistic job to take low device priority")
        assert os.sched_getscheduler(jobs["g1"].pid) == os.SCHED_OTHER

    # the opportunistic job's limits move while it runs (baseline pause, then AIMD)
    def opp_shares():
        rows = [r for r in node.records() if r["kind"] == "limits" and r["job_id"] == "o1"]
        return {r["limits"]["sm_share"] for r in rows} if len(rows) >= 2 else None

    shares = wait_for(lambda: (lambda s: s if s and len(s) >= 2 else None)(opp_shares()), 30,
                      what="the opportunistic job's share to change")
    assert all(0.0 <= s <= 1.0 for s in shares)
    wait_for(lambda: node.jobs().get("g1") and node.jobs()["g1"].iterations >= 5, 30, what="guaranteed reports")

    # Prometheus metrics over HTTP
    text = node.metrics()
    for name in ("colocate_gpu_utilization_ratio", "colocate_job_memory_cap_bytes", "colocate_job_sm_share_ratio",
                 "colocate_job_iterations_total", "colocate_node_messages_total"):
        assert name in text, name
    s = metric_samples(text)
    assert 0.0 < sample(s, "colocate_gpu_utilization_ratio", gpu="0") <= 1.0
    assert sample(s, "colocate_job_memory_cap_bytes", job="g1", priority="guaranteed") == 16 * GiB
    assert 0 < sample(s, "colocate_job_memory_cap_bytes", job="o1") <= 16 * GiB
    assert sample(s, "colocate_job_sm_share_ratio", job="g1") == 1.0
    assert 0.0 <= sample(s, "colocate_job_sm_share_ratio", job="o1") <= 1.0
    assert sample(s, "colocate_job_iterations_total", job="g1") >= 5
    assert sample(s, "colocate_node_messages_total", type="register") >= 2
    assert sample(s, "colocate_node_messages_total", type="batch_report") >= 5
    assert 'colocate_job_memory_cap_bytes{gpu="0",job="g1",priority="guaranteed"}' in text

    # operator override, seen by ctl list --json and the metrics
    seq_before = max(r["limits"]["seq"] for r in node.records() if r["kind"] == "limits" and r["job_id"] == "o1")
    res = colocate_cli("ctl", "--node", node.endpoint, "set", "o1", "--sm-share", "0.3")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("o1:") and "share 0.3" in res.stdout
    m = re.search(r"\(seq (\d+)\)", res.stdout)
    assert m, res.stdout
    seq_override = int(m.group(1))
    assert seq_override > seq_before  # a new limits update, not the one the job already had
    res = colocate_cli("ctl", "--node", node.endpoint, "list", "--json")
    assert res.returncode == 0, res.stderr
    listed = {j["job_id"]: j for j in json.loads(res.stdout)["jobs"]}
    assert listed["o1"]["sm_share"] == 0.3 and listed["o1"]["slo_state"] == "override"
    assert listed["g1"]["sm_share"] == 1.0
    assert sample(metric_samples(node.metrics()), "colocate_job_sm_share_ratio", job="o1") == 0.3
    # the node sent it, and the job applies it at its next boundary: its reports name the override's seq
    sent = [r for r in node.records() if r["kind"] == "limits" and r["job_id"] == "o1"
            and r["limits"]["seq"] == seq_override]
    assert [r["limits"]["sm_share"] for r in sent] == [0.3], sent
    wait_for(lambda: any(r["kind"] == "report" and r["job_id"] == "o1" and r["limits_seq"] >= seq_override
                         for r in node.records()), 30, what="o1 reports under the override")
    assert node.jobs()["o1"].sm_share == 0.3

    stop.write_text("")
    assert finish(g) == 0, read_log(g)[-3000:]
    assert finish(o) == 0, read_log(o)[-3000:]
    assert stats_of(g)["iterations"] > 0 and stats_of(o)["iterations"] > 0
    # the override held until the job ended (it pins the share): every later update and the job's own share
    later = [r["limits"]["sm_share"] for r in node.records() if r["kind"] == "limits" and r["job_id"] == "o1"
             and r["limits"]["seq"] >= seq_override]
    assert later and set(later) == {0.3}, later
    assert stats_of(o)["sm_share"] == 0.3
    wait_for(lambda: node.listing() is not None and not node.listing().jobs, 10, what="jobs to leave the node")
    assert node.proc.poll() is None
    node.stop()
    assert node.proc.returncode == 0


def log_times(text: str, pattern: str) -> list[tuple[float, re.Match]]:
    """(wall-clock seconds, match) of each node log line whose message matches ``pattern``."""
    out = []
    for line in text.splitlines():
        head = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) colocate-node \w+ (.*)$", line)
        if head:
            m = re.search(pattern, head.group(2))
            if m:
                out.append((datetime.strptime(head.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m))
    return out


@pytest.mark.slow
def test_node_kill9_and_restart_jobs_keep_running_and_reregister(sim_ext, procs, ipc_dir):
    node = NodeProc(procs, ipc_dir, metrics=False).start()
    stop = ipc_dir / "stop"
    g = start_job(procs, node, "g1", *steady(ipc_dir, stop))
    o = start_job(procs, node, "o1", *steady(ipc_dir, stop), priority="opportunistic")
    before = wait_for(lambda: (lambda js: js if {"g1", "o1"} <= set(js) and js["g1"].iterations >= 3 else None)(
        node.jobs()), JOB_START_S, what="both jobs registered and reporting")
    epoch = node.listing().node_epoch

    node.kill9()
    assert g.poll() is None and o.poll() is None  # the jobs do not notice yet
    node.start()
    new_epoch = node.listing().node_epoch
    assert new_epoch != epoch

    after = wait_for(lambda: (lambda js: js if {"g1", "o1"} <= set(js) else None)(node.jobs()), 30,
                     what="every job to register again with the restarted node")
    assert {j: after[j].pid for j in after} == {j: before[j].pid for j in before}  # the same processes
    assert g.poll() is None and o.poll() is None
    # the specification: each job registers again within 5 s of the restarted node serving (its own log's clock)
    log = Path(ipc_dir / f"node-{node.starts}.log").read_text(errors="replace")
    (t_up, _), = log_times(log, rf"^node epoch {new_epoch}: jobs on ")
    registered = {}
    for t, m in log_times(log, r"^job (\S+) registered: "):
        registered.setdefault(m.group(1), t)
    assert set(registered) == {"g1", "o1"}, log[-3000:]
    for job_id, t in registered.items():
        assert -0.01 <= t - t_up <= 5.0, f"{job_id} registered {t - t_up:.2f}s after the restart"
    wait_for(lambda: node.jobs().get("g1") and node.jobs()["g1"].iterations >= 3, 20,
             what="reports to the restarted node")

    stop.write_text("")
    assert finish(g) == 0, read_log(g)[-3000:]
    assert finish(o) == 0, read_log(o)[-3000:]
    assert stats_of(g)["iterations"] > 0 and stats_of(o)["iterations"] > 0
    print("re-registered " + ", ".join(f"{j} {t - t_up:.2f}s" for j, t in sorted(registered.items()))
          + " after the restart")


CRASHER = """\
import os, sys, time
import torch
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
go = sys.argv[1]
mode = sys.argv[2]
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    time.sleep(0.02)
print(f"crashing at {time.time():.6f}", flush=True)
if mode == "exit":
    os._exit(1)
raise RuntimeError("simulated crash in the training loop")
"""


@pytest.mark.slow
def test_crashing_jobs_are_removed_and_the_neighbour_keeps_running(sim_ext, procs, ipc_dir):
    node = NodeProc(procs, ipc_dir, metrics=False).start()
    script = ipc_dir / "crasher.py"
    script.write_text(CRASHER)
    go = ipc_dir / "crash-now"
    stop = ipc_dir / "stop"
    g = start_job(procs, node, "g1", *steady(ipc_dir, stop))
    crash_exit = start_job(procs, node, "c-exit", script, go, "exit", priority="opportunistic")
    crash_raise = start_job(procs, node, "c-raise", script, go, "raise", priority="opportunistic")

    def registered():
        js = node.jobs()
        return js if {"g1", "c-exit", "c-raise"} <= set(js) and js["g1"].iterations >= 3 else None

    jobs = wait_for(registered, JOB_START_S, what="all three jobs registered")
    pids = {j: jobs[j].pid for j in ("c-exit", "c-raise")}
    go.write_text("now")
    assert finish(crash_exit, 60) == 1
    assert finish(crash_raise, 60) == 1
    assert "simulated crash" in read_log(crash_raise)

    wait_for(lambda: (lambda js: set(js) == {"g1"} and js)(node.jobs()), 20,
             what="crashed jobs to be removed from the node")
    for pid in pids.values():
        assert not alive(pid)
    # each is removed within 2.5 s of its crash: the crash time the job printed, the removal time the node logged
    left = {m.group(1): t for t, m in log_times(node.log(), r"^job (c-\S+) left: ")}
    assert set(left) == {"c-exit", "c-raise"}, node.log()[-3000:]
    for proc in (crash_exit, crash_raise):
        found = re.findall(r"crashing at (\d+\.\d{6})", read_log(proc))  # its stderr may share the line
        assert len(found) == 1, read_log(proc)[-2000:]
        crashed = float(found[0])
        assert -0.01 <= left[proc.job_id] - crashed < 2.5, (proc.job_id, left[proc.job_id] - crashed)

    # the neighbour was not disturbed: still registered, still reporting, exits 0
    it0 = node.jobs()["g1"].iterations
    wait_for(lambda: node.jobs().get("g1") and node.jobs()["g1"].iterations > it0 + 3, 20,
             what="the guaranteed job to keep reporting")
    assert g.poll() is None
    stop.write_text("")
    assert finish(g) == 0, read_log(g)[-3000:]
    assert stats_of(g)["iterations"] > 0


@pytest.mark.slow
def test_guaranteed_memory_burst_shrinks_opportunistic_cap_within_1s(sim_ext, procs, ipc_dir):
    headroom = 256 * MiB
    # opp_start_mem_fraction=1: the opportunistic job starts holding all the memory the guaranteed job leaves,
    # so the guaranteed job's burst must take memory back from it.
    node = NodeProc(procs, ipc_dir, "--sim-gpu-mem", "4GiB", metrics=False,
                    config={"opp_start_mem_fraction": 1.0, "mem_headroom_bytes": headroom}).start()
    stop = ipc_dir / "stop"
    o = start_job(procs, node, "o1", *steady(ipc_dir, stop), priority="opportunistic",
                  run_opts=["--sim-gpu-mem", "4GiB"])
    wait_for(lambda: "o1" in node.jobs(), JOB_START_S, what="the opportunistic job to register")
    g = start_job(procs, node, "g1", *cnn("--iters", 60, "--host-ms", 10, "--mem-burst-at", 40,
                                          "--mem-burst-mib", 512),
                  run_opts=["--gpu-mem", "2GiB", "--sim-gpu-mem", "4GiB"])
    assert finish(g) == 0, read_log(g)[-3000:]
    assert o.poll() is None, read_log(o)[-3000:]  # the opportunistic job lives through the shrink
    # both held the GPU's total together through the node's ledger: the opportunistic job's slot is there
    usage = ledger.read(ledger.ledger_path(node.endpoint, 0))
    o_pid = node.jobs()["o1"].pid  # the process that registered: the one that allocates
    assert usage.total == 4 * GiB and usage.used <= usage.total
    assert usage.reserved.get(o_pid, 0) > 0, (o_pid, usage)

    rows = node.records()
    g_reports = [r for r in rows if r["kind"] == "report" and r["job_id"] == "g1"]
    assert len(g_reports) > 45
    base = g_reports[0]["mem_reserved"]
    jump = next(r for r in g_reports if r["mem_reserved"] >= base + 512 * MiB)
    assert jump["seq"] >= 40
    t_jump = jump["node_t"]
    o_limits = [r for r in rows if r["kind"] == "limits" and r["job_id"] == "o1"]
    before = [r["limits"]["mem_cap"] for r in o_limits if r["node_t"] < t_jump]
    after = [r for r in o_limits if t_jump <= r["node_t"] <= t_jump + 1.0]
    assert before, "the opportunistic job got no limits before the burst"
    cap_before = before[-1]
    fits = 4 * GiB - jump["mem_reserved"] - headroom
    assert cap_before > fits, "the burst would not need the opportunistic job's memory"
    drops = [r for r in after if r["limits"]["mem_cap"] < cap_before]
    assert drops, f"no cap drop within 1 s of the burst (cap {cap_before}, limits after: {after})"
    assert drops[0]["limits"]["mem_cap"] <= fits
    assert drops[0]["node_t"] - t_jump <= 1.0
    # and the opportunistic job applies the lowered cap: it reports under it
    wait_for(lambda: any(r["kind"] == "report" and r["job_id"] == "o1"
                         and r["limits_seq"] >= drops[0]["limits"]["seq"] for r in node.records()), 30,
             what="the opportunistic job to report under the lowered cap")
    stop.write_text("")
    assert finish(o) == 0, read_log(o)[-3000:]

    gs = stats_of(g)
    assert gs["host_bytes_peak"] == 0
    assert gs["mem_cap_bytes"] == 2 * GiB
    assert gs["mem_reserved_peak_bytes"] >= 512 * MiB


def test_a_second_node_cannot_steal_a_running_nodes_endpoint(procs, ipc_dir):
    first = NodeProc(procs, ipc_dir, metrics=False, record=False).start()
    epoch = first.listing().node_epoch
    second = procs.start([PY, "-m", "colocate", "node", "--device", "sim", "--endpoint", first.endpoint],
                         "second-node.log")
    assert second.wait(timeout=30) == 1
    assert "in use" in read_log(second) and "Traceback" not in read_log(second)
    assert first.proc.poll() is None and first.listing().node_epoch == epoch  # still the first node answering


def test_a_job_the_node_refuses_stops_in_one_line_and_never_runs_beside_the_guaranteed_job(sim_ext, procs, ipc_dir):
    """A second guaranteed job on a GPU that has one: the node refuses it, and the job stops before any device work,
    in one line (it ran on at its own limits, beside the guaranteed job and out of the node's sight)."""
    node = NodeProc(procs, ipc_dir, metrics=False).start()
    stop = ipc_dir / "stop"
    g = start_job(procs, node, "g1", *steady(ipc_dir, stop))
    wait_for(lambda: "g1" in node.jobs(), JOB_START_S, what="the guaranteed job to register")
    second = start_job(procs, node, "g2", *steady(ipc_dir, stop))
    assert finish(second, JOB_START_S) != 0
    log = read_log(second)
    assert "refused worker g2" in log and "already runs guaranteed job g1" in log, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
    assert set(node.jobs()) == {"g1"}
    stop.write_text("")
    assert finish(g) == 0, read_log(g)[-3000:]
