"""One node core for jobs and placements (issue 23): exclusivity and promotion see one truth.

A worker registered by hand (``colocate run --node``) and a placement the scheduler starts are two ways onto one
GPU; the node core holds both, so a guaranteed placement on a GPU a hand-started guaranteed worker holds is refused
at once (not launched, then refused when its worker registers), the other way round too, and a promotion changes
the placed job's workers' limits in the same ``handle`` call, with nothing outside the core relaying it.
Pure: no processes, no files, no sockets.
"""

from __future__ import annotations

import pytest

from colocate import protocol as P
from colocate.gpus import GpuSpec
from colocate.node import events as E
from colocate.node.commands import Launch, Note, Reply, Report, Send
from colocate.node.config import NodeConfig
from colocate.node.core import NodeCore
from colocate.node.table import PlacementTable, Worker

GiB = 1 << 30
REQ = P.JobRequest(command=("python", "x.py"), cwd="/", env=())
G, O = "guaranteed", "opportunistic"


def node() -> NodeCore:
    c = NodeCore([GpuSpec(index=i, kind="sim", mem_total=16 * GiB) for i in range(2)], NodeConfig(policy="exclusive"),
                 node_epoch=7)
    c.take_placements("n1", PlacementTable())
    return c


def placement(pid: str, job: str, gpu: int = 0, priority: str = G) -> P.StartPlacement:
    return P.StartPlacement(placement_id=pid, job_id=job, priority=priority, request=REQ,
                            workers=(P.WorkerLaunch(0, 0, (gpu,)),), world_size=1, group_rank=0,
                            master_addr="127.0.0.1", master_port=0)


def register(job_id: str, gpu: int = 0, priority: str = G, pid: int = 500, share: float = 1.0,
             partition: bool = False) -> P.Register:
    return P.Register(job_id=job_id, pid=pid, gpu=gpu, priority=priority, mem_request=8 * GiB if partition else None,
                      sm_share=share, mem_cap=16 * GiB, epoch=1, token="t", sm_request=share, partition=partition)


def launched(msg: P.StartPlacement) -> E.Launched:
    return E.Launched(msg, tuple(Worker(rank=w.rank, local_rank=w.local_rank, gpus=list(w.gpus), pid=900 + w.rank,
                                        create_time=1.0, log_path="/l", exit_file="/e") for w in msg.workers))


def outcome(cmds) -> str:
    """What the last event did, in one word or line: launch, welcome, ``refused: REASON``, ``rejected: REASON``."""
    for c in cmds:
        if isinstance(c, Launch):
            return "launch"
        if isinstance(c, Report) and isinstance(c.msg, P.StartRefused):
            return f"refused: {c.msg.reason}"
        if isinstance(c, Send) and isinstance(c.msg, P.Welcome):
            return "welcome"
        if isinstance(c, Reply) and isinstance(c.msg, P.Error):
            return f"rejected: {c.msg.message}"
    return f"nothing: {cmds!r}"


