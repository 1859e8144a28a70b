"""colocate/cli/recommend.py: what it prints of a recommendation, the bounds of --gpus and --workers, and the
commands it refuses before asking (those `colocate submit` refuses).

Commands that would ask the scheduler run in-process against an endpoint nobody serves, with a short timeout:
a request that were sent would end in "no answer" (exit 1), so exit 2 proves it was refused before sending."""
from __future__ import annotations

import pytest

from colocate import protocol as P
from colocate.cli.recommend import lines
from tests.colocate.cli.test_bad_input import cli
from tests.support import free_port


def unserved() -> list[str]:
    return ["--scheduler", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.3"]


def error_line(err: str, prog: str) -> str:
    """The one ``colocate PROG: error: ...`` line of ``err`` (argparse prints its usage above it)."""
    assert "Traceback" not in err, err
    found = [line for line in err.splitlines() if line.startswith("colocate ")]
    assert len(found) == 1 and found[0].startswith(f"colocate {prog}: error: "), err
    return found[0].removeprefix(f"colocate {prog}: error: ")


@pytest.mark.parametrize("flag, top", [("--gpus", P.MAX_NODE_GPUS), ("--workers", P.MAX_WORKERS)])
def test_gpus_and_workers_are_bounded_as_the_protocol_bounds_them(capsys, flag, top):
    """Over the bound: one line naming the flag (it was ``colocate ['--', 'python', 'x.py']: error:
    RecommendRequest.gpus: ...``); at it: the request is built and sent (no answer: exit 1)."""
    field = flag.removeprefix("--")
    P.RecommendRequest(command=("true",), **{field: top})  # the protocol's bound is the CLI's
    with pytest.raises(P.ProtocolError):
        P.RecommendRequest(command=("true",), **{field: top + 1})
    for value in (top + 1, 100000, 0):
        rc, _, err = cli(capsys, "recommend", flag, value, *unserved(), "--", "python", "x.py")
        line = error_line(err, "recommend")
        assert rc == 2 and line.startswith(f"argument {flag}: must be a positive integer"), err
        assert "RecommendRequest" not in line
    rc, _, err = cli(capsys, "recommend", flag, top, *unserved(), "--", "true")
    assert rc == 1 and "no answer" in error_line(err, "recommend"), err


@pytest.mark.parametrize("command", [["python", "/nonexistent.py", "--lr", "0.1"], ["/nonexistent/program"],
                                     ["colocate-no-such-program"]], ids=lambda c: c[-1] if len(c) < 3 else c[1])
def test_a_command_submit_refuses_is_refused_alike(capsys, command):
    """It exited 0 with figures of unrelated jobs; now the line `colocate submit` gives, exit 2, nothing sent."""
    rc, _, err = cli(capsys, "submit", "--gpus", "1", *unserved(), "--", *command)
    assert rc == 2
    submitted = error_line(err, "submit")
    rc, _, err = cli(capsys, "recommend", *unserved(), "--", *command)
    assert rc == 2 and error_line(err, "recommend") == submitted
    assert "not found" in submitted


def view(gpu_type=None, why=()) -> P.RecommendationView:
    return P.RecommendationView(exact="e" * 16, family="f" * 16, identity="content", gpu_type=gpu_type,
                                why_not=tuple(why))


def printed(rec: P.RecommendationView) -> dict[str, str]:
    return dict(lines(rec))


def test_a_gpu_types_time_is_per_iteration_or_not_given():
    """The value is seconds per iteration; 0 (the level's runs reported none: the type was chosen by run time) is
    said so, never shown as ms per iteration (it was a whole run's wall time, 7666.4 ms per iteration)."""
    per = P.FigureView(value=0.0123, level="family", history=2, label="V100")
    assert printed(view(per))["gpu type"] == "V100, predicted 12.3 ms per iteration (2 run(s), family level)"
    by_run = P.FigureView(value=0.0, level="family", history=2, label="V100")
    assert printed(view(by_run))["gpu type"] == ("V100, the fastest by run time (no run reported its time per "
                                                  "iteration) (2 run(s), family level)")
    speed = P.FigureView(value=0.0, level="speed", history=0, label="A100")
    assert printed(view(speed))["gpu type"] == "A100 (by the types' declared speeds: no run measured)"


def test_a_missing_gpu_count_says_none_and_why_once():
    """``gpu count: none: WHY`` as every other figure (it was ``gpu count: no: no ended run of ...``)."""
    from cluster.predict.recommend import Params, gpu_count

    _, why = gpu_count([], Params())
    shown = printed(view(why=[("gpus", why)]))["gpu count"]
    assert shown == "none: no ended run of these arguments, a scaling fit needs two or more"


@pytest.mark.parametrize("flag", ["--gpus", "--workers"])
def test_a_job_is_recommended_for_as_submitted_so_its_sizes_are_refused(capsys, flag):
    rc, _, err = cli(capsys, "recommend", "12", flag, "2", *unserved())
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "as it was submitted" in lines[0], err
    rc, _, err = cli(capsys, "recommend", "12", *unserved())
    assert rc == 1 and "no answer" in err  # without them it asks (nobody serves here)
