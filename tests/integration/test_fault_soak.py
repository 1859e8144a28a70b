"""The fault soak, short: ``benchmarks/fault_soak.py``'s cluster (a scheduler, three nodes with simulated
GPUs, CURVE keys, jobs of 6 s from ``colocate submit``) under 20 faults drawn by a seeded ``random.Random``
(kill -9 of the scheduler; kill -9, SIGSTOP for 2-10 s, SIGTERM of a node; kill -9 of a worker), then
drained. Counted from the progress file and the journal: no job lost, none finished twice, never two
copies of a job progressing at once, never a GPU holding two guaranteed jobs at once."""

from __future__ import annotations

import sys

import pytest

from tests.support import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import _soak as S


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_twenty_faults_lose_no_job_and_never_run_one_twice(tmp_path):
    cfg = S.SoakConfig(faults=20, every_s=2.0, submit_every_s=1.2, steps=60, stop_s=(2.0, 10.0),
                       restart_s=(0.5, 6.0), drain_s=90.0, seed=13)
    out = S.run_soak(tmp_path, cfg, say=print)
    rep = out.report
    summary = (f"faults {out.faults}; jobs {rep.jobs} acknowledged of {out.submitted}, {rep.finished} finished, "
               f"states {rep.ended}, failed because {out.reasons}; lost {rep.lost}, finished twice "
               f"{rep.finished_twice} (redone without work {rep.redone}), two copies {rep.two_copies}, "
               f"GPU double {rep.gpu_double}")
    print(summary)
    assert sum(out.faults.values()) == 20 and sum(1 for n in out.faults.values() if n) >= 3, summary
    assert out.drained, summary
    assert rep.jobs >= 10 and rep.finished >= 5, summary
    assert out.bad_lines == 0, summary
    assert rep.violations == {"lost": 0, "finished twice": 0, "two copies progressed": 0,
                              "GPU with two guaranteed jobs": 0}, summary
