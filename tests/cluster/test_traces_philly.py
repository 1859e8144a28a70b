"""Philly reader: gang split, times, queues, seeded opportunistic share, bad rows, limit."""

from __future__ import annotations

import random

import pytest

from cluster.traces import read_philly, split_gang

HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
GOOD = "2017-10-01 00:00:00,10.0,1,10.0,vc1\n"


def write(tmp_path, text, name="philly.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("n,node_gpus,workers,gpus", [
    (1, 8, 1, 1), (2, 8, 1, 2), (8, 8, 1, 8), (16, 8, 2, 8), (24, 8, 3, 8), (128, 8, 16, 8),
    (12, 8, 12, 1), (9, 8, 9, 1), (4, 4, 1, 4), (8, 4, 2, 4), (6, 4, 6, 1), (3, 1, 3, 1),
])
def test_gang_split(tmp_path, n, node_gpus, workers, gpus):
    assert split_gang(n, node_gpus) == (workers, gpus)
    p = write(tmp_path, HEADER + f"2017-10-01 00:00:00,5.0,{n},0,vc\n")
    (job,) = read_philly(p, node_gpus=node_gpus).jobs
    assert (job.spec.workers, job.spec.gpus, job.spec.gpu_milli) == (workers, gpus, 1000)
    assert job.spec.total_gpus == n


def test_times_queue_ids_and_order(tmp_path):
    p = write(tmp_path, HEADER
              + "2017-10-01 01:00:00,30.0,1,30.0,b\n"     # line 2
              + "2017-10-01 00:00:00,20.0,2,40.0,a\n"     # line 3: the earliest
              + "2017-10-01 01:00:00,40.0,1,40.0,\n"      # line 4: tie with line 2, empty cluster
              + "2017-10-02 00:00:30,50.0,4,200.0,a\n")   # line 5: next day
    r = read_philly(p)
    got = [(j.line, j.spec.submit_time, j.duration_s, j.spec.queue, j.spec.job_id) for j in r.jobs]
    assert got == [(3, 0.0, 20.0, "a", "philly-3"), (2, 3600.0, 30.0, "b", "philly-2"),
                   (4, 3600.0, 40.0, "default", "philly-4"), (5, 86430.0, 50.0, "a", "philly-5")]
    assert [j.spec.user for j in r.jobs] == ["a", "b", "", "a"]  # the virtual cluster is the tenant
    for j in r.jobs:
        s = j.spec
        assert (s.name, s.klass, s.gpu_mem, s.mem_mib, s.gpu_model, s.estimate_s) == \
            ("", "guaranteed", 0, 0, "", None)
    assert r.rows == 4 and not r.skipped and r.beyond_limit == 0
    one = read_philly(p, queue="default")  # every job in one queue: the tenant stays
    assert [j.spec.queue for j in one.jobs] == ["default"] * 4 and [j.spec.user for j in one.jobs] == ["a", "b", "", "a"]


BAD = [
    ("2017-10-01 00:00:00,10.0,1,10.0", "wrong field count"),
    ("2017-13-01 00:00:00,10.0,1,10.0,a", "bad timestamp"),
    ("yesterday,10.0,1,10.0,a", "bad timestamp"),
    ("2017-10-01 00:00:00,abc,1,10.0,a", "bad duration"),
    ("2017-10-01 00:00:00,nan,1,10.0,a", "bad duration"),
    ("2017-10-01 00:00:00,inf,1,10.0,a", "bad duration"),
    ("2017-10-01 00:00:00,-5.0,1,10.0,a", "negative duration"),
    ("2017-10-01 00:00:00,10.0,1.5,10.0,a", "bad num_gpus"),
    ("2017-10-01 00:00:00,10.0,-2,10.0,a", "bad num_gpus"),
    ("2017-10-01 00:00:00,10.0,,10.0,a", "bad num_gpus"),
    ("2017-10-01 00:00:00,10.0,0,0.0,a", "no gpus"),
]


@pytest.mark.parametrize("row,reason", BAD)
def test_bad_rows_are_counted(tmp_path, row, reason):
    p = write(tmp_path, HEADER + GOOD + row + "\n" + GOOD)
    r = read_philly(p)
    assert r.rows == 3 and len(r.jobs) == 2
    assert dict(r.skipped) == {reason: 1}
    assert len(r.problems) == 1 and r.problems[0].startswith(f"{p}:3: {reason}")


