"""colocate/cli/_tables.py: how a job's prediction reads in ``colocate queue`` and ``colocate status``."""

from __future__ import annotations

import pytest

from colocate import protocol as P
from colocate.cli._tables import prediction_cell, prediction_line


@pytest.mark.parametrize("pred, cell, line", [
    (None, "-", None),
    (P.PredictionView(p50_s=300.0, p90_s=540.0, level="family", history=4), "5:00..9:00 [family 4]",
     "p50 5:00, p90 9:00 run time, from 4 ended run(s) at history level family"),
    (P.PredictionView(p50_s=150.0, p90_s=300.0, level="progress", history=100, remaining=True),
     "2:30..5:00 left [progress 100]",
     "p50 2:30, p90 5:00 left, from its progress (100 iterations done) and its recent time per iteration"),
    (P.PredictionView(p50_s=60.0, p90_s=60.0, level="default", history=0), "1:00..1:00 [default 0]",
     "p50 1:00, p90 1:00 run time, the policy's default (no history)"),
])
def test_prediction_cell_and_line(pred, cell, line):
    assert prediction_cell(pred) == cell
    if line is not None:
        assert prediction_line(pred) == line


def test_a_learning_job_is_marked():
    assert prediction_cell(None, learning=True) == "- learning"
    pred = P.PredictionView(p50_s=60.0, p90_s=60.0, level="user", history=2)
    assert prediction_cell(pred, learning=True) == "1:00..1:00 [user 2] learning"
