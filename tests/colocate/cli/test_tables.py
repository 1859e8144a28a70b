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


# ---- what users name is shown as it is, never read as rich markup --------------------------------------------

HOSTILE = "[/x]"  # a closing tag that matches nothing: rich's markup parser raises on it
ANNOTATED = "0:15..0:17 [exact+gpus 3]"  # a bracketed word: rich's markup takes it for a style and drops it


def _printed(headers, rows, title=None) -> str:
    import io

    from rich.console import Console

    from colocate.cli._tables import print_table

    out = Console(file=io.StringIO(), width=300)
    print_table(headers, rows, title=title, out=out)
    return out.file.getvalue()


def test_cells_headers_and_titles_are_shown_literally():
    text = _printed(("JOB", "PREDICTED [level n]"), [(HOSTILE, ANNOTATED), ("[bold]b[/bold]", 3)],
                    title="jobs of [/y]")
    for shown in (HOSTILE, ANNOTATED, "[bold]b[/bold]", "PREDICTED [level n]", "jobs of [/y]"):
        assert shown in text, text


def _job(name: str, prediction=None):
    from colocate.base.vocab import JobClass, JobState

    return P.JobView(job_id="1", name=name, user="ann", queue="default", priority=JobClass.GUARANTEED,
                     state=JobState.PENDING, workers=1, gpus=1, submitted_at=0.0, started_at=None, ended_at=None,
                     reason="[/why]", placement_id="", nodes=(), attempts=0, exit_code=None, prediction=prediction)


class _Client:
    """What ``scheduler_client`` returns, answering from memory."""

    def __init__(self, jobs=(), nodes=()):
        self._jobs, self._nodes = list(jobs), list(nodes)

    def jobs(self, active_only: bool = False):
        return self._jobs, {}

    def nodes(self):
        return P.NodesReply(nodes=tuple(self._nodes), scheduler_epoch=1)


@pytest.mark.parametrize("words", [["status"], ["queue"], ["nodes"]], ids=lambda w: w[0])
def test_status_queue_and_nodes_show_what_users_named_literally(capsys, monkeypatch, words):
    """A job named ``[/x]`` (``submit --name``) or a node of host ``[/x]`` (``node --host``) is a row like any
    other, and a prediction's ``[level n]`` is shown (it was a MarkupError for every user, or dropped)."""
    import importlib

    from colocate.cli import main

    pred = P.PredictionView(p50_s=15.0, p90_s=17.0, level="exact+gpus", history=3)
    node = P.NodeView(node_id="n1", host=HOSTILE, up=True, gpu_model="[red]V100", gpus=1, gpus_allocated=0,
                      gpus_shared=0, utilization=0.0, workers=0)
    client = _Client(jobs=[_job(HOSTILE, pred)], nodes=[node])
    monkeypatch.setattr(importlib.import_module(f"colocate.cli.{words[0]}"), "scheduler_client", lambda args: client)
    rc = main(words)
    out, err = capsys.readouterr()
    assert rc == 0 and err == "", err
    if words[0] == "nodes":
        assert HOSTILE in out and "[red]V100" in out, out
    else:
        assert HOSTILE in out and "0:15..0:17 [exact+gpus 3]" in out, out
