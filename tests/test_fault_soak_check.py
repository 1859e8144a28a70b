"""The fault soak's judge (``benchmarks/_soak_check.py``) on small hand-made records: each of the four
invariants is detected when broken, and a clean run counts 0 of each."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import _soak_check as SC


def run(job, placement, rank, pid, t0, steps=5, node="n0", gpu=0, prio="guaranteed", done=True, dt=0.1):
    """The lines of one worker copy: ``steps`` step lines from ``t0`` every ``dt``, then a done line."""
    out = [SC.Line(SC.STEP, job, placement, rank, node, gpu, prio, pid, i, t0 + i * dt) for i in range(steps)]
    if done:
        out.append(SC.Line(SC.DONE, job, placement, rank, node, gpu, prio, pid, steps, t0 + steps * dt))
    return out


def row(job, state="succeeded", reason="", workers=1, prio="guaranteed"):
    return SC.JobRow(job, state, reason, workers, prio)


def test_a_clean_run_passes():
    lines = (run("1", "1.1", 0, 100, 0.0) + run("1", "1.1", 1, 101, 0.0, gpu=1)  # a gang
             + run("2", "2.1", 0, 102, 0.65)  # the next guaranteed job on GPU 0, after job 1's last line
             + run("3", "3.1", 0, 103, 0.2, prio="opportunistic")  # beside it: opportunistic
             + run("4", "4.1", 0, 104, 0.0, node="n1", done=False)  # killed, failed with a reason
             + run("4", "4.2", 0, 105, 5.0, node="n2", done=False, steps=1))  # a second try after the first died
    rep = SC.check(lines, {"1": 2, "2": 1, "3": 1, "4": 1},
                   {"1": row("1", workers=2), "2": row("2"), "3": row("3", prio="opportunistic"),
                    "4": row("4", "failed", "rank 0 exited with code 137")})
    assert rep.violations == {"lost": 0, "finished twice": 0, "two copies progressed": 0,
                              "GPU with two guaranteed jobs": 0}
    assert rep.passed and rep.finished == 3 and rep.jobs == 4 and rep.ended == {"succeeded": 3, "failed": 1}


def test_lost_jobs_are_counted():
    lines = run("1", "1.1", 0, 100, 0.0, done=False) + run("2", "2.1", 0, 101, 0.0, node="n1", done=False)
    journal = {"1": row("1", "failed", ""),  # ended without a reason
               "2": row("2", "succeeded"),  # "succeeded" without its done line
               "3": row("3", "running"),  # still running after the drain
               "5": row("5", "cancelled", "cancelled by alice")}  # excused
    rep = SC.check(lines, {"1": 1, "2": 1, "3": 1, "4": 1, "5": 1}, journal)  # 4: acknowledged, not journaled
    assert rep.lost == ["1", "2", "3", "4"]
    assert not rep.passed


def test_a_gang_with_one_rank_done_is_not_finished():
    lines = run("1", "1.1", 0, 100, 0.0)
    rep = SC.check(lines, {"1": 2}, {"1": row("1", "succeeded", workers=2)})
    assert rep.lost == ["1"] and rep.finished == 0


def test_a_job_finished_by_two_placements_is_counted():
    lines = run("1", "1.1", 0, 100, 0.0) + run("1", "1.2", 0, 101, 2.0, node="n1")
    rep = SC.check(lines, {"1": 1}, {"1": row("1")})
    assert rep.finished_twice == ["1"]
    assert rep.two_copies == []  # one after the other: not at once


def test_a_placement_that_resumed_at_its_end_and_only_said_done_is_not_a_second_finish():
    # the job ended on a node whose report never arrived; placed again, it resumed at its last step
    lines = run("1", "1.1", 0, 100, 0.0) + run("1", "1.2", 0, 101, 5.0, node="n1", steps=0)
    rep = SC.check(lines, {"1": 1}, {"1": row("1")})
    assert rep.finished_twice == [] and rep.redone == ["1"] and rep.passed


def test_a_gang_rank_done_again_after_its_partner_was_lost_is_not_a_second_finish():
    lines = (run("1", "1.1", 0, 100, 0.0) + run("1", "1.1", 1, 101, 0.0, gpu=1, done=False, steps=2)
             + run("1", "1.2", 0, 102, 3.0, node="n1", steps=0) + run("1", "1.2", 1, 103, 3.0, node="n1", gpu=1))
    rep = SC.check(lines, {"1": 2}, {"1": row("1", workers=2)})
    assert rep.finished_twice == [] and rep.passed


def test_two_copies_of_a_rank_progressing_at_once_are_counted():
    # the first copy kept going on a silent node while the job was placed again elsewhere
    lines = run("7", "7.1", 0, 100, 0.0, steps=30) + run("7", "7.2", 0, 200, 1.0, node="n1", steps=30)
    rep = SC.check(lines, {"7": 1}, {"7": row("7")})
    assert [c[:4] for c in rep.two_copies] == [("7", 0, 100, 200)]
    assert abs(rep.two_copies_s - 2.0) < 1e-6  # 1.0 .. 3.0
    assert rep.finished_twice == ["7"] and not rep.passed


def test_a_copy_that_starts_right_after_the_last_line_of_the_other_is_not_two_copies():
    lines = run("7", "7.1", 0, 100, 0.0, done=False) + run("7", "7.2", 0, 200, 0.45, node="n1")
    rep = SC.check(lines, {"7": 1}, {"7": row("7")})
    assert rep.two_copies == [] and rep.passed


def test_a_gpu_holding_two_guaranteed_jobs_is_counted():
    lines = (run("1", "1.1", 0, 100, 0.0, steps=20, node="n2", gpu=1)
             + run("2", "2.1", 0, 101, 0.5, steps=20, node="n2", gpu=1)  # the same GPU, while job 1 runs
             + run("3", "3.1", 0, 102, 0.5, steps=20, node="n2", gpu=0)  # another GPU: fine
             + run("4", "4.1", 0, 103, 0.5, steps=20, node="n1", gpu=1)  # another node: fine
             + run("5", "5.1", 0, 104, 0.5, steps=20, node="n2", gpu=1, prio="opportunistic"))  # fine
    rep = SC.check(lines, {j: 1 for j in "12345"}, {j: row(j) for j in "12345"})
    assert [g[:6] for g in rep.gpu_double] == [("n2", 1, "1", 100, "2", 101)]
    assert abs(rep.gpu_double_s - 1.5) < 1e-6  # 0.5 .. 2.0
    assert rep.two_copies == [] and not rep.passed


def test_lines_round_trip_and_malformed_ones_are_counted():
    lines = run("12", "12.3", 1, 4242, 1795491719.93, steps=2, node="n0", gpu=1)
    text = "".join(SC.format_line(ln) for ln in lines) + "step 1 garbage\n\nnot a line at all\n"
    parsed, bad = SC.parse(text)
    assert parsed == lines and bad == 2
