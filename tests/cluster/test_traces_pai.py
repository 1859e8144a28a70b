"""Alibaba PAI 2020 job rows (format pai2020): the group is the fingerprint, leaky columns are ignored."""

from __future__ import annotations

import pytest

from cluster.traces import detect_format, load_trace, read_pai_jobs

HEADER = "job_id,submit_time,user,group,num_gpu,duration,gpu_type,user_dur,group_dur,group_gpu_dur\n"


def write(tmp_path, rows):
    p = tmp_path / "pai.csv"
    p.write_text(HEADER + "".join(r + "\n" for r in rows))
    return p


@pytest.mark.parametrize("num_gpu, expected", [
    ("1", (1, 1, 1000)),
    ("0.25", (1, 1, 250)),  # a share of one GPU
    ("0.0001", (1, 1, 1)),  # at least 1 milli
    ("3", (1, 3, 1000)),
    ("7.5", (1, 8, 1000)),  # rounded up to whole GPUs
    ("16", (2, 8, 1000)),  # split as Philly's gangs
])
def test_gpus(tmp_path, num_gpu, expected):
    (job,) = read_pai_jobs(write(tmp_path, [f"1,3,d4d5,31d2ec,{num_gpu},100,T4,1,2,3"])).jobs
    assert (job.spec.workers, job.spec.gpus, job.spec.gpu_milli) == expected


def test_mapping_and_ignored_columns(tmp_path):
    p = write(tmp_path, ["2,5,a819,3dddb7,1,84,MISC,693,67,66", "1,3,d4d5,31d2ec,1,15748,T4,386,6793.5,15199"])
    assert detect_format(p) == "pai2020"
    res = load_trace(p)
    assert [(j.spec.job_id, j.spec.submit_time, j.spec.user, j.spec.fingerprint, j.spec.family, j.duration_s)
            for j in res.jobs] == [("1", 3.0, "d4d5", "31d2ec", "31d2ec", 15748.0), ("2", 5.0, "a819", "3dddb7", "3dddb7", 84.0)]
    assert all(j.spec.gpu_model == "" and j.spec.estimate_s is None for j in res.jobs)  # leaky figures never read
    assert set(res.ignored_columns) == {"gpu_type", "user_dur", "group_dur", "group_gpu_dur"}


@pytest.mark.parametrize("row, reason", [
    ("1,x,u,g,1,10,T4,1,1,1", "bad submit_time"),
    ("1,0,u,g,1,-5,T4,1,1,1", "negative duration"),
    ("1,0,u,g,0,10,T4,1,1,1", "no gpus"),
    ("1,0,u,g,nan,10,T4,1,1,1", "bad num_gpu"),
    ("1,0,u,g,1,10", "wrong field count"),
])
def test_bad_rows_are_counted(tmp_path, row, reason):
    res = read_pai_jobs(write(tmp_path, [row, "9,0,u,g,1,10,T4,1,1,1"]))
    assert [j.spec.job_id for j in res.jobs] == ["9"]
    assert res.skipped == {reason: 1}


def test_duplicate_job_id(tmp_path):
    res = read_pai_jobs(write(tmp_path, ["1,0,u,g,1,10,T4,1,1,1", "1,2,u,g,1,10,T4,1,1,1"]))
    assert len(res.jobs) == 1 and res.skipped == {"duplicate job_id": 1}
