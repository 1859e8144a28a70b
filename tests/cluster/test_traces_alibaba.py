"""Alibaba 2023 pod reader: shares, CPU-only pods, qos, model constraints, times, bad rows."""

from __future__ import annotations

import pytest

from cluster.traces import model_allows, read_alibaba_pods
from cluster.traces.common import allowed_models, normalize_models

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
SHORT = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"  # the multigpu* files


def write(tmp_path, text, name="pods.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def pod(name="p", cpu="1000", mem="2048", n="1", milli="1000", spec="", qos="LS", phase="Running",
        ct="10", dt="100", st="15"):
    return ",".join((name, cpu, mem, n, milli, spec, qos, phase, ct, dt, st))


# (row fields, expected (gpus, gpu_milli, priority, gpu_model, submit, duration))
MAPPING = [
    (dict(), (1, 1000, "guaranteed", "", 10.0, 85.0)),
    (dict(milli="460", qos="BE"), (1, 460, "opportunistic", "", 10.0, 85.0)),
    (dict(n="0", milli="0"), (0, 1000, "guaranteed", "", 10.0, 85.0)),
    (dict(n="8", milli="1000", qos="Burstable"), (8, 1000, "guaranteed", "", 10.0, 85.0)),
    (dict(qos="Guaranteed", phase="Failed"), (1, 1000, "guaranteed", "", 10.0, 85.0)),
    (dict(spec="T4"), (1, 1000, "guaranteed", "T4", 10.0, 85.0)),
    (dict(spec="V100M32|V100M16|V100M32"), (1, 1000, "guaranteed", "V100M16|V100M32", 10.0, 85.0)),
    (dict(ct="0", st="0", dt="0"), (1, 1000, "guaranteed", "", 0.0, 0.0)),
]


@pytest.mark.parametrize("fields,expected", MAPPING)
def test_mapping(tmp_path, fields, expected):
    p = write(tmp_path, HEADER + pod(**fields) + "\n")
    (job,) = read_alibaba_pods(p).jobs
    s = job.spec
    assert (s.gpus, s.gpu_milli, s.klass, s.gpu_model, s.submit_time, job.duration_s) == expected
    assert (s.job_id, s.name, s.workers, s.cpu_milli, s.mem_mib, s.queue, s.user) == \
        ("p", "p", 1, 1000, 2048, "default", "")


def test_pending_pods_need_allow_no_duration(tmp_path):
    p = write(tmp_path, HEADER + pod("a") + "\n" + pod("b", phase="Pending", st="", ct="5") + "\n")
    r = read_alibaba_pods(p)
    assert [j.spec.job_id for j in r.jobs] == ["a"] and r.skipped == {"never scheduled": 1}
    r = read_alibaba_pods(p, allow_no_duration=True)
    assert [(j.spec.job_id, j.spec.submit_time, j.duration_s) for j in r.jobs] == [("b", 5.0, None), ("a", 10.0, 85.0)]
    assert not r.skipped


def test_files_without_times(tmp_path):
    p = write(tmp_path, SHORT + "z,1000,1024,1,500\n" + "a,2000,1024,2,1000\n" + "m,0,0,0,0\n")
    with pytest.raises(ValueError, match="missing columns 'creation_time', 'deletion_time', 'scheduled_time'") as e:
        read_alibaba_pods(p)
    assert str(p) in str(e.value)
    r = read_alibaba_pods(p, allow_no_duration=True)
    assert [(j.spec.job_id, j.spec.submit_time, j.duration_s, j.spec.klass) for j in r.jobs] == [
        ("z", 0.0, None, "guaranteed"), ("a", 0.0, None, "guaranteed"), ("m", 0.0, None, "guaranteed")]


def test_the_missing_times_hint_names_the_command_line_flag_only_where_it_helps(tmp_path):
    """The error names ``--allow-no-duration`` (what a ``colocate simulate`` user can pass, not the Python argument)
    when only the time columns are missing; when another required column is missing too, the flag would not help
    and is not named."""
    only_times = write(tmp_path, SHORT + "z,1000,1024,1,500\n", "short.csv")
    with pytest.raises(ValueError) as e:
        read_alibaba_pods(only_times)
    assert "--allow-no-duration" in str(e.value) and "allow_no_duration=True" not in str(e.value)
    no_name = write(tmp_path, "cpu_milli,memory_mib,num_gpu,gpu_milli\n1000,1024,1,500\n", "noname.csv")
    with pytest.raises(ValueError, match="missing columns 'name', 'creation_time'") as e:
        read_alibaba_pods(no_name)
    assert "allow" not in str(e.value)
    with pytest.raises(ValueError, match="missing column 'name'") as e:
        read_alibaba_pods(no_name, allow_no_duration=True)
    assert "allow" not in str(e.value)


