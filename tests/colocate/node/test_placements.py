"""The placement rules of the node's pure core (``colocate.node.placements``) and its exclusivity rule
(``colocate.node.claims``), table-driven: each case is a sequence of events and what the last one must command. No
processes, no files."""

from __future__ import annotations

import signal

import pytest

from colocate import protocol as P
from colocate.gpus import GpuSpec
from colocate.node import events as E
from colocate.node import placements as PC
from colocate.node.claims import Claim, conflict
from colocate.node.commands import Launch, Report, Signal
from colocate.node.config import NodeConfig
from colocate.node.core import NodeCore
from colocate.node.table import PlacementTable, Worker

REQ = P.JobRequest(command=("python", "x.py"), cwd="/", env=())


def start(pid="1.1", job="1", gpus=(0,), priority="guaranteed", cluster="c1") -> P.StartPlacement:
    return P.StartPlacement(placement_id=pid, job_id=job, priority=priority, request=REQ,
                            workers=tuple(P.WorkerLaunch(r, r, (g,)) for r, g in enumerate(gpus)),
                            world_size=len(gpus), group_rank=0, master_addr="127.0.0.1", master_port=0,
                            cluster_id=cluster)


def launched(msg: P.StartPlacement) -> E.Launched:
    return E.Launched(msg, tuple(Worker(rank=w.rank, local_rank=w.local_rank, gpus=list(w.gpus), pid=100 + w.rank,
                                         create_time=1.0, log_path=f"/l/{w.rank}", exit_file=f"/e/{w.rank}")
                                  for w in msg.workers))


def run(msg: P.StartPlacement) -> list:
    """Start and launch ``msg``: the events of a placement whose workers run."""
    return [E.Start(msg), launched(msg)]


def core(cluster="c1") -> NodeCore:
    c = NodeCore([GpuSpec(index=i, kind="sim", mem_total=1 << 30) for i in (0, 1)], NodeConfig(), node_epoch=7)
    c.take_placements("n1", PlacementTable(), keep_ended_s=300.0, cluster=cluster)
    return c


def stop(pid: str, job: str, grace_s: float, cluster: str) -> E.Stop:
    return E.Stop(pid, job, grace_s, cluster, wall=1000.0)


def exited(key: str, rank: int, code: int) -> E.Exited:
    return E.Exited(key, rank, code, wall=1000.0)


def welcomed(cluster: str) -> E.Welcomed:
    return E.Welcomed(cluster, grace_s=3.0, wall=1000.0)


def shown(cmds) -> list:
    """The commands as short tuples (notes and saves left out)."""
    out = []
    for c in cmds:
        if isinstance(c, Launch):
            out.append(("launch", c.key))
        elif isinstance(c, Signal):
            out.append(("signal", c.key, c.rank, signal.Signals(c.sig).name))
        elif isinstance(c, Report):
            m = c.msg
            if isinstance(m, P.StartRefused):
                out.append(("refused", m.placement_id, m.code, m.reason))
            elif isinstance(m, P.WorkerExited):
                out.append(("exited", m.placement_id, m.rank, m.exit_code, m.fenced))
            else:
                out.append((m.TYPE, m.placement_id, m.rank))
    return out


