"""A real `colocate node --scheduler` against a fake scheduler ROUTER: placements started, promoted, stopped,
and re-adopted by a restarted node. The workers are examples/train_ddp.py processes (the node sets torchrun's
variables), each under the real launcher, registering with the node as JOB/RANK. Waits are FakeScheduler.expect
(deadlines) or polls of the node's listing and the workers' logs.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from colocate import protocol as P
from tests.support import JOB_START_S, PY, REPO, FakeScheduler, NodeProc, child_env, free_port, wait_for

DDP = str(REPO / "examples" / "train_ddp.py")


@pytest.fixture
def sched():
    s = FakeScheduler(background=True)
    yield s
    s.close()


def scheduled_node(procs, ipc_dir, sched) -> NodeProc:
    return NodeProc(procs, ipc_dir, "--sim-gpus", 2, "--scheduler", sched.endpoint, "--node-id", "n1",
                    "--host", "127.0.0.1", "--state-dir", ipc_dir / "state", "--log-dir", ipc_dir / "logs",
                    "--insecure")  # the fake scheduler speaks without CURVE


def ddp_placement(ipc_dir, pid: str, *args, priority="guaranteed") -> P.StartPlacement:
    req = P.JobRequest(command=(PY, DDP, "--host-ms", "10", *map(str, args)), cwd=str(ipc_dir), env=child_env(),
                       workers=2, priority=priority)
    return P.StartPlacement(placement_id=pid, job_id="ddp", priority=priority, request=req,
                            workers=(P.WorkerLaunch(0, 0, (0,)), P.WorkerLaunch(1, 1, (1,))), world_size=2,
                            group_rank=0, master_addr="127.0.0.1", master_port=free_port())


def join(sched, heartbeat_s=0.5):
    ident, hello = sched.expect(P.NodeHello, 30)
    sched.welcome(ident, "n1", heartbeat_s=heartbeat_s, liveness=3)
    sched.expect(P.NodeStatus)
    return ident, hello


def events(sched, cls, placement_id: str, ranks=(0, 1), timeout: float = 120.0) -> dict:
    """rank -> the message of type ``cls`` for each of ``ranks`` of the placement, in whatever order they came
    (the fake scheduler's thread records everything the node sends)."""
    def got():
        have = {m.rank: m for m in sched.of(cls) if m.placement_id == placement_id}
        return have if set(ranks) <= set(have) else None

    return wait_for(got, timeout, what=f"{cls.__name__} of ranks {ranks} of {placement_id}")


def both_listed(node):
    jobs = node.jobs()
    return jobs if {"ddp/0", "ddp/1"} <= set(jobs) else None


def log_iter(path: Path) -> int:
    try:
        found = re.findall(r"^iter (\d+)/", path.read_text(errors="replace"), re.M)
    except OSError:
        return 0
    return max(map(int, found), default=0)


@pytest.mark.slow
@pytest.mark.timeout(450)  # above the sum of its bounded waits (430 s)
def test_a_placement_starts_reports_is_promoted_and_ends(sim_ext, procs, ipc_dir, sched):
    node = scheduled_node(procs, ipc_dir, sched).start()
    ident, hello = join(sched)
    assert [g.index for g in hello.gpus] == [0, 1] and hello.host == "127.0.0.1"
    sched.send(ident, ddp_placement(ipc_dir, "p1", "--iters", 600, "--log-every", 100, priority="opportunistic"))
    started = events(sched, P.WorkerStarted, "p1", timeout=30)
    assert [Path(started[r].log_path) for r in (0, 1)] == [ipc_dir / "logs" / "unnamed" / "ddp" / f"worker-{r}.p1.log"
                                                          for r in (0, 1)]  # LOG_DIR/CLUSTER/JOB, per placement
    jobs = wait_for(lambda: both_listed(node), JOB_START_S, what="both workers registered with the node")
    assert (jobs["ddp/0"].gpu, jobs["ddp/1"].gpu) == (0, 1) and {j.priority for j in jobs.values()} == {"opportunistic"}

    sched.send(ident, P.PromotePlacement(placement_id="p1", job_id="ddp"))
    wait_for(lambda: {j.priority for j in (both_listed(node) or {}).values()} == {"guaranteed"}, 30,
             what="the promoted workers to be guaranteed in the node")

    def busy_status(m):
        return len(m.workers) == 2 and all(w.running for w in m.workers) and all(
            g.utilization > 0 and g.mem_used > 0 for g in m.gpus)

    _, status = sched.expect(P.NodeStatus, 60, pred=busy_status)  # both GPUs at work, memory in use
    assert {(w.job_id, w.placement_id, w.rank) for w in status.workers} == {("ddp", "p1", 0), ("ddp", "p1", 1)}
    exits = events(sched, P.WorkerExited, "p1", timeout=180)
    assert [exits[r].exit_code for r in (0, 1)] == [0, 0]
    assert "done: 600 iterations" in Path(started[0].log_path).read_text()
    sched.send(ident, ddp_placement(ipc_dir, "p1", "--iters", 600))  # the same placement again: nothing starts
    sched.send(ident, P.Cancel(job_id="ddp"))  # a client's request: refused, and the node goes on
    _, err = sched.expect(P.Error, 10)
    assert err.code == P.FORBIDDEN
    assert len(sched.of(P.WorkerStarted)) == 2


def exited_or_explain(sched, node, log0, pid: str, timeout: float) -> dict:
    """Rank -> WorkerExited of placement ``pid`` within ``timeout`` s; on a timeout (seen on loaded machines) the
    assertion carries the node's log tail, rank 0's log tail and what the node sent."""
    try:
        return events(sched, P.WorkerExited, pid, timeout=timeout)
    except AssertionError as exc:
        tail = "\n".join(node.log().splitlines()[-40:])
        raise AssertionError(f"{exc}\nnode log:\n{tail}\nrank 0 log:\n{log0.read_text()[-3000:]}\n"
                             f"what the node sent: {[type(m).__name__ for m in sched.of(P.Message)][-30:]}") from None


@pytest.mark.slow
@pytest.mark.timeout(720)  # above the sum of its bounded waits (700 s), so a timeout is one of them, with the logs
def test_a_restarted_node_readopts_its_workers_and_a_stop_checkpoints_them(sim_ext, procs, ipc_dir, sched):
    node = scheduled_node(procs, ipc_dir, sched).start()
    ident, first = join(sched)
    start = ddp_placement(ipc_dir, "p1", "--duration", 300, "--log-every", 10, "--checkpoint", "ddp.pt")
    sched.send(ident, start)
    started = {r: m.pid for r, m in events(sched, P.WorkerStarted, "p1", timeout=30).items()}
    log0 = ipc_dir / "logs" / "unnamed" / "ddp" / "worker-0.p1.log"
    wait_for(lambda: log_iter(log0) >= 20, JOB_START_S, what="the gang to train")

    node.kill9()  # the node crashes; its workers keep training
    n_started = len(sched.of(P.WorkerStarted))
    node.start()
    ident, hello = sched.expect(P.NodeHello, 30, pred=lambda m: m.epoch > first.epoch)  # a new incarnation
    sched.welcome(ident, "n1", heartbeat_s=0.5)
    _, status = sched.expect(P.NodeStatus, 10)
    assert {(w.rank, w.pid, w.running) for w in status.workers} == {(0, started[0], True), (1, started[1], True)}
    wait_for(lambda: both_listed(node), 30, what="the workers to register with the new node")
    # each worker registers again once or twice (a link that found the node silent reconnects), never once per
    # message it queued while the node was down (a storm of 40 each, which kept the node from its scheduler)
    again = re.findall(r"job ddp/(\d) registered", (node.tmp / f"node-{node.starts}.log").read_text())
    assert max(again.count(r) for r in "01") <= 5, again
    sched.send(ident, start)  # the scheduler repeats the start: the node starts nothing twice
    sched.send(ident, P.StopPlacement(placement_id="p1", job_id="ddp", reason="preempted", grace_s=60.0))
    exits = {r: m.exit_code for r, m in exited_or_explain(sched, node, log0, "p1", 300).items()}
    assert exits == {0: 143, 1: 143}  # exited on SIGTERM after saving; codes from the launchers' exit files
    assert len(sched.of(P.WorkerStarted)) == n_started
    saved = re.search(r"SIGTERM: checkpoint saved at iteration (\d+)", log0.read_text())
    assert saved and int(saved.group(1)) >= 20

    k = int(saved.group(1))
    sched.send(ident, ddp_placement(ipc_dir, "p2", "--iters", k + 30, "--log-every", 0, "--checkpoint", "ddp.pt"))
    log0 = log0.with_name("worker-0.p2.log")  # each placement has its own log
    exits = exited_or_explain(sched, node, log0, "p2", 180)
    assert [exits[r].exit_code for r in (0, 1)] == [0, 0]
    text = log0.read_text()
    assert f"resumed from iteration {k}" in text and f"done: {k + 30} iterations" in text  # no finished work lost