def test_blank_lines_are_not_rows_and_problems_are_bounded(tmp_path):
    p = write(tmp_path, HEADER + GOOD + "\n" + "x,1,1,1,a\n" * 7 + GOOD + "\n\n")
    r = read_philly(p, max_problems=3)
    assert r.rows == 9 and len(r.jobs) == 2
    assert r.skipped == {"bad timestamp": 7} and len(r.problems) == 3


@pytest.mark.parametrize("text,needle", [
    ("", "empty"),
    ("timestamp,num_gpus,cluster\n" + "2017-10-01 00:00:00,1,a\n", "missing column 'duration'"),
    ("timestamp,duration,cluster\n", "missing column 'num_gpus'"),
    ("timestamp,duration,num_gpus,duration\n", "appears twice"),
])
def test_bad_files_raise_one_clear_error(tmp_path, text, needle):
    p = write(tmp_path, text)
    with pytest.raises(ValueError, match=needle) as e:
        read_philly(p)
    assert str(p) in str(e.value)


def test_unreadable_files_raise(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        read_philly(tmp_path / "absent.csv")
    p = tmp_path / "bin.csv"
    p.write_bytes(b"timestamp,duration,num_gpus\n\xff\xfe\x00garbage\n")
    with pytest.raises(ValueError, match=str(p)):
        read_philly(p)


def _many(tmp_path, n=400):
    rows = [f"2017-10-01 00:{i // 60 % 60:02d}:{i % 60:02d},{i + 1}.0,1,1.0,vc" for i in range(n)]
    rows.reverse()  # out of time order, as the real file is
    return write(tmp_path, HEADER + "\n".join(rows) + "\n")


def test_opportunistic_share_is_seeded_and_nested(tmp_path):
    p = _many(tmp_path)
    with pytest.raises(ValueError, match="rng"):
        read_philly(p, opportunistic_fraction=0.5)
    with pytest.raises(ValueError, match="opportunistic_fraction"):
        read_philly(p, opportunistic_fraction=1.5, rng=random.Random(1))

    def opp(frac, seed, **kw):
        r = read_philly(p, opportunistic_fraction=frac, rng=random.Random(seed), **kw)
        return [j.spec.job_id for j in r.jobs if j.spec.klass == "opportunistic"]

    a, b = opp(0.3, 7), opp(0.3, 7)
    assert a == b  # same seed, same records
    assert 0.2 * 400 < len(a) < 0.4 * 400
    assert opp(0.3, 8) != a
    assert set(opp(0.1, 7)) <= set(a) <= set(opp(0.6, 7))  # a larger share marks a superset
    assert opp(0.0, 7) == [] and len(opp(1.0, 7)) == 400
    limited = opp(0.3, 7, limit=50)  # the draws do not depend on the limit
    assert limited == [j for j in a if j in set(limited)] and set(limited) <= set(a)
    first50 = {j.spec.job_id for j in read_philly(p, limit=50).jobs}
    assert set(limited) == set(a) & first50


def test_limit_keeps_the_earliest(tmp_path):
    p = _many(tmp_path)
    full = read_philly(p)
    r = read_philly(p, limit=10)
    assert r.jobs == full.jobs[:10] and r.beyond_limit == 390 and r.rows == 400
    assert [j.spec.submit_time for j in r.jobs] == [float(i) for i in range(10)]
    assert read_philly(p, limit=0).jobs == []
    with pytest.raises(ValueError, match="limit"):
        read_philly(p, limit=-1)
    with pytest.raises(ValueError, match="node_gpus"):
        read_philly(p, node_gpus=0)


def test_queue_override_makes_the_same_specs_in_one_queue(tmp_path):
    p = write(tmp_path, HEADER + GOOD + "2017-10-01 00:00:05,20.0,16,320.0,vc2\n" + "2017-10-01 00:00:09,5.0,2,10.0,\n")
    plain = read_philly(p, opportunistic_fraction=0.5, rng=random.Random(3)).jobs
    one = read_philly(p, opportunistic_fraction=0.5, rng=random.Random(3), queue="default").jobs
    assert [j.spec.queue for j in plain] == ["vc1", "vc2", "default"]
    assert [j.spec.queue for j in one] == ["default"] * 3
    assert [(j.spec.job_id, j.spec.submit_time, j.spec.workers, j.spec.gpus, j.spec.klass, j.duration_s, j.line)
            for j in one] == [(j.spec.job_id, j.spec.submit_time, j.spec.workers, j.spec.gpus, j.spec.klass,
                               j.duration_s, j.line) for j in plain]
