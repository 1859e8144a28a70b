"""``colocate submit --iterations/--epochs`` and the jobs file's ``iterations``/``epochs``: the job's total as its
submitter says it, carried by the ``JobRequest`` (no scheduler needed: the request is checked before sending); and
its other request fields that need no scheduler to check: resources, ``auto`` and the GPU model."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from colocate.cli import build_parser
from colocate.cli.submit import _entry


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return str(path)


def args(**kw):
    base = dict(gpus=1, workers=1, gpu_mem=0, priority="guaranteed", queue="", name="", estimate=None,
                iterations=None, epochs=None, sm_share=None, gpu_model="")
    return argparse.Namespace(**{**base, **kw})


def test_a_line_carries_its_hints_and_the_options_fill_in(script):
    """A line's total (iterations or epochs) replaces the options' total; a line without one takes the options'."""
    line = json.dumps({"command": [sys.executable, script], "iterations": 500})
    req = _entry(line, args(epochs=3), {})
    assert (req.iterations, req.epochs) == (500, None)
    req = _entry(json.dumps({"command": [sys.executable, script]}), args(epochs=3), {})
    assert (req.iterations, req.epochs) == (None, 3)
    assert _entry(json.dumps({"command": [sys.executable, script]}), args(), {}).iterations is None


def test_iterations_and_epochs_together_are_refused(script, capsys):
    from tests.colocate.cli.test_bad_input import cli

    with pytest.raises(ValueError, match="not both"):
        _entry(json.dumps({"command": [sys.executable, script], "iterations": 5, "epochs": 2}), args(), {})
    rc, _, err = cli(capsys, "submit", "--gpus", "1", "--iterations", "5", "--epochs", "2", "--", sys.executable,
                     script)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "--iterations or --epochs, not both" in lines[0], err


@pytest.mark.parametrize("field, value", [("iterations", 0), ("epochs", -2), ("iterations", "10"),
                                          ("epochs", 1.5), ("iterations", True), ("iterations", 1 << 41)])
def test_a_bad_hint_on_a_line_is_one_line(script, field, value):
    with pytest.raises(ValueError) as info:
        _entry(json.dumps({"command": [sys.executable, script], field: value}), args(), {})
    assert field in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("option", ["--iterations", "--epochs"])
@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_bad_options_are_refused_by_the_parser(option, value, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["submit", "--gpus", "1", option, value, "--", "python", "t.py"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert option in err[-1] and "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("options, gpu_mem, sm_share, auto", [
    ([], 0, None, ()),
    (["--gpu-mem", "auto"], 0, None, ("gpu_mem",)),
    (["--gpu-mem", "2GiB", "--sm-share", "auto"], 2 << 30, None, ("sm_share",)),
    (["--gpu-mem", "auto", "--sm-share", "auto"], 0, None, ("gpu_mem", "sm_share")),
    (["--sm-share", "0.5"], 0, 0.5, ()),
])
def test_auto_resources_on_the_command_line(options, gpu_mem, sm_share, auto, script):
    from colocate.cli.submit import resources

    ns = build_parser().parse_args(["submit", "--gpus", "1", *options, "--", sys.executable, script])
    assert resources(ns.gpu_mem, ns.sm_share) == {"gpu_mem": gpu_mem, "sm_share": sm_share, "auto": auto}


@pytest.mark.parametrize("line, gpu_mem, sm_share, auto", [
    ({"gpu_mem": "auto", "sm_share": "auto"}, 0, None, ("gpu_mem", "sm_share")),
    ({"gpu_mem": "1GiB", "sm_share": 0.25}, 1 << 30, 0.25, ()),
])
def test_auto_resources_on_a_line(line, gpu_mem, sm_share, auto, script):
    req = _entry(json.dumps({"command": [sys.executable, script], **line}), args(), {})
    assert (req.gpu_mem, req.sm_share, req.auto) == (gpu_mem, sm_share, auto)
    assert req.script_hash  # the script was read and hashed: its fingerprint's key


@pytest.mark.parametrize("field, value", [("sm_share", 2.0), ("sm_share", "half"), ("sm_share", True),
                                          ("gpu_mem", "lots")])
def test_a_bad_resource_on_a_line_is_one_line(script, field, value):
    with pytest.raises(ValueError) as info:
        _entry(json.dumps({"command": [sys.executable, script], field: value}), args(), {})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value, ok", [("1", False), ("1000000", False), ("1MiB", True), ("0", True), ("8GiB", True)])
def test_a_gpu_memory_below_1_mib_is_refused_as_a_missing_unit(value, ok, capsys):
    argv = ["submit", "--gpus", "1", "--gpu-mem", value, "--", "python", "t.py"]
    if ok:
        assert build_parser().parse_args(argv).gpu_mem in (0, 1 << 20, 8 << 30)
        return
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2 and "below 1 MiB" in capsys.readouterr().err


@pytest.mark.parametrize("option, line, want", [
    ("", {}, ""),
    ("T4", {}, "T4"),
    (" V100 | A100 ", {}, "V100 | A100"),
    ("T4", {"gpu_model": "V100"}, "V100"),  # the line's replaces the option's
    ("T4", {"gpu_model": ""}, ""),
])
def test_the_gpu_model_on_the_command_line_and_on_a_line(option, line, want, script):
    argv = ["submit", "--gpus", "1", *(["--gpu-model", option] if option else []), "--", sys.executable, script]
    ns = build_parser().parse_args(argv)
    req = _entry(json.dumps({"command": [sys.executable, script], **line}), args(gpu_model=ns.gpu_model), {})
    assert req.gpu_model == want


@pytest.mark.parametrize("value", ["T4@0.6", "V100||T4", "|", "x" * 65])
def test_a_bad_gpu_model_is_refused_in_one_line(value, script, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["submit", "--gpus", "1", "--gpu-model", value, "--", "python", "t.py"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and "--gpu-model" in err[-1] and "Traceback" not in "\n".join(err)
    with pytest.raises(ValueError) as bad:
        _entry(json.dumps({"command": [sys.executable, script], "gpu_model": value}), args(), {})
    assert "\n" not in str(bad.value)
    with pytest.raises(ValueError, match="must be a string"):
        _entry(json.dumps({"command": [sys.executable, script], "gpu_model": 4}), args(), {})