BAD = [
    ("p,1000,2048,1,1000,,LS,Running,10,100", "wrong field count"),
    (pod(name=""), "bad name"),
    (pod(name="g"), "duplicate name"),  # the good row is named g
    (pod(cpu="x"), "bad cpu_milli"),
    (pod(cpu="-1"), "bad cpu_milli"),
    (pod(mem="1.5"), "bad memory_mib"),
    (pod(n="-1"), "bad num_gpu"),
    (pod(n="two"), "bad num_gpu"),
    (pod(milli="1500"), "bad gpu_milli"),
    (pod(milli="0"), "bad gpu_milli"),
    (pod(milli=""), "bad gpu_milli"),
    (pod(n="2", milli="500"), "fractional share on several GPUs"),
    (pod(n="0", milli="500"), "gpu_milli without gpus"),
    (pod(qos="Gold"), "bad qos"),
    (pod(qos=""), "bad qos"),
    (pod(ct=""), "bad creation_time"),
    (pod(ct="-3"), "bad creation_time"),
    (pod(st="x"), "bad scheduled_time"),
    (pod(dt="later"), "bad deletion_time"),
    (pod(ct="20", st="15"), "scheduled before creation"),
    (pod(dt="12"), "negative duration"),
    (pod(st=""), "never scheduled"),
    (pod(dt=""), "no duration"),
    (pod(ct="1e308", st="1e308", dt="1e308"), "bad creation_time"),  # over 100 years (MAX_SECONDS)
    (pod(dt="1e12"), "bad deletion_time"),
]


@pytest.mark.parametrize("row,reason", BAD)
def test_bad_rows_are_counted(tmp_path, row, reason):
    p = write(tmp_path, HEADER + pod("g") + "\n" + row + "\n" + pod("h") + "\n")
    r = read_alibaba_pods(p)
    assert r.rows == 3 and [j.spec.job_id for j in r.jobs] == ["g", "h"]
    assert dict(r.skipped) == {reason: 1}
    assert r.problems[0].startswith(f"{p}:3: {reason}")


def test_cpu_only_pods_can_be_left_out_but_are_counted(tmp_path):
    p = write(tmp_path, HEADER + pod("c", n="0", milli="0") + "\n" + pod("g") + "\n")
    assert len(read_alibaba_pods(p).jobs) == 2
    r = read_alibaba_pods(p, include_cpu_only=False)
    assert [j.spec.job_id for j in r.jobs] == ["g"] and r.skipped == {"cpu-only pod": 1}


def test_sorted_by_creation_stable_and_limited(tmp_path):
    rows = [pod("late", ct="50", st="50", dt="60"), pod("t1", ct="5", st="5", dt="6"),
            pod("t2", ct="5", st="6", dt="9"), pod("early", ct="1", st="1", dt="2")]
    p = write(tmp_path, HEADER + "\n".join(rows) + "\n")
    r = read_alibaba_pods(p)
    assert [j.spec.job_id for j in r.jobs] == ["early", "t1", "t2", "late"]
    assert [j.line for j in r.jobs] == [5, 3, 4, 2]
    r = read_alibaba_pods(p, limit=2)
    assert [j.spec.job_id for j in r.jobs] == ["early", "t1"] and r.beyond_limit == 2


@pytest.mark.parametrize("constraint,model,ok", [
    ("", "T4", True), ("", "", True), ("T4", "T4", True), ("T4", "G2", False), ("T4", "", False),
    ("V100M16|V100M32", "V100M32", True), ("V100M16|V100M32", "V100M16", True), ("V100M16|V100M32", "V100", False),
    ("G2|P100|T4", "P100", True), ("T4", "t4", False),
])
def test_model_allows(constraint, model, ok):
    assert model_allows(constraint, model) is ok


def test_normalize_models():
    assert normalize_models(" B|A|B ") == "A|B"
    assert normalize_models("") == ""
    assert allowed_models("A|B") == frozenset({"A", "B"})
