"""colocate/node/worker_table.py: workers.json holds the live and unsettled placements only (compact JSON); the
ids of retired placements go to an append-only done.log, rewritten now and then, so a save costs the same after
thousands of jobs and no retired id is forgotten across a restart. PlacementTable.retire_ended: what the
scheduler has settled retires at once."""

from __future__ import annotations

import json
import os

from colocate.node import table as T
from colocate.node import worker_table as WT
from colocate.node.worker_table import LocalPlacement, Worker, WorkerTable, scoped


def ended(table: WorkerTable, n: int, start: int = 0, cluster: str = "c1") -> list[str]:
    keys = []
    for i in range(start, start + n):
        p = LocalPlacement(f"j{i}.0", f"j{i}", "guaranteed",
                           [Worker(0, 0, [0], 100 + i, 1.0, "/l", "/e", exit_code=0)], ended_at=10.0, cluster=cluster)
        keys.append(scoped(cluster, p.placement_id))
        table.placements[keys[-1]] = p
    return keys


def live(table: WorkerTable) -> str:
    p = LocalPlacement("live.0", "live", "guaranteed", [Worker(0, 0, [0], 99, 1.0, "/l", "/e")], cluster="c1")
    table.placements[scoped("c1", p.placement_id)] = p
    return scoped("c1", p.placement_id)


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
    assert text.count("\n") == 1 and json.loads(text)["format"] == WT.FORMAT and "j4999" not in text  # compact
    assert len(open(table.done_path).read().splitlines()) == 5000
    table.unlock()


def test_settled_placements_retire_at_once_and_running_ones_stay(tmp_path):
    table = WorkerTable(str(tmp_path / "n0"))
    table.lock()
    table.load()
    keys = ended(table, 3)
    running = live(table)
    assert table.retire_ended([keys[0], running, "c1/unknown.0"]) == 1
    assert keys[0] not in table.placements and table.known(keys[0]) and running in table.placements
    table.save()
    assert open(table.done_path).read() == "c1/j0.0 j0\n"
    table.unlock()


def test_retired_ids_survive_a_restart_even_without_workers_json(tmp_path):
    table = WorkerTable(str(tmp_path / "n0"))
    table.lock()
    table.load()
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


def test_a_crash_between_the_two_files_leaves_the_id_known(tmp_path, monkeypatch):
    table = WorkerTable(str(tmp_path / "n0"))
    table.lock()
    table.load()
    ended(table, 1)
    table.save()  # workers.json holds the ended placement
    table.retire(1000.0, 1.0)

    def crash(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(WT, "write_json_atomic", crash)  # done.log is appended, then workers.json fails
    table.save()
    table.unlock()
    again = WorkerTable(str(tmp_path / "n0"))
    again.load()
    assert again.known("c1/j0.0")


def test_done_log_is_rewritten_with_the_newest_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(WT, "KEEP_IDS", 100)
    monkeypatch.setattr(T, "KEEP_IDS", 100)
    table = WorkerTable(str(tmp_path / "n0"))
    table.lock()
    table.load()
    for k in range(10):
        ended(table, 50, start=k * 50)
        table.retire(1000.0, 1.0)
        table.save()
    lines = open(table.done_path).read().splitlines()
    assert len(lines) <= 200 and lines[-1].startswith("c1/j499.0 ")
    table.unlock()
    again = WorkerTable(str(tmp_path / "n0"))
    again.load()
    assert len(again.done) == 100 and again.known("c1/j499.0") and not again.known("c1/j0.0")


def test_a_deleted_state_folder_gets_every_remembered_id_again(tmp_path):
    table = WorkerTable(str(tmp_path / "n0"))
    table.lock()
    table.load()
    ended(table, 5)
    table.retire(1000.0, 1.0)
    table.save()
    for name in os.listdir(table.state_dir):
        os.remove(os.path.join(table.state_dir, name))
    os.rmdir(table.state_dir)
    table.save()  # made again: done.log is written whole
    assert len(open(table.done_path).read().splitlines()) == 5
    table.unlock()


def test_a_format_1_table_is_read(tmp_path):
    folder = tmp_path / "n0"
    folder.mkdir()
    (folder / "workers.json").write_text(json.dumps({"format": 1, "placements": [], "done": {"c1/old.0": "old"},
                                                     "refused": {}, "stopped_unknown": {}}, indent=2))
    table = WorkerTable(str(folder))
    table.load()
    assert table.known("c1/old.0")