A = start("1.1", "1")
HOLDER_STOPPING = run(A) + [stop("1.1", "1", 5.0, "c1")]
CASES = {
    "a free GPU: launch": ([E.Start(A)], [("launch", "c1/1.1")]),
    "launched: reports each worker": ([E.Start(A), launched(A)], [("worker_started", "1.1", 0)]),
    "a guaranteed holder: refused": (
        run(A) + [E.Start(start("2.1", "2"))],
        [("refused", "2.1", P.REFUSED, "GPU 0 already runs guaranteed job 1 (placement 1.1)")]),
    "a holder being stopped: stale, never the job's fault": (
        HOLDER_STOPPING + [E.Start(start("2.1", "2"))],
        [("refused", "2.1", P.REFUSED_STALE, "GPU 0 is busy with placement 1.1 of job 1, which this node is stopping")]),
    "a stale refusal is not remembered: the same id starts once the GPU is free": (
        HOLDER_STOPPING + [E.Start(start("2.1", "2")), exited("c1/1.1", 0, 143), E.Start(start("2.1", "2"))],
        [("launch", "c1/2.1")]),
    "opportunistic beside a guaranteed job: launch": (
        run(A) + [E.Start(start("3.1", "3", priority="opportunistic"))], [("launch", "c1/3.1")]),
    "a GPU the node lacks: refused, and the repeat gets the same": (
        [E.Start(start("4.1", "4", gpus=(5,))), E.Start(start("4.1", "4", gpus=(5,)))],
        [("refused", "4.1", P.REFUSED, "GPU 5 is not on this node (it has 0,1)")]),
    "two workers on one GPU: refused": (
        [E.Start(start("5.1", "5", gpus=(1, 1)))], [("refused", "5.1", P.REFUSED, "two workers share a GPU")]),
    "a stop that overtook its start": (
        [stop("6.1", "6", 5.0, "c1"), E.Start(start("6.1", "6"))],
        [("refused", "6.1", P.REFUSED, PC.STOPPED_BEFORE_START)]),
    "a known placement starts nothing again": (run(A) + [E.Start(A)], []),
    "the same id in another cluster is another placement": (
        run(A) + [exited("c1/1.1", 0, 0), E.Start(start("1.1", "1", cluster="c2"))], [("launch", "c2/1.1")]),
    "stop: SIGTERM now": (run(A) + [stop("1.1", "1", 5.0, "c1")], [("signal", "c1/1.1", 0, "SIGTERM")]),
    "the end of a promoted placement": (
        run(A) + [E.Promoted("1.1", "c1"), exited("c1/1.1", 0, 0)], [("exited", "1.1", 0, 0, False)]),
    "an exit while the lease has lapsed is fenced": (
        run(A) + [E.Fence(True), exited("c1/1.1", 0, 143)],
        [("exited", "1.1", 0, 143, True)]),
    "a clean exit is never fenced": (
        run(A) + [E.Fence(True), exited("c1/1.1", 0, 0)],
        [("exited", "1.1", 0, 0, False)]),
    "an exit after the lease is held again is the job's own": (
        run(A) + [E.Fence(True), E.Fence(False), exited("c1/1.1", 0, 1)],
        [("exited", "1.1", 0, 1, False)]),
    "another cluster's scheduler: the old workers are stopped": (
        run(A) + [welcomed("c2")], [("signal", "c1/1.1", 0, "SIGTERM")]),
    "another cluster's exits are not reported to the new one": (
        run(A) + [welcomed("c2"), exited("c1/1.1", 0, 143)], []),
}


def test_workers_stopped_for_another_cluster_are_reported_fenced_to_their_own():
    """A scheduler started on a wrong state file (a new cluster) stops this node's placements; once the right one is
    back, they show as fenced in the status it reads, so it requeues those jobs instead of failing them (exit 143)."""
    c = core()
    for e in run(A) + [welcomed("c2"), exited("c1/1.1", 0, 143), welcomed("c1")]:
        c.handle(e, 1000.0)
    [w] = c.status()
    assert (w.placement_id, w.exit_code, w.fenced) == ("1.1", 143, True)


@pytest.mark.parametrize("case", list(CASES))
def test_placement_core(case):
    events, want = CASES[case]
    c = core()
    for e in events[:-1]:
        c.handle(e, 1000.0)
    assert shown(c.handle(events[-1], 1000.0)) == want


def test_kill_deadline_and_forgetting_ended_placements():
    c = core()
    for e in run(A) + [stop("1.1", "1", 5.0, "c1")]:
        c.handle(e, 1000.0)
    assert shown(c.handle(E.WallTick(1004.9), 1.0)) == []
    assert shown(c.handle(E.WallTick(1005.0), 1.0)) == [("signal", "c1/1.1", 0, "SIGKILL")]
    assert shown(c.handle(E.WallTick(1006.0), 1.0)) == []  # once
    c.handle(E.Exited("c1/1.1", 0, 137, wall=1006.0), 1.0)
    assert [w.running for w in c.status()] == [False]
    c.handle(E.WallTick(1306.1), 1.0)  # 300 s after it ended: only its id is remembered
    assert c.status() == [] and c.table.known("c1/1.1")
    assert shown(c.handle(E.Start(A), 1307.0)) == []


