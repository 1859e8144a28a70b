"""Generic job CSV: num_gpus is the total, workers split it, optional columns, bad rows."""

from __future__ import annotations

import pytest

from cluster.traces import read_csv_jobs

FULL = "job_id,submit_time,duration,num_gpus,workers,gpu_milli,gpu_mem,priority,queue,user,name\n"


def write(tmp_path, text, name="jobs.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


# (num_gpus, workers, gpu_milli, node_gpus) -> (workers, gpus per worker, gpu_milli)
GANGS = [
    ("1", "", "", 8, (1, 1, 1000)),
    ("8", "", "", 8, (1, 8, 1000)),
    ("16", "", "", 8, (2, 8, 1000)),
    ("12", "", "", 8, (12, 1, 1000)),
    ("16", "", "", 4, (4, 4, 1000)),
    ("16", "4", "", 8, (4, 4, 1000)),    # num_gpus is the total
    ("8", "8", "", 8, (8, 1, 1000)),
    ("6", "3", "", 8, (3, 2, 1000)),
    ("1", "", "500", 8, (1, 1, 500)),
    ("3", "3", "250", 8, (3, 1, 250)),
    ("0", "", "", 8, (1, 0, 1000)),      # CPU-only
    ("0", "2", "", 8, (2, 0, 1000)),
]


@pytest.mark.parametrize("n,workers,milli,node_gpus,expected", GANGS)
def test_gang_mapping(tmp_path, n, workers, milli, node_gpus, expected):
    p = write(tmp_path, "submit_time,duration,num_gpus,workers,gpu_milli\n" + f"0,10,{n},{workers},{milli}\n")
    (job,) = read_csv_jobs(p, node_gpus=node_gpus).jobs
    assert (job.spec.workers, job.spec.gpus, job.spec.gpu_milli) == expected
    assert job.spec.total_gpus == int(n)


def test_optional_columns_and_defaults(tmp_path):
    p = write(tmp_path, FULL
              + "a,5,100,2,2,,8GiB,opportunistic,q1,ann,bert\n"
              + ",1.5,7.25,1,,500,1024,,,,\n"
              + "c,1.5,0,1,1,,,GUARANTEED,,,\n")
    r = read_csv_jobs(p)
    got = [(j.spec.job_id, j.spec.submit_time, j.duration_s, j.spec.gpu_mem, j.spec.klass, j.spec.queue,
            j.spec.user, j.spec.name, j.spec.gpu_milli) for j in r.jobs]
    assert got == [("job-3", 1.5, 7.25, 1024, "guaranteed", "default", "", "", 500),
                   ("c", 1.5, 0.0, 0, "guaranteed", "default", "", "", 1000),
                   ("a", 5.0, 100.0, 8 << 30, "opportunistic", "q1", "ann", "bert", 1000)]
    assert not r.skipped and r.ignored_columns == ()


def test_extra_columns_case_and_more_fields(tmp_path):
    p = write(tmp_path, "Submit_Time, DURATION ,num_gpus,gpu_model,cpu_milli,mem_mib,estimate_s,comment\n"
                        "0,10,1,V100|A100|V100,4000,8192,12.5,hello\n")
    r = read_csv_jobs(p)
    s = r.jobs[0].spec
    assert (s.gpu_model, s.cpu_milli, s.mem_mib, s.estimate_s) == ("A100|V100", 4000, 8192, 12.5)
    assert r.ignored_columns == ("comment",)


def test_missing_duration_needs_permission(tmp_path):
    p = write(tmp_path, "submit_time,duration,num_gpus\n0,,1\n1,5,1\n")
    r = read_csv_jobs(p)
    assert len(r.jobs) == 1 and r.skipped == {"no duration": 1}
    r = read_csv_jobs(p, allow_no_duration=True)
    assert [j.duration_s for j in r.jobs] == [None, 5.0]


BAD = [
    ("a,0,10,1,1,,,,,,,", "wrong field count"),
    ("a,x,10,1,,,,,,,", "bad submit_time"),
    ("a,-1,10,1,,,,,,,", "bad submit_time"),
    ("a,0,ten,1,,,,,,,", "bad duration"),
    ("a,0,-10,1,,,,,,,", "negative duration"),
    ("a,0,,1,,,,,,,", "no duration"),
    ("a,0,10,,,,,,,,", "bad num_gpus"),
    ("a,0,10,-1,,,,,,,", "bad num_gpus"),
    ("a,0,10,4,0,,,,,,", "bad workers"),
    ("a,0,10,4,3,,,,,,", "inconsistent workers"),
    ("a,0,10,2,,500,,,,,", "fractional share on several GPUs"),
    ("a,0,10,4,2,500,,,,,", "fractional share on several GPUs"),
    ("a,0,10,0,,500,,,,,", "gpu_milli without gpus"),
    ("a,0,10,1,,0,,,,,", "bad gpu_milli"),
    ("a,0,10,1,,1001,,,,,", "bad gpu_milli"),
    ("a,0,10,1,,,8 parsecs,,,,", "bad gpu_mem"),
    ("a,0,10,1,,,,high,,,", "bad priority"),
    ("g,0,10,1,,,,,,,", "duplicate job_id"),
]


@pytest.mark.parametrize("row,reason", BAD)
def test_bad_rows_are_counted(tmp_path, row, reason):
    good = "g,0,10,1,,,,,,,\n"
    p = write(tmp_path, FULL + good + row + "\n" + good.replace("g,", "h,"))
    r = read_csv_jobs(p)
    assert r.rows == 3 and [j.spec.job_id for j in r.jobs] == ["g", "h"]
    assert dict(r.skipped) == {reason: 1}
    assert r.problems[0].startswith(f"{p}:3: {reason}")


def test_bad_estimate(tmp_path):
    p = write(tmp_path, "submit_time,duration,num_gpus,estimate_s\n0,1,1,0\n0,1,1,x\n0,1,1,\n")
    r = read_csv_jobs(p)
    assert len(r.jobs) == 1 and r.skipped == {"bad estimate_s": 2}


def test_missing_required_column(tmp_path):
    p = write(tmp_path, "submit_time,num_gpus\n0,1\n")
    with pytest.raises(ValueError, match="missing column 'duration'") as e:
        read_csv_jobs(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("header, row, fingerprint, family", [
    ("submit_time,duration,num_gpus,user,name,group", "0,10,1,ann,bert,ab12cd", "ab12cd", ""),
    ("submit_time,duration,num_gpus,group,family", "0,10,1,ab12cd,ff00", "ab12cd", "ff00"),
    ("submit_time,duration,num_gpus,GROUP", "0,10,1,", "", ""),  # empty cell: unknown
    ("submit_time,duration,num_gpus", "0,10,1", "", ""),
])
def test_group_and_family_columns_are_the_fingerprints(tmp_path, header, row, fingerprint, family):
    (job,) = read_csv_jobs(write(tmp_path, f"{header}\n{row}\n")).jobs
    assert (job.spec.fingerprint, job.spec.family) == (fingerprint, family)
