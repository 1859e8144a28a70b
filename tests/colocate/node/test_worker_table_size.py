"""colocate/node/worker_table.py: workers.json holds the live placements only (compact JSON), the ids of retired
placements go to an append-only done.log compacted now and then, so a save costs the same after thousands of
jobs and no retired id is forgotten across a restart."""

from __future__ import annotations

import json
import os

from colocate.node import worker_table as WT
from colocate.node.worker_table import Placement, Worker, WorkerTable, scoped


def ended(table: WorkerTable, n: int, start: int = 0, cluster: str = "c1") -> None:
    for i in range(start, start + n):
        p = Placement(f"j{i}.0", f"j{i}", "guaranteed", [Worker(0, 0, [0], 100 + i, 1.0, "/l", "/e", exit_code=0)],
                      ended_at=10.0, cluster=cluster)
        table.placements[scoped(cluster, p.placement_id)] = p


def live(table: WorkerTable) -> None:
    p = Placement("live.0", "live", "guaranteed", [Worker(0, 0, [0], 99, 1.0, "/l", "/e")], cluster="c1")
    table.placements[scoped("c1", p.placement_id)] = p


def test_a_save_costs_the_live_placements_not_the_retired_ones(tmp_path):
    table = WorkerTable(str(tmp_path / "n0"))
    table.lock()
    table.load()
    live(table)
    table.save()
    before = os.path.getsize(table.path)
    for k in range(5):
        ended(table, 1000, start=k * 1000)
        assert table.retire(now_wall=1000.0, keep_s=1.0)
        table.save()
    assert abs(os.path.getsize(table.path) - before) < 8  # 5,000 retired placements later (saved_at: a float)
    text = open(table.path).read()
    assert "\n" not in text and json.loads(text)["format"] == WT.FORMAT  # compact
    table.unlock()


def test_retired_ids_survive_a_restart_even_without_workers_json(tmp_path):
    table = WorkerTable(str(tmp_path / "n0"))
    table.lock()
    ended(table, 30)
    table.retire(1000.0, 1.0)
    table.save()
    table.unlock()
    os.remove(table.path)  # a lost table: the retired ids still hold
    with open(table.done_path, "a") as f:
        f.write("c1/torn.0 jo")  # a crash in the middle of an append
    again = WorkerTable(str(tmp_path / "n0"))
    again.lock()
    again.load()
    assert all(again.known(scoped("c1", f"j{i}.0")) for i in range(30))
    assert not again.known("c1/torn.0") and len(again.done) == 30
    again.unlock()


def test_done_log_is_compacted_to_the_newest_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(WT, "KEEP_IDS", 100)
    table = WorkerTable(str(tmp_path / "n0"))
    table.lock()
    for k in range(10):
        ended(table, 50, start=k * 50)
        table.retire(1000.0, 1.0)
    lines = open(table.done_path).read().splitlines()
    assert len(lines) <= 200 and lines[-1].startswith("c1/j499.0 ")
    table.unlock()
    again = WorkerTable(str(tmp_path / "n0"))
    again.load()
    assert len(again.done) == 100 and again.known("c1/j499.0") and not again.known("c1/j0.0")


def test_a_format_1_table_is_read(tmp_path):
    folder = tmp_path / "n0"
    folder.mkdir()
    (folder / "workers.json").write_text(json.dumps({"format": 1, "placements": [], "done": {"c1/old.0": "old"},
                                                     "refused": {}, "stopped_unknown": {}}, indent=2))
    table = WorkerTable(str(folder))
    table.load()
    assert table.known("c1/old.0")
