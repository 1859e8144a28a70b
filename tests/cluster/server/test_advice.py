"""cluster/server/advice.py and cluster/server/requests.py: recommendations from the journal's history, submits
that leave their memory and share to them, the out-of-memory restart under a recommended cap, and learning jobs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cluster.predict.history import Exit
from cluster.predict.recommend import MIB
from colocate import protocol as P
from tests.cluster.server.helpers import CLIENT, FakeNode, Harness, replies
from tests.colocate.test_protocol import PROGRESS

GIB = 1 << 30
COMMAND = ("python", "train.py", "--batch-size", "32")
HASH = "ab" * 32


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path / "s.db", policy="backfill")


def submit(h, command=COMMAND, **kw):
    req = P.JobRequest(command=command, cwd="/tmp", env=(("PATH", "/bin"),), script_hash=HASH, gpus=1, **kw)
    out = h.send(CLIENT, P.Submit(request=req))
    (ack,) = replies(out, P.Submitted)
    return ack.job_id


def run_to_end(h, n, job_id, peak, busy=0.3, wall=100.0, code=0, oom=False):
    """Start ``job_id``'s placement on ``n``, report its progress, end it."""
    n.start_all()
    pid = [m for m in n.inbox(P.StartPlacement) if m.job_id == job_id][-1].placement_id
    n.status(progress=(dataclasses.replace(PROGRESS, job_id=job_id, mem_reserved_peak=peak, busy_fraction=busy,
                                           features=None, since_report_s=0.0),))
    h.now += wall
    h.send(n.ident, P.WorkerExited(node_id=n.node_id, epoch=n.epoch, job_id=job_id, placement_id=pid, rank=0,
                                   exit_code=code, oom=oom))
    n.workers.pop((pid, 0), None)
    return pid


def recommend(h, **kw):
    (reply,) = replies(h.send(CLIENT, P.RecommendRequest(**kw)), P.RecommendReply)
    return reply.recommendation


def test_a_recommendation_from_history_and_why_a_figure_is_missing(h):
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    first = recommend(h, command=COMMAND, script_hash=HASH)
    assert first.gpu_mem is None and set(dict(first.why_not)) == {"gpu_mem", "sm_share", "gpus", "gpu_type",
                                                                   "run_time"}
    job = submit(h)
    run_to_end(h, n, job, peak=500 * MIB, busy=0.44)
    rec = recommend(h, command=COMMAND, script_hash=HASH)
    assert rec.exact == h.svc.core.job(job).spec.fingerprint and rec.identity == "content"
    assert (rec.gpu_mem.value, rec.gpu_mem.level, rec.gpu_mem.history) == (600 * MIB, "exact", 1)
    assert rec.sm_share.value == pytest.approx(0.40) and rec.sm_share.level == "exact"
    assert rec.gpu_type.label == "sim" and rec.run_time.p50_s == pytest.approx(100.0)
    assert "gpus" in dict(rec.why_not) and dict(rec.why_not)["gpus"].startswith("runs at one GPU count only")
    assert recommend(h, job_id=job) == rec  # a job: as it was submitted
    sweep = recommend(h, command=("python", "train.py", "--batch-size", "16"), script_hash=HASH)
    assert sweep.gpu_mem.level == "family" and sweep.gpu_mem.value <= 600 * MIB  # a smaller batch of the family
    (err,) = replies(h.send(CLIENT, P.RecommendRequest(job_id="nope")), P.Error)
    assert err.code == P.NOT_FOUND


def test_auto_without_history_runs_as_requested_and_is_learning(h):
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    job = submit(h, auto=("gpu_mem", "sm_share"))
    spec = h.svc.core.job(job).spec
    assert spec.gpu_mem == 0 and spec.mem_fallback is None
    (reply,) = replies(h.send(CLIENT, P.JobsRequest(job_id=job)), P.JobsReply)
    view = reply.jobs[0]
    assert view.learning and "learning" in view.advice and "gpu-mem" in view.advice
    (start,) = n.inbox(P.StartPlacement)
    assert (start.request.gpu_mem, start.request.sm_share, start.request.auto, start.cap_recommended) == (
        0, None, (), False)


