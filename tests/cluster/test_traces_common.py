"""Format detection, dispatch, determinism and the row-accounting invariant across readers."""

from __future__ import annotations

import random

import pytest

from cluster.traces import detect_format, load_trace
from cluster.traces.common import MAX_SECONDS
from cluster.traces.summary import summarize_jobs

FILES = {
    "philly": "timestamp,duration,num_gpus,gpu_time,cluster\n"
              "2017-10-01 00:00:09,10.0,1,10.0,a\n" "2017-10-01 00:00:01,10.0,16,160.0,b\n"
              "bad,1,1,1,a\n" "2017-10-01 00:00:05,3.0,2,6.0,a\n",
    "alibaba2023": "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                   "scheduled_time\n"
                   "p0,1000,1024,1,500,,BE,Running,9,20,10\n" "p1,1000,1024,0,0,,LS,Running,1,5,1\n"
                   "p2,1000,1024,1,1000,,LS,Pending,3,4,\n" "p3,1000,1024,2,1000,T4,LS,Running,5,9,6\n",
    "csv": "submit_time,duration,num_gpus\n" "9,1,1\n" "1,1,16\n" "x,1,1\n" "5,1,2\n",
}


def write(tmp_path, text, name):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("fmt", sorted(FILES))
def test_detect_dispatch_and_accounting(tmp_path, fmt):
    p = write(tmp_path, FILES[fmt], f"{fmt}.csv")
    assert detect_format(p) == fmt
    r = load_trace(p)
    assert r.format == fmt and r.path == str(p)
    assert r.rows == 4 and len(r.jobs) == 3 and sum(r.skipped.values()) == 1
    assert r.rows == len(r.jobs) + sum(r.skipped.values()) + r.beyond_limit
    times = [j.spec.submit_time for j in r.jobs]
    assert times == sorted(times)
    r2 = load_trace(p, fmt, limit=2)
    assert r2.jobs == r.jobs[:2] and r2.beyond_limit == 1
    assert r2.rows == len(r2.jobs) + sum(r2.skipped.values()) + r2.beyond_limit
    assert summarize_jobs(r)["jobs"] == 3


def test_same_file_same_seed_same_records(tmp_path):
    p = write(tmp_path, FILES["philly"], "p.csv")
    a = load_trace(p, opportunistic_fraction=0.5, rng=random.Random(3))
    b = load_trace(p, opportunistic_fraction=0.5, rng=random.Random(3))
    assert a == b


@pytest.mark.parametrize("header", ["a,b,c\n", "model1,speed1\n", "timestamp,num_gpus\n", "name,num_gpu\n"])
def test_unknown_format_is_a_clear_error(tmp_path, header):
    p = write(tmp_path, header + "1,2,3\n", "u.csv")
    with pytest.raises(ValueError, match="unknown job trace format") as e:
        detect_format(p)
    assert str(p) in str(e.value) and "philly" in str(e.value)


def test_bad_format_name_and_options(tmp_path):
    p = write(tmp_path, FILES["csv"], "c.csv")
    with pytest.raises(ValueError, match="unknown trace format 'slurm'"):
        load_trace(p, "slurm")
    with pytest.raises(TypeError):
        load_trace(p, opportunistic_fraction=0.5)  # a Philly option
    with pytest.raises(ValueError, match="cannot read"):
        detect_format(tmp_path / "absent.csv")


@pytest.mark.parametrize("fmt, text, reason", [
    ("philly", "timestamp,duration,num_gpus\n2017-10-01 00:00:00,{v},1\n", "bad duration"),
    ("csv", "submit_time,duration,num_gpus\n0,{v},1\n", "bad duration"),
    ("csv", "submit_time,duration,num_gpus\n{v},10,1\n", "bad submit_time"),
    ("csv", "submit_time,duration,num_gpus,estimate_s\n0,10,1,{v}\n", "bad estimate_s"),
    ("pai2020", "submit_time,duration,num_gpu,group\n0,{v},1,g\n", "bad duration"),
    ("pai2020", "submit_time,duration,num_gpu,group\n{v},10,1,g\n", "bad submit_time"),
])
@pytest.mark.parametrize("value", ["1e308", "3155760001"])
def test_times_over_100_years_are_bad_rows(tmp_path, fmt, text, reason, value):
    """A finite but absurd time or duration (over ``MAX_SECONDS``, 100 years) is a bad row counted by reason, not a
    job that would stall the simulated clock and overflow every report; 100 years itself, and Unix times of today,
    pass."""
    good = "2017-10-01 00:00:00,10,1\n" if fmt == "philly" else text.splitlines()[1].replace("{v}", "5") + "\n"
    p = write(tmp_path, text.format(v=value) + good, f"{fmt}.csv")
    r = load_trace(p, fmt)
    assert dict(r.skipped) == {reason: 1} and len(r.jobs) == 1 and "over 100 years" in r.problems[0]
    assert MAX_SECONDS == 100 * 365.25 * 86400
    for ok in (str(int(MAX_SECONDS)), "1767225600"):  # the bound itself; 2026-01-01 as a Unix time
        r = load_trace(write(tmp_path, text.format(v=ok), f"ok-{fmt}.csv"), fmt)
        assert not r.skipped and len(r.jobs) == 1