def test_a_settled_placement_is_forgotten_at_once_once_it_has_ended():
    c = core()
    two = start("2.1", "2", gpus=(1,))
    for e in run(A) + run(two):
        c.handle(e, 1000.0)
    assert c.handle(E.Settled(("1.1",), "c1"), 1000.0) == []  # still running: kept
    c.handle(exited("c1/1.1", 0, 0), 1001.0)
    c.handle(E.Exited("c1/2.1", 0, 0, wall=1001.0), 1001.0)
    assert c.handle(E.Settled(("1.1", "2.1"), "c2"), 1001.0) == []  # another cluster's word: nothing
    assert [type(x).__name__ for x in c.handle(E.Settled(("1.1",), "c1"), 1001.0)] == ["Save"]
    assert [w.placement_id for w in c.status()] == ["2.1"] and c.table.known("c1/1.1")
    assert shown(c.handle(E.Start(A), 1002.0)) == []  # its id is remembered: it never starts again


def test_events_before_the_first_welcome_wait_for_it_and_only_the_welcoming_clusters_go():
    c = core(cluster=None)  # a node with a scheduler link: the table's cluster is unknown until welcomed
    for e in run(A) + run(start("9.1", "9", gpus=(1,), cluster="c2")):
        c.handle(e, 1000.0)  # (restored from the table in real life)
    assert shown(c.handle(exited("c1/1.1", 0, 0), 1001.0)) == []  # held
    assert [w.placement_id for w in c.status()] == ["1.1", "9.1"]
    out = shown(c.handle(welcomed("c2"), 1002.0))
    assert ("worker_started", "9.1", 0) in out and ("exited", "1.1", 0, 0, False) not in out
    assert not any(o[0] == "worker_started" and o[1] == "1.1" for o in out)
    assert [w.placement_id for w in c.status()] == ["9.1"]


def test_a_promotion_lasts_while_its_placement_runs_and_holds_again_after_a_restart():
    c = core()
    for e in run(A) + [E.Promoted("1.1", "c1")] + run(start("2.1", "2", gpus=(1,))):
        c.handle(e, 1000.0)
    assert c.promoted == {"1"}
    again = core()  # a new node process on the same table
    again.take_placements("n1", c.table, cluster="c1")
    again.handle(E.Recovered(), 1001.0)
    assert again.promoted == {"1"}
    c.handle(run(start("1.2", "1", gpus=(1,)))[0], 1002.0)
    assert c.promoted == {"1"}  # refused (GPU 1 is placement 2.1's): nothing changes
    c.handle(exited("c1/1.1", 0, 0), 1003.0)
    assert c.promoted == set()  # its placement ended
    c.handle(E.Promoted("1.1", "c1"), 1004.0)
    assert c.promoted == set()  # an ended placement is not promoted


CLAIMS = [  # (claims, gpus, owner, share, the conflicting claim's owner or None)
    ([], [0], "a", 1.0, None),
    ([Claim(0, "b")], [0], "a", 1.0, "b"),
    ([Claim(0, "b")], [1], "a", 1.0, None),
    ([Claim(0, "a")], [0], "a", 1.0, None),  # its own claim does not count
    ([Claim(1, "b"), Claim(0, "c")], [0, 1], "a", 1.0, "c"),  # the lowest GPU first
    ([Claim(0, "b", 0.5)], [0], "a", 0.5, None),  # partitions: fractions summing to <= 1
    ([Claim(0, "b", 0.5), Claim(0, "c", 0.3)], [0], "a", 0.3, "b"),
]


@pytest.mark.parametrize("claims, gpus, owner, share, want", CLAIMS)
def test_guaranteed_shares_per_gpu_sum_to_at_most_one(claims, gpus, owner, share, want):
    held = conflict(claims, gpus, owner, share)
    assert (held.owner if held else None) == want


@pytest.mark.parametrize("reason, code, oom", [
    (P.GOODBYE_OOM, 1, True),  # said it ran out of memory, and failed: reported so
    (P.GOODBYE_OOM, 0, False),  # said so but exited 0 (caught it): its own business
    ("exit", 1, False),  # an ordinary failure
])
def test_a_worker_that_said_it_ran_out_of_memory_is_reported_so(reason, code, oom):
    c = core()
    for e in run(A):
        c.handle(e, 1000.0)
    c.handle(P.Register(job_id="1", pid=100, gpu=0, priority="guaranteed", mem_request=None, sm_share=1.0,
                        mem_cap=1 << 30, epoch=1), 1000.0)
    c.handle(P.Goodbye(job_id="1", exit_code=None, reason=reason), 1000.0)
    out = c.handle(exited("c1/1.1", 0, code), 1000.0)
    (msg,) = [cmd.msg for cmd in out if isinstance(cmd, Report) and isinstance(cmd.msg, P.WorkerExited)]
    assert (msg.exit_code, msg.oom) == (code, oom)
    assert [w.oom for w in c.status()] == [oom]
    assert not c._oom  # nothing kept after the exit


