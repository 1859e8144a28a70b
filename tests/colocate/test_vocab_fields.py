"""Records that hold a vocabulary value (``colocate.base.vocab``) hold the enum member, whether they were parsed
(``COLOCATE_*`` variables, a node config, a journal row) or built from its string; another string is refused
in one line naming the field."""

from __future__ import annotations

import json

import pytest

from cluster.server.journal_file import placement_from_json, placement_to_json, spec_from_json, spec_to_json
from cluster.spec import JobSpec, Placement, SpecError, WorkerSlot
from colocate.base.env import JobEnv
from colocate.base.vocab import DeviceKind, JobClass, NodePolicy, OnCap, YieldMode
from colocate.launcher import RunSpec
from colocate.node.config import NodeConfig


def test_the_parsed_job_environment_holds_members():
    env = JobEnv.from_environ({"COLOCATE_PRIORITY": "opportunistic", "COLOCATE_DEVICE": "cuda",
                               "COLOCATE_ON_CAP": "error", "COLOCATE_YIELD_VIA": "gate,priority"})
    assert type(env.klass) is JobClass and env.klass is JobClass.OPPORTUNISTIC
    assert type(env.device) is DeviceKind and type(env.on_cap) is OnCap
    assert all(type(m) is YieldMode for m in env.yield_via) and env.yield_via
    assert JobEnv.from_environ(env.to_environ()) == env  # the variables carry the plain strings back
    assert env.to_environ()["COLOCATE_PRIORITY"] == "opportunistic"


def test_a_record_built_from_strings_holds_members_and_refuses_another_string():
    spec = RunSpec(command=("true",), device="sim", klass="opportunistic", on_cap="error")
    assert (type(spec.device), type(spec.klass), type(spec.on_cap)) == (DeviceKind, JobClass, OnCap)
    assert type(JobEnv(klass="opportunistic").klass) is JobClass
    with pytest.raises(ValueError, match=r"^klass: must be one of guaranteed, opportunistic, got 'best-effort'$"):
        RunSpec(command=("true",), klass="best-effort")
    assert type(JobSpec("j", klass="opportunistic").klass) is JobClass
    with pytest.raises(SpecError):
        JobSpec("j", klass="best-effort")
    cfg = NodeConfig.from_dict({"policy": "pack"})
    assert cfg.policy is NodePolicy.PACK and type(NodeConfig().policy) is NodePolicy


def test_a_journal_row_reads_back_as_members():
    text = spec_to_json(JobSpec("j", klass=JobClass.OPPORTUNISTIC))
    assert '"priority": "opportunistic"' in text  # the journal keeps the wire's name
    spec = spec_from_json(text)
    assert type(spec.klass) is JobClass and spec.klass is JobClass.OPPORTUNISTIC
    p = placement_from_json(placement_to_json(Placement("j.1", "j", (WorkerSlot(0, "n", (0,)),), JobClass.GUARANTEED)))
    assert p is not None and type(p.klass) is JobClass


def test_the_worker_table_file_keeps_the_key_priority_and_reads_back_the_member(tmp_path):
    from colocate.node.worker_table import WorkerTable, decode
    from tests.colocate.node.test_worker_table import TABLE

    table = WorkerTable(str(tmp_path))
    table.placements, table.done, table.refused, table.stopped_unknown = decode(
        {**TABLE, "placements": [{**TABLE["placements"][0], "priority": "opportunistic"}]})[:4]
    table.save()
    with open(table.path) as f:
        (saved,) = json.load(f)["placements"]
    assert saved["priority"] == "opportunistic" and "klass" not in saved  # the file's format is unchanged
    again = WorkerTable(str(tmp_path))
    again.load()
    (p,) = again.placements.values()
    assert type(p.klass) is JobClass and p.klass is JobClass.OPPORTUNISTIC
