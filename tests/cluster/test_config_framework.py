"""Policy config (TOML, presets, errors), the framework's points and caches, the state's indexes."""

from __future__ import annotations

import random

import pytest

from cluster.config import PRESETS, parse_config, preset
from cluster.config_file import load_config, resolve
from cluster.core import SchedulerCore
from cluster.points import REGISTRY, Plugin, register, unschedulable
from cluster.spec import MILLI, NodeSpec
from cluster.state import Alloc, ClusterState
from cluster.statement import Statement
from tests.cluster.helpers import config, job, make_core, run, starts, submit


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_a_core(name):
    cfg = preset(name)
    assert cfg.plugins[0] == "fit"
    core = SchedulerCore(cfg, random.Random(0))
    assert core.counters()["pending"] == 0
    assert resolve(name).plugins == cfg.plugins


def test_load_toml(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('plugins = ["multi_queue", "gang", "binpack", "backfill", "predictor"]\n'
                    '[scheduler]\nfeasible_nodes = 2\n'
                    '[plugin.multi_queue]\nqueues = ["research"]\nsize_queues = { small = 2, large = inf }\n'
                    '[plugin.backfill]\ndepth = 10\n')
    cfg = load_config(path)
    assert cfg.plugins == ("fit", "multi_queue", "gang", "binpack", "backfill", "predictor")
    assert cfg.scheduler["feasible_nodes"] == 2 and cfg.params["backfill"]["depth"] == 10
    assert cfg.params["multi_queue"]["queues"] == ("research",)
    assert resolve(str(path)).plugins == cfg.plugins


@pytest.mark.parametrize("raw, message", [
    ({"plugins": ["fifo"], "nope": 1}, "nope: unknown key"),
    ({"plugins": ["fifo", "nonesuch"]}, "plugins: unknown plugin 'nonesuch'"),
    ({"plugins": []}, "plugins: expected a non-empty list"),
    ({"plugins": ["fifo", "fifo"]}, "listed twice"),
    ({"plugins": ["gang", "binpack"]}, "exactly one queue-sort plugin"),
    ({"plugins": ["fifo", "multi_queue"]}, "exactly one queue-sort plugin"),
    ({"plugins": ["fifo"], "plugin": {"backfill": {"depth": 3}}}, "plugin.backfill: parameters for a plugin not in plugins"),
    ({"plugins": ["fifo", "backfill"], "plugin": {"backfill": {"dept": 3}}}, "plugin.backfill.dept: unknown key"),
    ({"plugins": ["fifo", "backfill"], "plugin": {"backfill": {"depth": 0}}}, "plugin.backfill.depth: bad value 0"),
    ({"plugins": ["fifo", "backfill"], "plugin": {"backfill": {"depth": "3"}}}, "plugin.backfill.depth: expected an integer"),
    ({"plugins": ["fifo", "opportunistic"], "plugin": {"opportunistic": {"util_threshold": 1.5}}}, "util_threshold: bad value"),
    ({"plugins": ["multi_queue"], "plugin": {"multi_queue": {"size_queues": {"a": 4, "b": 2}}}}, "size_queues: bad value"),
    ({"plugins": ["multi_queue"], "plugin": {"multi_queue": {"queues": ["small"]}}}, "'small' used twice"),
    ({"plugins": ["fifo", "quota"], "plugin": {"quota": {"tenant": "group"}}}, "tenant: must be one of queue, user"),
    ({"plugins": ["fifo"], "scheduler": {"feasible_nodes": 0}}, "scheduler.feasible_nodes: bad value"),
])
def test_config_errors_name_the_key(raw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        parse_config(raw)
    assert "\n" not in str(err.value)


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('plugins = ["fifo"]\n[plugins.fifo]\n')
    with pytest.raises(ValueError, match=r"not valid TOML.*\[plugin\.NAME\]"):
        load_config(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize("content, message", [
    (b'plugins = ["fifo", "gang", "binpack"]\nfoo = 1\n', "foo: unknown key"),
    (b'plugins = ["fifo", "nonesuch"]\n', "plugins: unknown plugin 'nonesuch'"),
    (b'plugins = ["fifo", "backfill"]\n[plugin.backfill]\ndepth = 0\n', "plugin.backfill.depth: bad value 0"),
    (b"\xff\xfe", "not a UTF-8 text file"),
    (b'plugins = ["fifo"]\n# caf\xe9\n', "not a UTF-8 text file"),
])
def test_every_config_file_error_is_one_line_naming_the_file(tmp_path, content, message):
    """As ``cluster.config_file`` promises: a schema error (which names the key) and an undecodable file both name
    the file, in one line; ``resolve`` (what ``--policy FILE`` and the scheduler's ``--config`` call) says the same."""
    path = tmp_path / "policy.toml"
    path.write_bytes(content)
    for read in (load_config, resolve):
        with pytest.raises(ValueError) as e:
            read(str(path))
        assert str(e.value).startswith(f"{path}: ") and message in str(e.value) and "\n" not in str(e.value)
        assert str(e.value).count(str(path)) == 1
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        resolve("nope")
    with pytest.raises(ValueError, match="unknown policy"):
        preset("nope")


@register
class _RejectPermit(Plugin):
    """Test plugin: refuses every permit, records unreserve calls, implements only those."""

    name = "test_reject_permit"

    def __init__(self, params):
        super().__init__(params)
        self.unreserved = 0

    def unreserve(self, req, stmt):
        self.unreserved += 1

    def permit(self, req, stmt):
        return unschedulable(self.name, "no")


def test_framework_collects_only_implemented_points_and_undoes_a_refused_permit():
    core = make_core(config(["fifo", "gang", "binpack", "test_reject_permit"]), [("n0", 2)])
    fw = core.fw
    plugin = fw.plugin("test_reject_permit")
    assert [f.__self__.name for f in fw.pt["permit"]["guaranteed"]] == ["gang", "test_reject_permit"]
    assert [f.__self__.name for f in fw.pt["filter"]["guaranteed"]] == ["fit"]
    assert fw.pt["score"]["opportunistic"] == []  # binpack serves guaranteed jobs only
    out = submit(core, job("j", workers=2))
    assert starts(out) == {} and core.state.allocs == {} and plugin.unreserved == 1
    assert core.blocked()["default"] == ("j", "test_reject_permit: no")
    assert "test_reject_permit" in REGISTRY


def test_a_failed_shape_is_not_tried_again_in_a_cycle():
    cfg = config(["fifo", "gang", "binpack", "backfill"])
    core = make_core(cfg, [("n0", 8)])
    run(core, job("r", gpus=8, estimate_s=100.0))
    submit(core, *[job(f"q{i}", gpus=4, t=i, estimate_s=1.0) for i in range(50)], now=1.0)
    before = core.counters()["attempts"]
    core.schedule(2.0)
    assert core.counters()["attempts"] - before == 1  # the head; 49 backfill candidates of one shape skipped


def test_cannot_fit_now_is_answered_without_scanning_nodes():
    core = make_core("gang-binpack", [(f"n{i}", 8) for i in range(200)])
    run(core, *[job(f"f{i}", gpus=8, t=i) for i in range(200)])
    calls = []
    fw = core.fw
    order = fw._order["guaranteed"]
    fw._order["guaranteed"] = lambda req: (calls.append(1), order(req))[1]
    submit(core, job("x", gpus=1, t=500), now=1.0)
    assert calls == [] and core.blocked()["default"][1] == "fit: needs 1 free GPUs, 0 free"


@pytest.mark.parametrize(("ranked", "filtered"), [(False, 3), (True, 1)])
def test_feasible_nodes_bounds_filtering(ranked, filtered):
    """Filtering stops after ``feasible_nodes`` feasible nodes; where the node order is ranked by the class's
    only scorer (binpack's, ``order_ranked``), at the first feasible node the pick accepts: the same node."""
    cfg = config(["fifo", "gang", "binpack"], scheduler={"feasible_nodes": 3})
    core = make_core(cfg, [(f"n{i}", 8) for i in range(100)])
    select = core.fw._selectors["guaranteed"]
    if not ranked:
        select.ranked = lambda req: False
    seen = []
    fit = select.filters[0]
    select.filters = [lambda req, node: (seen.append(node.node_id), fit(req, node))[1]]
    run(core, job("j", gpus=2))
    assert len(seen) == filtered
    assert [s.node_id for s in core.running()["j"].slots] == ["n0"]


def test_statement_commit_and_discard():
    state = ClusterState()
    state.add_node(NodeSpec("n0", 2), 1)
    node = state.nodes["n0"]
    stmt = Statement(state).begin("j.1", "guaranteed")
    stmt.allocate(0, node, (0,), MILLI, 0, 0, 0, 0.0)
    assert state.free_gpus() == 1
    with pytest.raises(RuntimeError, match="still open"):
        stmt.begin("k.1", "guaranteed")
    stmt.allocate(1, node, (1,), MILLI, 0, 0, 0, 0.0)
    stmt.discard()
    assert state.free_gpus() == 2 and state.allocs == {}
    stmt.begin("j.1", "guaranteed").allocate(0, node, (1,), MILLI, 0, 0, 0, 0.0)
    p = stmt.commit("j")
    assert p.placement_id == "j.1" and [s.gpus for s in p.slots] == [(1,)] and len(stmt) == 0
    state.check_invariants()


def test_state_indexes_and_invariants():
    st = ClusterState()
    st.add_node(NodeSpec("a", 4, gpu_model="A100"), 1)
    st.add_node(NodeSpec("b", 2), 1)
    assert st.free_gpus() == 6 and st.free_gpus("A100") == 4 and st.capacity() == 6
    assert st.worker_slots("", 2, 99) == 3 and st.worker_slots("", 3, 99) == 1
    st.apply(Alloc("p.1", 0, "a", (0,), 500, 0, 0, 0, "guaranteed"))
    assert st.free_gpus("A100") == 3 and [g.index for g in st.partial_gpus("A100", 400)] == [0]
    assert list(st.partial_gpus("A100", 600)) == [] and st.max_partial_free("") == 500
    assert [n.node_id for n in st.nodes_by_free("", 1, 9)] == ["b", "a"]
    st.report_gpu("a", 1, 0.05, 0)
    st.report_gpu("a", 2, 0.9, 0)
    order = [(g.node.node_id, g.index) for g in st.gpus_by_util("A100", 0.8)]
    assert order[0] == ("a", 0) and ("a", 2) not in order  # beside a guaranteed share first at 0%
    st.check_invariants()
    released = st.node_down("a")
    assert [a.pid for a in released] == ["p.1"] and st.free_gpus() == 2 and st.free_gpus("A100") == 0
    st.check_invariants()
    # an over-allocation is caught
    st.apply(Alloc("q.1", 0, "b", (0,), MILLI, 0, 0, 0, "guaranteed"))
    st.nodes["b"].gpus[0].milli = 1500
    with pytest.raises(AssertionError):
        st.check_invariants()


def test_same_seed_same_decisions():
    def drive(seed):
        core = make_core("antman", [(f"n{i}", 4) for i in range(4)], seed=seed)
        out = submit(core, *[job(f"j{i}", gpus=1 + i % 3, workers=1 + i % 2, t=i,
                                 klass="opportunistic" if i % 4 == 0 else "guaranteed") for i in range(20)])
        return out
    assert drive(1) == drive(1)