def test_auto_with_history_places_on_the_recommendation_and_restarts_out_of_memory_at_the_whole_gpu(h):
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    run_to_end(h, n, submit(h), peak=500 * MIB, busy=0.44)
    job = submit(h, auto=("gpu_mem", "sm_share"))
    spec = h.svc.core.job(job).spec
    assert (spec.gpu_mem, spec.mem_fallback) == (600 * MIB, 0)
    n.start_all()
    start = [m for m in n.inbox(P.StartPlacement) if m.job_id == job][-1]
    assert (start.request.gpu_mem, start.cap_recommended) == (600 * MIB, True)
    assert start.request.sm_share == pytest.approx(0.40)
    (reply,) = replies(h.send(CLIENT, P.JobsRequest(job_id=job)), P.JobsReply)
    assert not reply.jobs[0].learning and "gpu-mem 600.0 MiB (exact, 1 run(s))" in reply.jobs[0].advice
    n.workers.clear()
    run_to_end(h, n, job, peak=590 * MIB, code=1, oom=True)  # out of memory under its recommended cap
    j = h.svc.core.job(job)
    assert j.state in ("pending", "placing") and j.failed_starts == 0 and j.spec.gpu_mem == 0
    assert h.svc.journal.oom_restarts() == 1
    (oom_rec,) = h.journal.history_of_job(job)
    assert (oom_rec.exit, oom_rec.mem_cap, oom_rec.recommended) == (Exit.OOM, 600 * MIB, True)
    restarted = [m for m in n.inbox(P.StartPlacement) if m.job_id == job][-1]
    assert (restarted.request.gpu_mem, restarted.cap_recommended) == (0, False)  # the whole GPU now
    h.restart()  # journaled: the restart survives the scheduler's
    assert json.loads(h.journal.job(job)["spec"])["gpu_mem"] == 0 and h.svc.core.job(job).spec.mem_fallback is None


def test_the_site_default_leaves_unstated_resources_to_the_recommendation(tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('plugins = ["fifo", "gang", "binpack"]\n[scheduler]\nauto = ["gpu_mem"]\n')
    h = Harness(tmp_path / "s.db", policy=str(policy))
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    run_to_end(h, n, submit(h), peak=100 * MIB)
    assert h.svc.core.job(submit(h)).spec.gpu_mem == 120 * MIB  # stated nothing: the site's auto
    assert h.svc.core.job(submit(h, gpu_mem=2 * GIB)).spec.gpu_mem == 2 * GIB  # stated: its own


def test_an_opportunistic_job_starts_at_its_recommendation_free_to_grow(tmp_path):
    h = Harness(tmp_path / "s.db", policy="antman")
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    run_to_end(h, n, submit(h), peak=500 * MIB, busy=0.44)
    job = submit(h, auto=("gpu_mem", "sm_share"), priority="opportunistic")
    spec = h.svc.core.job(job).spec
    assert (spec.gpu_mem, spec.mem_fallback) == (600 * MIB, None)
    (start,) = [m for m in n.inbox(P.StartPlacement) if m.job_id == job]
    assert (start.request.gpu_mem, start.request.sm_share, start.start_mem, start.cap_recommended) == (
        0, None, 600 * MIB, False)
    assert start.start_share == pytest.approx(0.40)


def test_a_small_gpu_beside_the_others_does_not_cut_the_recommended_cap(h):
    """The cap is the job's need (600 MiB here), placed on a GPU that holds it: a 64 MiB GPU that joins does not
    cut it to 64 MiB (a sure out-of-memory restart); only a need beyond the largest GPU is cut to that GPU."""
    n = FakeNode(h, "n1", gpus=2)
    n.hello()
    job = submit(h)
    run_to_end(h, n, job, peak=500 * MIB)
    tiny = FakeNode(h, "tiny", gpus=1)
    small = (P.NodeGpu(index=0, model="sim", mem_total=64 * MIB),)
    h.send(tiny.ident, P.NodeHello(node_id="tiny", epoch=1, host="127.0.0.1", gpus=small))
    tiny.status()  # joins the core
    assert h.svc.core.state.nodes["tiny"].spec.gpu_mem == 64 * MIB
    assert recommend(h, command=COMMAND, script_hash=HASH).gpu_mem.value == 600 * MIB
    auto = submit(h, auto=("gpu_mem",))
    assert h.svc.core.job(auto).spec.gpu_mem == 600 * MIB
    big = submit(h, command=("python", "train.py", "--batch-size", "4096"))
    on = next(node for node in (n, tiny) if any(m.job_id == big for m in node.inbox(P.StartPlacement)))
    run_to_end(h, on, big, peak=20 * GIB)
    # that run needs more than any GPU holds: its cap is cut to the largest GPU, 16 GiB
    rec = recommend(h, command=("python", "train.py", "--batch-size", "4096"), script_hash=HASH)
    assert rec.gpu_mem.value == 16 * GIB


def test_a_job_that_succeeds_after_its_out_of_memory_restart_shows_exit_code_0(h):
    """``colocate status JOB`` after the restart at the whole GPU: the last run's code (0), not the first's (1)."""
    n = FakeNode(h, "n1", gpus=1)
    n.hello()
    run_to_end(h, n, submit(h), peak=500 * MIB)
    job = submit(h, auto=("gpu_mem",))
    run_to_end(h, n, job, peak=590 * MIB, code=1, oom=True)  # out of memory under its recommended cap: restarted
    assert h.journal.job(job)["exit_code"] is None
    run_to_end(h, n, job, peak=590 * MIB, code=0)
    (reply,) = replies(h.send(CLIENT, P.JobsRequest(job_id=job)), P.JobsReply)
    view = reply.jobs[0]
    assert (view.state, view.attempts, view.exit_code) == ("succeeded", 2, 0)
