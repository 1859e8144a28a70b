"""The node core with multi-worker jobs: torchrun workers register as JOB/RANK on their own GPUs, and a
promotion of the job's placement (``Promoted``, the scheduler's PromotePlacement) makes its workers guaranteed."""
from __future__ import annotations

from colocate import protocol as P
from colocate.gpus import GpuSpec
from colocate.node import events as E
from colocate.node.commands import Note, Reply, Send
from colocate.node.config import NodeConfig
from colocate.node.core import NodeCore
from colocate.node.table import Worker

GiB = 1 << 30


def core(gpus=2, policy="exclusive") -> NodeCore:
    return NodeCore([GpuSpec(index=i, kind="sim", mem_total=16 * GiB) for i in range(gpus)], NodeConfig(policy=policy),
                    node_epoch=7)


def placed(c: NodeCore, job: str, placement: str, gpus=(0, 1), now=1.0) -> None:
    """Placement ``placement`` of ``job`` (opportunistic) starts on ``gpus``: its workers run, not yet registered."""
    msg = P.StartPlacement(placement_id=placement, job_id=job, priority="opportunistic",
                           request=P.JobRequest(command=("python", "x.py"), cwd="/", env=()),
                           workers=tuple(P.WorkerLaunch(r, r, (g,)) for r, g in enumerate(gpus)), world_size=len(gpus),
                           group_rank=0, master_addr="127.0.0.1", master_port=0)
    c.handle(E.Start(msg), now)
    c.handle(E.Launched(msg, tuple(Worker(rank=r, local_rank=r, gpus=[g], pid=900 + r, create_time=1.0, log_path="",
                                          exit_file="") for r, g in enumerate(gpus))), now)


def register(c: NodeCore, worker: str, gpu: int, priority="opportunistic", pid=None, rank=None, world=2, now=1.0):
    return c.handle(P.Register(job_id=worker, pid=pid or 1000 + gpu, gpu=gpu, priority=priority, mem_request=None,
                               sm_share=1.0, mem_cap=16 * GiB, epoch=1, token="t", rank=rank,
                               world_size=world if rank is not None else 1), now)


def welcomed(out, worker) -> P.Limits | None:
    return next((c.msg.limits for c in out if isinstance(c, Send) and c.job_id == worker
                 and isinstance(c.msg, P.Welcome)), None)


def errors(out):
    return [c.msg for c in out if isinstance(c, Reply) and isinstance(c.msg, P.Error)]


def test_two_workers_of_one_job_register_on_their_own_gpus():
    c = core()
    assert welcomed(register(c, "ddp/0", 0, "guaranteed", pid=11, rank=0), "ddp/0")
    assert welcomed(register(c, "ddp/1", 1, "guaranteed", pid=12, rank=1), "ddp/1")  # not "in use by pid 11"
    assert {j.job_id: (j.job, j.rank, j.gpu) for j in c.jobs.values()} == {"ddp/0": ("ddp", 0, 0),
                                                                           "ddp/1": ("ddp", 1, 1)}
    assert [j.job_id for j in c.snapshot(2.0).jobs] == ["ddp/0", "ddp/1"]
    out = register(c, "solo", 0, "opportunistic", pid=13)
    assert c.jobs["solo"].job == "solo" and c.jobs["solo"].rank is None and welcomed(out, "solo")


def test_promotion_makes_registered_and_later_workers_guaranteed():
    c = core()  # exclusive: opportunistic jobs run only while no guaranteed job is on their GPU
    placed(c, "j", "p1")
    register(c, "j/0", 0, rank=0)
    register(c, "o", 0, pid=40)
    register(c, "g", 1, "guaranteed", pid=50)
    assert c.jobs["o"].limits.sm_share > 0 and c.jobs["j/0"].limits.sm_share > 0  # two opportunistic jobs share it
    out = c.handle(E.Promoted("p1"), 2.0)
    assert c.jobs["j/0"].guaranteed and c.jobs["j/0"].klass == "guaranteed"
    sent = {cmd.job_id: cmd.msg.limits for cmd in out if isinstance(cmd, Send)}
    assert sent["o"].sm_share == 0.0  # the policy now treats j/0 as the GPU's guaranteed job
    assert c.snapshot(2.0).jobs[0].priority == "guaranteed"
    # rank 1 starts later, still saying "opportunistic" (its launcher was told so): guaranteed here, unless its GPU
    # holds another guaranteed job
    out = register(c, "j/1", 1, rank=1, pid=60)
    assert welcomed(out, "j/1") and not c.jobs["j/1"].guaranteed
    c2 = core()
    placed(c2, "j", "p1")
    c2.handle(E.Promoted("p1"), 1.0)
    assert welcomed(register(c2, "j/1", 1, rank=1), "j/1").sm_share == 1.0 and c2.jobs["j/1"].guaranteed


def test_a_promotion_never_puts_two_guaranteed_jobs_on_one_gpu():
    c = core(gpus=1)
    register(c, "g", 0, "guaranteed", pid=1)
    placed(c, "j", "p1", gpus=(0,))
    register(c, "j/0", 0, rank=0, pid=2)
    out = c.handle(E.Promoted("p1"), 2.0)
    assert not any(isinstance(x, Send) for x in out)
    assert not c.jobs["j/0"].guaranteed
    assert "j/0 stays opportunistic until guaranteed job g leaves GPU 0" in [x.text for x in out if isinstance(x, Note)]
    assert errors(c.handle(P.Goodbye(job_id="g", exit_code=0, reason="done"), 3.0)) == []


def test_promotion_is_forgotten_by_a_new_placement_of_the_job():
    c = core()
    placed(c, "j", "p1")
    c.handle(E.Promoted("p1"), 1.0)
    placed(c, "j", "p2", gpus=(1,))
    register(c, "j/0", 0, rank=0)
    assert not c.jobs["j/0"].guaranteed and "j" not in c.promoted
    placed(c, "nobody-here", "p3", gpus=(1,))
    assert not any(isinstance(x, Send) for x in c.handle(E.Promoted("p3"), 2.0)) and "nobody-here" in c.promoted
