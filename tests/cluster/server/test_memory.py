"""The scheduler daemon keeps the collector off its long-lived objects: frozen after the restore and after every
``FREEZE_EVERY`` submits (run in a child process: freezing is process-wide)."""

from __future__ import annotations

from tests.support import run_py_json

CODE = """
import gc, types
from cluster.server.startup import GC_THRESHOLDS, settle_memory
from cluster.server.server import FREEZE_EVERY, SchedulerServer

restored = [[i] for i in range(50_000)]  # what a restore leaves: long-lived
settle_memory()
after_restore = gc.get_freeze_count()
server = types.SimpleNamespace(_submits_unfrozen=0)
jobs = [[i] for i in range(20_000)]  # the records of jobs submitted since
SchedulerServer._freeze_after(server, FREEZE_EVERY - 1)
before = gc.get_freeze_count()
SchedulerServer._freeze_after(server, 1)
emit({"after_restore": after_restore, "before": before, "after": gc.get_freeze_count(),
                  "threshold": list(gc.get_threshold()), "want": list(GC_THRESHOLDS)})
"""


def test_restored_and_bulk_submitted_records_are_frozen_out_of_the_collectors_reach():
    r = run_py_json(CODE)
    assert r["after_restore"] >= 50_000 and r["threshold"] == r["want"]
    assert r["before"] == r["after_restore"]  # not before FREEZE_EVERY submits
    assert r["after"] >= r["before"] + 20_000