A = placement("1.1", "placed")
CASES = {  # a sequence of events, and what the last one must do
    "a hand-started guaranteed worker holds its GPU: a guaranteed placement there is refused at once": (
        [register("hand"), E.Start(placement("1.1", "placed"))],
        "refused: GPU 0 already runs guaranteed job hand (worker hand, pid 500, registered with this node)"),
    "a hand-started partition claims part of its GPU: a whole-GPU guaranteed placement is refused": (
        [register("half", share=0.5, partition=True), E.Start(A)],
        "refused: GPU 0 already runs guaranteed job half (worker half, pid 500, registered with this node)"),
    "a hand-started opportunistic worker holds nothing": ([register("hand", priority=O), E.Start(A)], "launch"),
    "a hand-started guaranteed worker on another GPU": ([register("hand", gpu=1), E.Start(A)], "launch"),
    "an opportunistic placement beside a hand-started guaranteed worker": (
        [register("hand"), E.Start(placement("2.1", "opp", priority=O))], "launch"),
    "a launched guaranteed placement holds its GPU before its worker registers": (
        [E.Start(A), launched(A), register("hand")], "rejected: GPU 0 already runs guaranteed job placed"),
    "the placement's own worker registers on its GPU": ([E.Start(A), launched(A), register("placed")], "welcome"),
    "a placement that ended holds nothing": (
        [E.Start(A), launched(A), E.Exited("1.1", 0, 0, wall=1.0), register("hand")], "welcome"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_truth_about_a_gpu(case):
    events, want = CASES[case]
    c = node()
    for e in events[:-1]:
        c.handle(e, 1.0)
    assert outcome(c.handle(events[-1], 1.0)) == want


def test_the_refusal_of_a_placement_on_a_hand_started_guaranteed_gpu_is_remembered():
    c = node()
    c.handle(register("hand"), 1.0)
    first = c.handle(E.Start(A), 1.0)
    c.handle(P.Goodbye(job_id="hand", exit_code=0, reason="done"), 2.0)
    assert outcome(first).startswith("refused: ") and outcome(c.handle(E.Start(A), 3.0)) == outcome(first)
    assert not any(isinstance(x, Launch) for x in c.handle(E.Start(A), 3.0))  # refused once, refused for good


def test_a_promotion_changes_the_workers_limits_inside_the_core():
    """``Promoted`` of a placement makes its job's registered workers guaranteed and sends the changed limits, in
    the one ``handle`` call: no edge relays it to another core."""
    c = node()  # exclusive: an opportunistic worker runs only while no guaranteed one is on its GPU
    opp = placement("3.1", "j", priority=O)
    for e in (E.Start(opp), launched(opp), register("j", priority=O, pid=11), register("o", priority=O, pid=12)):
        c.handle(e, 1.0)
    assert not c.jobs["j"].guaranteed and c.jobs["o"].limits.sm_share > 0
    out = c.handle(E.Promoted("3.1"), 2.0)
    assert c.jobs["j"].guaranteed
    sent = {cmd.job_id: cmd.msg.limits for cmd in out if isinstance(cmd, Send) and isinstance(cmd.msg, P.SetLimits)}
    assert sent["o"].sm_share == 0.0  # the policy treats j as the GPU's guaranteed job at once
    assert outcome(c.handle(E.Start(placement("4.1", "k", gpu=0)), 2.0)).startswith("refused: GPU 0 already runs")


def test_a_promoted_worker_held_back_by_another_guaranteed_one_is_guaranteed_once_that_one_leaves():
    """Promoted while a hand-started guaranteed worker holds its GPU, a placed worker stays opportunistic (said
    once); the first tick after that worker left makes it guaranteed: the GPU is then its to hold."""
    c = node()
    opp = placement("3.1", "j", priority=O)
    for e in (register("hand", pid=10), E.Start(opp), launched(opp), register("j", priority=O, pid=11)):
        c.handle(e, 1.0)
    out = c.handle(E.Promoted("3.1"), 2.0)
    assert not c.jobs["j"].guaranteed
    assert "j stays opportunistic until guaranteed job hand leaves GPU 0" in [x.text for x in out if isinstance(x, Note)]
    out = c.handle(E.NodeTick(), 2.5)
    assert not c.jobs["j"].guaranteed and not any(isinstance(x, Note) for x in out)  # said once, not every tick
    c.handle(P.Goodbye(job_id="hand", exit_code=0, reason="done"), 3.0)
    out = c.handle(E.NodeTick(), 3.1)
    assert c.jobs["j"].guaranteed
    assert "j of promoted job j is guaranteed now" in [x.text for x in out if isinstance(x, Note)]
    assert c.jobs["j"].limits.sm_share == 1.0
    assert outcome(c.handle(E.Start(placement("4.1", "k", gpu=0)), 3.2)).startswith("refused: GPU 0 already runs")
