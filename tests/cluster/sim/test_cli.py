"""``colocate simulate`` end to end (in-process) and the workload preparation behind it: outputs,
bad input as one-line errors (exit 2), bad rows counted, estimates, queues and class labels."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest

from cluster.sim import load_workload
from colocate.cli import main
from tests.cluster.sim.helpers import lucid_csv

SUMMARY_KEYS = {"policy", "jobs", "mean_jct_s", "p50_jct_s", "p99_jct_s", "mean_queue_s", "p99_queue_s",
                "makespan_s", "gpu_allocation_rate", "gpu_utilization", "skipped_rows", "sim_wall_s"}


def philly_file(path, n=60, bad=True, seed=2):
    rng = random.Random(seed)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(n):
        g = rng.choice((1, 1, 1, 2, 4, 8, 16))
        d = rng.randrange(60, 7200)
        lines.append(f"2017-10-01 {8 + i // 60:02d}:{i % 60:02d}:00,{d},{g},{d * g},vc{i % 3}")
    if bad:
        lines.append("2017-10-01 12:00:00,soon,1,0,vc1")
    path.write_text("\n".join(lines) + "\n")
    return path


def sim(tmp_path, *extra, trace=None, lucid=True):
    trace = trace or philly_file(tmp_path / "philly.csv")
    args = ["simulate", "--trace", str(trace), "--cluster", "4x8", "--out", str(tmp_path / "out"), "--quiet"]
    if lucid:
        args += ["--colocation-data", str(lucid_csv(tmp_path / "lucid.csv"))]
    return main(args + list(extra))


def test_a_run_writes_every_output(tmp_path, capsys):
    rc = sim(tmp_path, "--policy", "fifo,multi-queue,backfill,antman", "--opportunistic-fraction", "0.3",
             "--estimates", "user")
    out = capsys.readouterr().out
    assert rc == 0 and "simulated policies" in out and "by job class" in out
    d = tmp_path / "out"
    summary = json.loads((d / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["fifo", "multi-queue", "backfill", "antman"]
    for s in summary:
        assert SUMMARY_KEYS <= set(s)
        assert s["skipped_rows"] == {"bad duration": 1} and s["jobs"] == 60
        assert set(s["by_class"]) == {"guaranteed", "opportunistic"}
        assert 0 < s["gpu_utilization"] <= s["gpu_occupancy"] <= 1
        assert (d / f"jobs-{s['policy']}.csv").read_text().count("\n") == 61
    assert "predictor" in summary[2] and summary[2]["predictor"]["predictions"] > 0
    series = (d / "timeline.csv").read_text().splitlines()
    assert series[0] == "policy,t_s,pending_jobs,allocated_gpus,busy_gpus,running_jobs" and len(series) > 8
    for png in ("cdf.png", "timeline.png"):
        assert (d / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--policy", "fifo", "--cluster", "8by8"], "malformed cluster shape"),
    (["--policy", "fifo", "--cluster", "2x4:V100|T4"], "GPU model 'V100|T4' must be 1-64 letters, digits or ._-"),
    (["--policy", "fifo", "--cluster", "2x4:"], "no GPU model after ':'"),
    (["--policy", "fifo", "--cluster", "2x4:V100,2x4:T4"], "groups are joined by +, not by commas"),
    (["--policy", "nosuch"], "unknown policy 'nosuch'"),
    (["--policy", "fifo,fifo"], "given twice"),
    (["--policy", ""], "no policy given"),
    (["--policy", "fifo", "--trace", "/nonexistent/trace.csv"], "cannot"),
    (["--policy", "fifo", "--colocation-data", "/nonexistent.csv"], "cannot read"),
    (["--policy", "fifo", "--nodes", "/nonexistent/nodes.csv"], "cannot"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    trace = philly_file(tmp_path / "philly.csv")
    base = ["simulate", "--trace", str(trace), "--out", str(tmp_path / "out"), "--quiet"]
    if "--cluster" not in args and "--nodes" not in args:
        base += ["--cluster", "2x8"]
    if "--trace" in args:
        base = [a for a in base if a != str(trace)]
        base.remove("--trace")
    rc = main(base + args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["--opportunistic-fraction", "1.5"], ["--seed", "x"], ["--limit", "0"],
                                  ["--estimates", "psychic"], ["--cluster", "2x8", "--nodes", "n.csv"]])
def test_bad_option_values_exit_2(tmp_path, capsys, args):
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--trace", "t.csv", "--out", str(tmp_path), "--policy", "fifo"]
             + (["--cluster", "2x8"] if "--cluster" not in args else []) + args)
    assert e.value.code == 2 and "Traceback" not in capsys.readouterr().err


def test_a_trace_of_bad_rows_only(tmp_path, capsys):
    p = tmp_path / "bad.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 08:00:00,-5,1,0,a\nnot a row\n")
    rc = sim(tmp_path, "--policy", "fifo", trace=p)
    err = capsys.readouterr().err
    assert rc == 2 and "no usable jobs (2 bad rows)" in err


# ---------------------------------------------------------------- workload preparation


def test_estimates_queues_and_labels(tmp_path):
    trace = philly_file(tmp_path / "p.csv", n=400, bad=False)
    base = load_workload(str(trace), cluster="2x8", estimates="predicted", seed=1)
    assert {j.spec.queue for j in base.jobs} == {"default"}
    assert all(j.spec.estimate_s is None for j in base.jobs)
    kept = load_workload(str(trace), cluster="2x8", queues="trace")
    assert {j.spec.queue for j in kept.jobs} == {"vc0", "vc1", "vc2"}
    oracle = load_workload(str(trace), cluster="2x8", estimates="oracle")
    assert all(j.spec.estimate_s == j.duration for j in oracle.jobs)
    user = load_workload(str(trace), cluster="2x8", estimates="user", user_factor=2.0, user_noise=0.5, seed=1)
    ratios = [j.spec.estimate_s / j.duration for j in user.jobs]
    assert 1.6 < statistics.median(ratios) < 2.5 and min(ratios) < 1 < max(ratios)
    again = load_workload(str(trace), cluster="2x8", estimates="user", user_factor=2.0, user_noise=0.5, seed=1)
    assert [j.spec.estimate_s for j in again.jobs] == [j.spec.estimate_s for j in user.jobs]
    low = load_workload(str(trace), cluster="2x8", opportunistic_fraction=0.2, seed=5)
    high = load_workload(str(trace), cluster="2x8", opportunistic_fraction=0.5, seed=5)
    lo = {j.spec.job_id for j in low.jobs if j.label == "opportunistic"}
    hi = {j.spec.job_id for j in high.jobs if j.label == "opportunistic"}
    assert lo < hi and math.isclose(len(hi) / 400, 0.5, abs_tol=0.08)
    assert all(j.spec.klass == "guaranteed" and j.label == "opportunistic"
               for j in high.as_guaranteed() if j.spec.job_id in hi)


def test_csv_trace_keeps_user_estimates_and_draws_classes_itself(tmp_path):
    p = tmp_path / "jobs.csv"
    rows = ["job_id,submit_time,duration,num_gpus,estimate_s,priority"]
    rows += [f"j{i},{i},{100 + i},1,{500 if i % 2 else ''},guaranteed" for i in range(200)]
    p.write_text("\n".join(rows) + "\n")
    wl = load_workload(str(p), cluster="1x8", estimates="user", opportunistic_fraction=0.25, seed=3)
    assert all(j.spec.estimate_s == 500 for j in wl.jobs if int(j.spec.job_id[1:]) % 2)
    assert all(j.spec.estimate_s != 500 for j in wl.jobs if not int(j.spec.job_id[1:]) % 2)
    share = sum(j.label == "opportunistic" for j in wl.jobs) / 200
    assert 0.15 < share < 0.35


@pytest.mark.parametrize("kw, message", [
    ({"estimates": "psychic"}, "--estimates"), ({"queues": "mine"}, "--queues"),
    ({"opportunistic_fraction": 2.0}, "--opportunistic-fraction"), ({"user_factor": 0.0}, "--user-factor"),
    ({"cluster": None}, "exactly one of --nodes"), ({"limit": 0}, "--limit"),
])
def test_bad_workload_options(tmp_path, kw, message):
    trace = philly_file(tmp_path / "p.csv", n=5, bad=False)
    args = {"cluster": "1x8", **kw}
    with pytest.raises(ValueError, match=message):
        load_workload(str(trace), **args)


def test_node_gpus_follow_the_cluster_and_dropped_jobs_are_counted_and_explained(tmp_path, capsys):
    trace = tmp_path / "p.csv"
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    lines += [f"2017-10-01 08:{i:02d}:00,600,{g},{600 * g},vc0" for i, g in enumerate((1, 4, 8, 8, 2, 8))]
    trace.write_text("\n".join(lines) + "\n")
    base = ["simulate", "--trace", str(trace), "--cluster", "4x4", "--policy", "fifo", "--quiet", "--no-plots",
            "--colocation-data", "none"]
    # by default a trace job is split into workers as large as the cluster's nodes: 8 GPUs = 2 workers x 4
    assert main(base + ["--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())[0]
    assert summary["succeeded"] == 6 and summary["dropped"] == 0 and summary["dropped_reasons"] == {}
    assert "dropped, never started" not in out
    assert ".png" not in out and not list((tmp_path / "a").glob("*.png"))  # --no-plots: none written, none named
    # 8-GPU workers on 4-GPU nodes can never start: each such job is counted and the reason said
    assert main(base + ["--out", str(tmp_path / "b"), "--node-gpus", "8"]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())[0]
    assert summary["succeeded"] == 3 and summary["dropped"] == 3
    [(reason, n)] = summary["dropped_reasons"].items()
    assert n == 3 and "8 GPUs on one node" in reason and "largest node has 4" in reason
    assert f"fifo: 3 of 6 jobs dropped, never started: 3 x {reason}" in " ".join(out.split())
    rows = (tmp_path / "b" / "jobs-fifo.csv").read_text().splitlines()
    assert rows[0].endswith(",reason") and sum(reason in r for r in rows) == 3


def test_the_command_freezes_what_the_run_made_and_restores_the_collector(tmp_path, capsys):
    """The replay's records are frozen when the command returns (no collection traverses them before the process
    exits), and the collector is left as it was found: on here, off when the caller had it off."""
    import gc

    before = gc.get_freeze_count()
    try:
        assert sim(tmp_path, "--policy", "fifo", "--no-plots") == 0
        assert gc.isenabled() and gc.get_freeze_count() > before + 1000
        gc.disable()
        assert sim(tmp_path, "--policy", "fifo", "--no-plots") == 0
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
    capsys.readouterr()


def test_a_replay_starts_without_numpy_or_the_protocol():
    """The simulator's start-up imports neither numpy (only the seeds' table plugins use it, at first use) nor the
    wire protocol (only a topology file's labels need its rules): a fresh interpreter says which it loaded."""
    import subprocess
    import sys

    code = ("import sys, colocate.cli.simulate, cluster.sim, cluster.sim.runner, cluster.plugins\n"
            "print(sorted(m for m in ('numpy', 'zmq', 'msgpack', 'colocate.protocol') if m in sys.modules))\n"
            "from cluster.plugins._numpy import np\n"
            "print(np.zeros(2).tolist(), 'numpy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.splitlines() == ["[]", "[0.0, 0.0] True"]


# ---------------------------------------------------------------- bad input, failed jobs, the table


def test_an_empty_out_is_refused_and_a_refused_run_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """``--out ""`` is a bad option (it used to write nothing and say ``results in /``), and ``--out`` is created only
    once the inputs are read: a run refused on its trace, its node list or its topology leaves no empty folder."""
    monkeypatch.chdir(tmp_path)
    trace = philly_file(tmp_path / "philly.csv", n=5, bad=False)
    base = ["simulate", "--trace", str(trace), "--policy", "fifo", "--quiet", "--no-plots", "--colocation-data", "none"]
    assert main(base + ["--cluster", "2x8", "--out", ""]) == 2
    err = capsys.readouterr().err
    assert "--out: an empty path" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["philly.csv"]
    for bad in (["--trace", str(tmp_path / "nonexistent.csv"), "--cluster", "2x8"],
                ["--nodes", str(tmp_path / "nonexistent-nodes.csv")],
                ["--cluster", "2x8", "--topology", "3x3"]):
        out = tmp_path / "o1"
        assert main(base + bad + ["--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert not out.exists(), bad
    assert main(base + ["--cluster", "2x8", "--out", str(tmp_path / "o1" / "deeper")]) == 0
    assert (tmp_path / "o1" / "deeper" / "summary.json").exists()
    capsys.readouterr()


NODES_WITH_BAD_ROWS = ("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,8,V100\nn2,abc,262144,8,V100\n"
                       "n3,64000,262144,-8,V100\nn1,64000,262144,8,V100\nbad\n")


def test_bad_node_list_rows_are_counted_by_reason_shown_and_summarized(tmp_path, capsys):
    """Bad rows of a ``--nodes`` file are counted like bad trace rows: ``skipped_node_rows`` in summary.json and a
    line after the table (they used to vanish, leaving a silently smaller cluster)."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES_WITH_BAD_ROWS)
    trace = philly_file(tmp_path / "philly.csv", n=10, bad=False)
    rc = main(["simulate", "--trace", str(trace), "--nodes", str(nodes), "--policy", "fifo", "--quiet",
               "--no-plots", "--colocation-data", "none", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0
    [s] = json.loads((tmp_path / "out" / "summary.json").read_text())
    skipped = {"bad cpu_milli": 1, "bad gpu": 1, "duplicate node_id": 1, "wrong field count": 1}
    assert s["skipped_node_rows"] == skipped and s["gpus"] == 8 and s["skipped_rows"] == {}
    assert "skipped node list rows: bad cpu_milli 1, bad gpu 1, duplicate node_id 1, wrong field count 1" in out
    assert "skipped trace rows" not in out
    capsys.readouterr()
    assert sim(tmp_path, "--policy", "fifo", "--no-plots") == 0  # a shape: no node rows, none skipped
    assert json.loads((tmp_path / "out" / "summary.json").read_text())[0]["skipped_node_rows"] == {}
    assert "skipped node list rows" not in capsys.readouterr().out


def test_a_node_list_without_gpus_is_refused_like_a_gpu_less_shape(tmp_path, capsys):
    nodes = tmp_path / "cpu.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nc1,64000,262144,0,\nc2,64000,262144,0,\nc3,x,1,0,\n")
    trace = philly_file(tmp_path / "philly.csv", n=5, bad=False)
    base = ["simulate", "--trace", str(trace), "--policy", "fifo", "--quiet", "--out", str(tmp_path / "out")]
    for where, message in ((["--nodes", str(nodes)], f"node list {nodes}: no GPUs (2 nodes, none with a GPU; "
                                                     "1 bad rows)"),
                           (["--cluster", "8x0"], "cluster shape '8x0': no GPUs")):
        assert main(base + where) == 2
        err = capsys.readouterr().err
        assert err.strip() == f"colocate simulate: error: {message}"
        assert not (tmp_path / "out").exists()


def test_failed_and_unfinished_jobs_have_columns_and_the_failures_their_reasons(tmp_path, capsys):
    """Jobs whose workers start later than the policy's start_timeout_s fail: the table counts them (done, failed,
    dropped and unfinished add up to the jobs) and a line gives the reasons, as for dropped jobs; summary.json has
    ``failed_reasons``. Jobs without a duration never finish: an ``unfinished`` column, only then."""
    trace = philly_file(tmp_path / "philly.csv", n=12, bad=False)
    base = ["simulate", "--trace", str(trace), "--cluster", "4x8", "--policy", "fifo", "--quiet", "--no-plots",
            "--colocation-data", "none"]
    assert main(base + ["--start-delay", "600", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    [s] = json.loads((tmp_path / "a" / "summary.json").read_text())
    reason = "start failed 3 times; last: workers did not all start within 300 s"
    assert s["failed"] == 12 and s["dropped"] == 0 and s["failed_reasons"] == {reason: 12}
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.lstrip().startswith("policy"))
    assert header.split()[:5] == ["policy", "jobs", "done", "failed", "dropped"] and "unfinished" not in header
    assert next(ln for ln in lines if ln.startswith("fifo ")).split()[:5] == ["fifo", "12", "0", "12", "0"]
    assert f"fifo: 12 of 12 jobs failed after being placed: 12 x {reason}" in " ".join(out.split())
    # dropped jobs are failed jobs too, but counted (and explained) once: in dropped
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("submit_time,duration,num_gpus\n0,100,1\n1,,1\n2,100,64\n3,50,2\n")
    assert main(base + ["--trace", str(jobs), "--allow-no-duration", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    [s] = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert (s["succeeded"], s["failed"], s["dropped"], s["unfinished"], s["failed_reasons"]) == (2, 1, 1, 1, {})
    header = next(ln for ln in out.splitlines() if ln.lstrip().startswith("policy"))
    assert header.split()[:6] == ["policy", "jobs", "done", "failed", "dropped", "unfinished"]
    assert next(ln for ln in out.splitlines() if ln.startswith("fifo ")).split()[:6] == ["fifo", "4", "2", "0", "1",
                                                                                         "1"]
    assert "failed after being placed" not in out and "1 of 4 jobs dropped, never started" in out


def test_start_delay_help_says_a_delay_past_the_start_timeout_fails_starts(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "past the policy's start_timeout_s (300 s by default) fails every start" in text


def test_the_table_stays_readable_with_huge_figures(tmp_path, capsys):
    """A figure of 300 digits (a finite absurd duration that reached the table) is shown in 3 significant digits:
    the header keeps every column name whole and no cell is wider than a few characters."""
    from colocate.cli.simulate import _print_summary

    assert sim(tmp_path, "--policy", "fifo,backfill", "--no-plots") == 0
    capsys.readouterr()
    summaries = json.loads((tmp_path / "out" / "summary.json").read_text())
    for s in summaries:
        s.update(mean_jct_s=1e308, p99_jct_s=1.5e307, mean_queue_s=3.6e9, p99_queue_s=float("inf"),
                 makespan_s=1e308, sim_wall_s=1e300)
    _print_summary(summaries, str(tmp_path / "out"), plots=False)
    lines = capsys.readouterr().out.splitlines()
    header = next(ln for ln in lines if ln.lstrip().startswith("policy"))
    assert header.split() == ["policy", "jobs", "done", "failed", "dropped", "JCT", "p99", "queue", "p99", "span",
                              "d", "alloc", "util", "sim", "s"]
    row = next(ln for ln in lines if ln.startswith("fifo "))
    assert row.split()[5:10] == ["2.78e+304", "4.17e+303", "1e+06", "inf", "1.16e+303"]
    table = [ln for ln in lines if ln.lstrip().startswith(("policy", "fifo ", "backfill "))]
    assert len(table) == 3 and max(len(ln) for ln in table) < 110


def test_a_policy_named_like_markup_is_shown_as_it_is(tmp_path, capsys):
    """A policy file's name is its policy's name in the table: shown literally, never read as rich markup."""
    policy = tmp_path / "[bold]mine.toml"
    policy.write_text('plugins = ["fifo", "gang", "binpack"]\n')
    assert sim(tmp_path, "--policy", str(policy), "--opportunistic-fraction", "0.3") == 0
    out = capsys.readouterr().out
    assert "[bold]mine" in out, out


@pytest.mark.parametrize("found, given, warned", [
    (False, None, True),  # the default lookup found nothing: said, in one line
    (True, None, False),
    (False, "none", False),  # no data, as the user said
])
def test_a_run_without_co_location_data_says_so_unless_asked(tmp_path, capsys, monkeypatch, found, given, warned):
    from cluster.sim import colocation

    data = lucid_csv(tmp_path / "lucid.csv")
    monkeypatch.delenv(colocation.LUCID_ENV, raising=False)
    monkeypatch.setattr(colocation, "default_lucid_path", lambda: data if found else None)
    extra = ["--colocation-data", given] if given else []
    assert sim(tmp_path, "--policy", "fifo", *extra, lucid=False) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "co-location data" in line]
    assert len(err) == int(warned), err
    if warned:
        assert "warning: no co-location data found" in err[0] and "--colocation-data PATH" in err[0]
