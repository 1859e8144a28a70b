"""Every command explains itself (``--help``), and hostile input to any command is one line on stderr,
never a traceback: exit 2 for bad input (refused before anything is sent), 1 for a failure.

Client commands run in-process against an endpoint nobody serves, with a short timeout: a request that
were sent would end in "no answer" (exit 1), so exit 2 proves it was refused before sending. Commands that
would start a daemon run as real processes (a hang or a traceback there is seen from outside).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from colocate import protocol as P
from colocate.cli import build_parser, main
from tests.support import child_env, free_port, run_py

LONG_ID = "x" * 200
HUGE = "99999999999999999999"


def every_parser():
    """(words, parser) for the program, each command and each command's actions."""
    def walk(p, words):
        yield words, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*words, name])
    return list(walk(build_parser(), []))


def cli(capsys, *args) -> tuple[int, str, str]:
    """``colocate ARGS`` in-process: (exit code, stdout, stderr); argparse's exits included."""
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str, prog: str) -> str:
    """The one ``colocate PROG...:`` line of ``err`` (argparse may print its usage above it)."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"colocate {prog}")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("words", [w for w, _ in every_parser()], ids=lambda w: " ".join(w) or "colocate")
def test_help_exits_0_and_describes_the_command(capsys, words):
    parser = dict((" ".join(w), p) for w, p in every_parser())[" ".join(words)]
    assert parser.description and len(parser.description.split()) >= 5, f"{words}: no description"
    rc, out, err = cli(capsys, *words, "--help")
    assert rc == 0 and err == ""
    assert out.startswith("usage:") and " ".join(parser.description.split()[:5]) in " ".join(out.split())


def client(*args):
    return [*args, "--scheduler", f"tcp://127.0.0.1:{free_port()}", "--timeout", "0.3"]


@pytest.mark.parametrize("args, fragment", [
    (["status", ""], "an empty job id"),
    (["status", LONG_ID], "at most 128 characters"),
    (["status", "1", "--timeout", "nan"], "--timeout"),
    (["cancel", ""], "an empty job id"),
    (["cancel", "1", LONG_ID], "at most 128 characters"),
    (["logs", ""], "an empty job id"),
    (["logs", LONG_ID], "at most 128 characters"),
    (["logs", "1", "--worker", HUGE], "at most 4095"),
    (["logs", "1", "--worker", "-1"], "--worker"),
    (["logs", "1", "--tail", "nan"], "--tail"),
    (["logs", "1", "--tail", "0"], "--tail"),  # 0 printed the whole log
    (["submit", "--gpus", HUGE, "--", "true"], "JobRequest.gpus"),
    (["submit", "--gpus", "1", "--workers", HUGE, "--", "true"], "JobRequest.workers"),
    (["submit", "--gpus", "1", "--gpu-mem", "nan", "--", "true"], "--gpu-mem"),
    (["submit", "--gpus", "1", "--gpu-mem", "99999999999TiB", "--", "true"], "gpu_mem"),
    (["submit", "--gpus", "1", "--estimate", "nan", "--", "true"], "--estimate"),
    (["submit", "--gpus", "1", "--queue", LONG_ID, "--", "true"], "JobRequest.queue"),
    (["submit", "--gpus", "1", "--name", LONG_ID, "--", "true"], "JobRequest.name"),  # refused, never cut
    (["submit", "--gpus", "1", "--", "/nonexistent/program"], "command not found"),
    (["submit", "--gpus", "1", "--gpu-mem", "autoo", "--", "true"], "--gpu-mem"),
    (["submit", "--gpus", "1", "--sm-share", "0", "--", "true"], "--sm-share"),
    (["recommend", ""], "an empty job id"),
    (["recommend", LONG_ID], "at most 128 characters"),
    (["recommend"], "give a job id, or the command"),
    (["recommend", "--gpus", "0", "--", "true"], "--gpus"),
    (["recommend", "1", "python", "train.py"], "after a job id, only options"),
    (["status", "1", "--scheduler", "not-an-endpoint"], "expected tcp://HOST:PORT"),
    (["status", "1", "--scheduler", "tcp://127.0.0.1:0"], "must be 1..65535"),
    (["nodes", "--scheduler", ""], "an empty endpoint"),
    (["ctl", "--ctl", "tcp://127.0.0.1:99999", "list"], "must be 1..65535"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v)[:40])
def test_bad_client_input_is_one_line_and_exit_2(capsys, args, fragment):
    if "--scheduler" not in args and args[0] != "ctl":  # an endpoint nobody serves, options before "--"
        args = client(*args[:1]) + args[1:] if args[0] != "submit" else client(*args[:-2]) + args[-2:]
    rc, _, err = cli(capsys, *args)
    line = one_line(err, args[0])
    assert rc == 2 and fragment in line, err


@pytest.mark.parametrize("args", [["status", "1"], ["cancel", "1"], ["logs", "1"], ["queue"], ["nodes"],
                                  ["submit", "--gpus", "1", "--", "true"], ["recommend", "1"]], ids=lambda a: a[0])
def test_a_bad_colocate_scheduler_variable_is_one_line_and_exit_2(capsys, monkeypatch, args):
    monkeypatch.setenv("COLOCATE_SCHEDULER", "tcp://127.0.0.1:99999")
    rc, _, err = cli(capsys, *args)
    assert rc == 2 and "COLOCATE_SCHEDULER" in one_line(err, args[0])


@pytest.mark.parametrize("name", ["run", "submit", "recommend"])
def test_a_request_the_protocol_refuses_is_reported_under_the_commands_name(capsys, monkeypatch, name):
    """A command whose own argument is named ``command`` (its command line) does not overwrite the name ``main``
    reports a ``ProtocolError`` under (it was ``colocate ['--', 'true']: error: ...``)."""
    import importlib

    def refused(args):
        return P.RecommendRequest(command=("true",), gpus=100000)  # what a command let through: refused

    monkeypatch.setattr(importlib.import_module(f"colocate.cli.{name}"), "main", refused)
    rc, _, err = cli(capsys, name, "--", "true")
    assert rc == 2 and one_line(err, name).startswith(f"colocate {name}: error: RecommendRequest.gpus"), err


def test_a_scheduler_nobody_serves_is_one_line_and_exit_1(capsys):
    rc, _, err = cli(capsys, *client("status", "1"))
    assert rc == 1 and "no answer" in one_line(err, "status")


@pytest.mark.parametrize("args, fragment", [
    (["--cluster", f"{HUGE}x8"], "at most 100000 nodes"),
    (["--cluster", "2x99999"], "at most 64 GPUs"),
    (["--cluster", "2x8", "--out", "/proc/no/such/dir"], "cannot create it"),
    (["--cluster", "2x8", "--node-gpus", "0"], "--node-gpus"),
    (["--cluster", "2x0"], "no GPUs"),
    (["--cluster", "2x8", "--estimates", "user", "--user-noise", "1e300"], "--user-noise"),
    (["--cluster", "2x8", "--estimates", "user", "--user-factor", "1e308"], "--user-factor"),
])
def test_bad_simulate_input_is_one_line_and_exit_2(capsys, tmp_path, args, fragment):
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_time,duration,num_gpus\nj0,0,100,1\n")
    base = ["simulate", "--trace", trace, "--policy", "fifo", "--quiet", "--no-plots"]
    rc, _, err = cli(capsys, *base, *(args if "--out" in args else [*args, "--out", tmp_path / "out"]))
    assert rc == 2 and fragment in one_line(err, "simulate"), err


def test_a_run_where_every_job_is_dropped_still_plots(capsys, tmp_path):
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_time,duration,num_gpus\nj0,0,100,8\n")
    rc, out, err = cli(capsys, "simulate", "--trace", trace, "--cluster", "2x4", "--node-gpus", "8", "--policy",
                       "fifo", "--quiet", "--out", tmp_path / "out", "--colocation-data", "none")
    assert rc == 0 and "Traceback" not in err and "1 of 1 jobs dropped" in out
    assert (tmp_path / "out" / "cdf.png").exists() and (tmp_path / "out" / "timeline.png").exists()


@pytest.mark.parametrize("args, fragment", [
    (["scheduler", "--state", "", "--bind", "tcp://127.0.0.1:{port}"], "an empty path"),
    (["node", "--device", "sim", "--sim-gpus", HUGE, "--endpoint", "ipc://{tmp}/n.sock"], "at most 64"),
    (["node", "--device", "sim", "--node-id", "", "--scheduler", "tcp://127.0.0.1:{port}"], "an empty node id"),
    (["node", "--device", "sim", "--sim-gpu-mem", "0", "--endpoint", "ipc://{tmp}/n.sock"], "more than 0 bytes"),  # a 0 MiB GPU
    (["scheduler", "--state", "{tmp}/s.db", "--bind", "tcp://127.0.0.1:99999"], "must be 1..65535"),
    (["scheduler", "--state", "{tmp}/s.db", "--bind", "tcp://127.0.0.1:{port}", "--liveness", HUGE], "--liveness"),
])
def test_bad_daemon_options_exit_2_before_starting(tmp_path, args, fragment):
    argv = [a.format(port=free_port(), tmp=tmp_path) for a in args]
    proc = run_py(f"import sys; from colocate.cli import main; sys.exit(main({argv!r}))", timeout=60)
    assert proc.returncode == 2 and fragment in one_line(proc.stderr, argv[0]), proc.stderr


def test_a_reader_that_goes_away_stops_a_command_quietly():
    """``colocate ... | head``: the reader has closed the pipe; the command ends with 141 (128 + SIGPIPE), as a
    shell tool does, and no traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes its first line
    try:
        res = subprocess.run([sys.executable, "-m", "colocate", "env"], stdout=write, stderr=subprocess.PIPE,
                             env=child_env(), timeout=60)
    finally:
        os.close(write)
    assert res.returncode == 141 and b"Traceback" not in res.stderr, res.stderr.decode()


def test_every_choice_a_command_lists_is_what_a_user_types(capsys):
    """argparse lists the choices of a bad value by their repr: a vocabulary's members read as their wire
    strings (they showed as <JobClass.GUARANTEED: 'guaranteed'>)."""
    for words, parser in every_parser():
        for action in parser._actions:
            if action.choices and not isinstance(action, argparse._SubParsersAction):
                shown = ", ".join(map(repr, action.choices))
                assert "<" not in shown, (words, action.option_strings, shown)
    rc, _, err = cli(capsys, "run", "--priority", "bogus", "--", "true")
    assert rc == 2 and "(choose from 'guaranteed', 'opportunistic')" in one_line(err, "run")