def test_an_opportunistic_placement_paused_on_memory_the_guaranteed_job_needs_is_stopped_and_reported_reclaimed():
    c = core()
    o = start("9.1", "9", priority="opportunistic")
    for e in run(o):
        c.handle(e, 1.0)
    g = c.jobs  # the workers registered with the node: a guaranteed one by hand, the placement's opportunistic one
    c.handle(P.Register(job_id="g", pid=11, gpu=0, priority="guaranteed", mem_request=None, sm_share=1.0,
                        mem_cap=1 << 30, epoch=1, sm_request=1.0), 1.0)
    c.handle(P.Register(job_id="9", pid=100, gpu=0, priority="opportunistic", mem_request=None, sm_share=1.0,
                        mem_cap=1 << 30, epoch=1, sm_request=1.0), 1.0)
    g["9"].reclaim_since = 2.0  # what the adaptive policy marks (tests/colocate/node/test_core.py)
    assert shown(c.handle(E.WallTick(1000.0), 6.9)) == []  # reclaim_after_s: 5 s
    assert shown(c.handle(E.WallTick(1000.0), 7.0)) == [("signal", "c1/9.1", 0, "SIGTERM")]
    assert shown(c.handle(E.WallTick(1001.0), 8.0)) == []  # once
    assert shown(c.handle(E.WallTick(1010.0), 9.0)) == [("signal", "c1/9.1", 0, "SIGKILL")]  # reclaim_grace_s: 10 s
    (rep,) = [m.msg for m in c.handle(E.Exited("c1/9.1", 0, 143, wall=1010.1), 9.0) if isinstance(m, Report)]
    assert isinstance(rep, P.WorkerExited) and rep.reclaimed and not rep.fenced and rep.exit_code == 143
    assert [w.reclaimed for w in c.status()] == [True]


def test_a_worker_started_by_hand_is_never_stopped_by_a_reclaim_only_said_once():
    c = core()
    c.handle(P.Register(job_id="h", pid=12, gpu=0, priority="opportunistic", mem_request=None, sm_share=1.0,
                        mem_cap=1 << 30, epoch=1, sm_request=1.0), 1.0)
    c.jobs["h"].reclaim_since = 1.0
    first = c.handle(E.WallTick(1000.0), 7.0)
    assert shown(first) == [] and any("started by hand" in getattr(n, "text", "") for n in first)
    assert c.handle(E.WallTick(1001.0), 8.0) == []


def test_a_paused_worker_whose_placement_is_stopped_resumes_to_act_on_the_signal():
    """A job paused (share 0) waits at its boundary: its SIGTERM handler (a checkpoint) would run only at the
    SIGKILL. The stop resumes it."""
    from colocate.node.commands import Send

    c = core()
    o = start("9.1", "9", priority="opportunistic")
    for e in run(o):
        c.handle(e, 1.0)
    c.handle(P.Register(job_id="9", pid=100, gpu=0, priority="opportunistic", mem_request=None, sm_share=1.0,
                        mem_cap=1 << 30, epoch=1, sm_request=1.0), 1.0)
    c.handle(P.CtlSet(job_id="9", sm_share=0.0), 1.0)  # paused (the policy pauses the same way)
    assert c.jobs["9"].limits.sm_share == 0.0
    out = c.handle(stop("9.1", "9", 5.0, "c1"), 2.0)
    assert shown(out) == [("signal", "c1/9.1", 0, "SIGTERM")]
    (lim,) = [m.msg.limits for m in out if isinstance(m, Send)]
    assert lim.sm_share == 1.0 and c.jobs["9"].limits.sm_share == 1.0
    assert [m for m in c.handle(stop("9.1", "9", 1.0, "c1"), 3.0) if isinstance(m, Send)] == []  # once
