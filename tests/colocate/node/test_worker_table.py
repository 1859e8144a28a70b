"""The worker table's decoder (issue 22, item 11): whatever a ``workers.json`` holds, ``decode`` returns a table or
refuses it with one ``TableError`` line, and ``load`` never raises; fuzzed with hypothesis (``FUZZ_SCALE``)."""
from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colocate.node.worker_table import TableError, WorkerTable, decode
from tests.support import examples

WORKER = {"rank": 0, "local_rank": 0, "gpus": [0], "pid": 4242, "create_time": 1700000000.5, "log_path": "/l",
          "exit_file": "/e", "exit_code": None, "kill_at": None, "killed": False, "fenced": False, "epoch": 7}
PLACEMENT = {"placement_id": "1.1", "job_id": "1", "priority": "guaranteed", "workers": [WORKER], "promoted": False,
             "stopping": False, "stop_reason": "", "ended_at": None, "cluster": "c"}
TABLE = {"format": 1, "saved_at": 1.0, "placements": [PLACEMENT], "done": {"c/0.1": "0"},
         "refused": {"c/0.2": ["0", "why"]}, "stopped_unknown": {"c/0.3": "0"}}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def _paths(value, prefix=()):
    """Every path into a JSON value (keys and indices)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _replace(value, path, new):
    if not path:
        return new
    out = json.loads(json.dumps(value))
    cur = out
    for step in path[:-1]:
        cur = cur[step]
    cur[path[-1]] = new
    return out


def _decodes_or_refuses_in_one_line(data) -> None:
    try:
        decode(data)
    except TableError as exc:
        assert str(exc) and "\n" not in str(exc)


def test_a_good_table_round_trips():
    placements, done, refused, stopped = decode(TABLE)
    (p,) = placements.values()
    assert p.workers[0].epoch == 7 and p.cluster == "c" and list(placements) == ["c/1.1"]
    assert done == {"c/0.1": "0"} and refused == {"c/0.2": ["0", "why"]} and stopped == {"c/0.3": "0"}


def test_a_saved_table_reads_back_field_for_field(tmp_path):
    """``save`` writes every field of every placement and worker (no field of the records left out, none set to its
    default on the way), and ``load`` reads them back equal."""
    from colocate.base.vocab import JobClass
    from colocate.node.table import LocalPlacement, Worker

    workers = [Worker(rank=r, local_rank=r, gpus=[r, 3], pid=4000 + r, create_time=1.7e9 + r, log_path=f"/l{r}",
                      exit_file=f"/e{r}", exit_code=r or None, kill_at=5.5, killed=True, fenced=True, oom=True,
                      epoch=9) for r in range(2)]
    placement = LocalPlacement("1.1", "1", JobClass.OPPORTUNISTIC, workers, promoted=True, stopping=True,
                               stop_reason="why", ended_at=8.25, cluster="c", start_mem=1 << 30, start_share=0.4)
    saved = WorkerTable(str(tmp_path))
    saved.placements = {"c/1.1": placement}
    saved.save()
    read = WorkerTable(str(tmp_path))
    read.load()
    assert read.placements == {"c/1.1": placement}


@pytest.mark.parametrize("bad, words", [
    ({**TABLE, "placements": [["1.1", "1", "guaranteed"]]}, "placements[0]: expected a map, got list"),
    ({**TABLE, "placements": {}}, "placements: expected a list"),
    ({**TABLE, "placements": [{**PLACEMENT, "workers": [{**WORKER, "pid": "12"}]}]}, "pid: expected an integer"),
    ({**TABLE, "placements": [{**PLACEMENT, "workers": [{**WORKER, "killed": 1}]}]}, "killed: expected true or false"),
    ({**TABLE, "placements": [{**PLACEMENT, "workers": [{**WORKER, "rank": True}]}]}, "rank: expected an integer"),
    ({**TABLE, "placements": [{**PLACEMENT, "workers": [{**WORKER, "gpus": ["0"]}]}]}, "gpus: expected GPU indices"),
    ({**TABLE, "placements": [{**PLACEMENT, "priority": "urgent"}]}, "is not a priority"),
    ({**TABLE, "placements": [{k: v for k, v in PLACEMENT.items() if k != "job_id"}]}, "missing 'job_id'"),
    ({**TABLE, "refused": {"x": "why"}}, "expected [job id, reason]"),
    ({**TABLE, "format": 3}, "format 3"),
    ([TABLE], "expected a map, got list"),
])
def test_a_table_of_the_wrong_shape_is_refused_in_one_line(bad, words):
    with pytest.raises(TableError) as err:
        decode(bad)
    assert words in str(err.value) and "\n" not in str(err.value)


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=json_values)
def test_any_json_value_is_a_table_or_one_line(data):
    _decodes_or_refuses_in_one_line(data)


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pick=st.integers(0, 10**6), new=json_values)
def test_a_good_table_with_any_part_replaced_is_a_table_or_one_line(pick, new):
    paths = list(_paths(TABLE))
    _decodes_or_refuses_in_one_line(_replace(TABLE, paths[pick % len(paths)], new))


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200) | st.builds(lambda t: json.dumps(TABLE)[:t].encode(), st.integers(0, 400)))
def test_load_never_raises_and_says_one_line(tmp_path_factory, raw):
    state = tmp_path_factory.mktemp("state")
    (state / "workers.json").write_bytes(raw)
    table = WorkerTable(str(state))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("colocate.node.workers")
    logger.addHandler(handler)
    try:
        table.load()
    finally:
        logger.removeHandler(handler)
    if table.lost:
        assert len(records) == 1 and "\n" not in records[0].getMessage() and records[0].exc_info is None
        assert table.placements == {}
    else:
        assert records == []


def test_taking_the_folder_removes_what_a_node_killed_while_saving_left(tmp_path):
    (tmp_path / "workers.json.tmp.4242").write_text('{"format": 2, "placements": {}}')  # the old table, exchanged
    (tmp_path / "lease.tmp.4242").write_text("{")  # killed mid-write
    (tmp_path / "done.log.tmp.4242").write_text("p1 j1\n")  # killed while rewriting done.log
    (tmp_path / "notes.tmp.1").write_text("not ours")
    table = WorkerTable(str(tmp_path))
    table.lock()
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["lock", "notes.tmp.1"]
        other = WorkerTable(str(tmp_path))  # a second node is refused before it touches anything
        (tmp_path / "workers.json.tmp.77").write_text("{}")  # as a live node's save would have it
        with pytest.raises(Exception, match="in use by another running node"):
            other.lock()
        assert (tmp_path / "workers.json.tmp.77").exists()
    finally:
        table.unlock()
