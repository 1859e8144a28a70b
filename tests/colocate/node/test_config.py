"""colocate/node/config.py: the node's one configuration schema and its errors."""
import json
import subprocess
import sys

import pytest

from colocate.node.config import NodeConfig
from tests.support import REPO


def test_defaults_are_valid_and_adaptive():
    cfg = NodeConfig()
    assert cfg.policy == "adaptive" and cfg.slo_slowdown == 0.05 and cfg.gate
    assert 0 < cfg.slo_grow_fraction <= 1 and cfg.slo_patience_windows >= 1


def test_from_dict_sets_fields_and_widens_ints_to_floats():
    cfg = NodeConfig.from_dict({"policy": "pack", "slo_slowdown": 0, "slo_patience_windows": 3, "gate": False})
    assert (cfg.policy, cfg.slo_slowdown, cfg.slo_patience_windows, cfg.gate) == ("pack", 0.0, 3, False)
    assert isinstance(cfg.slo_slowdown, float)


@pytest.mark.parametrize("data, message", [
    ([], "config must be a JSON object"),
    ({"polcy": "pack"}, "unknown config key 'polcy'"),
    ({"policy": "fastest"}, "policy: unknown 'fastest'"),
    ({"slo_slowdown": "5%"}, "slo_slowdown: expected float, got str"),
    ({"slo_grow_fraction": 1.5}, "slo_grow_fraction: must be between 0 and 1"),
    ({"opp_start_share": -0.1}, "opp_start_share: must be between 0 and 1"),
    ({"opp_backoff": 1.0}, "opp_backoff: must be in (0, 1)"),
    ({"slo_patience_windows": 0}, "slo_patience_windows: must be >= 1"),
    ({"slo_patience_windows": 1.5}, "slo_patience_windows: expected int, got float"),
    ({"window_batches": 65}, "window_batches: at most 64"),
    ({"gate": 1}, "gate: expected bool, got int"),
    ({"heartbeat_s": float("inf")}, "heartbeat_s: must be a finite number >= 0"),
])
def test_invalid_config_names_the_key(data, message):
    with pytest.raises(ValueError) as info:
        NodeConfig.from_dict(data)
    assert message in str(info.value)


def test_from_file_errors(tmp_path):
    with pytest.raises(ValueError, match="cannot read config"):
        NodeConfig.from_file(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{policy: pack")
    with pytest.raises(ValueError, match="is not valid JSON"):
        NodeConfig.from_file(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"policy": "static", "static_share": 0.3}))
    assert NodeConfig.from_file(str(good)).static_share == 0.3


def test_node_with_a_bad_config_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "node.json"
    cfg.write_text(json.dumps({"slo_patience_windows": 0}))
    proc = subprocess.run([sys.executable, "-m", "colocate", "node", "--device", "sim", "--config", str(cfg),
                           "--endpoint", f"ipc://{tmp_path}/n.sock"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "slo_patience_windows" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("data, message", [
    ({"heartbeat_s": 0}, "heartbeat_s: expected a finite number in [0.01, 3600.0], got 0.0"),
    ({"heartbeat_s": 0.005}, "heartbeat_s: expected a finite number in [0.01, 3600.0], got 0.005"),
    ({"heartbeat_s": 5000}, "heartbeat_s: expected a finite number in [0.01, 3600.0], got 5000.0"),
    ({"liveness": 5000}, "liveness: expected an integer in [1, 1000], got 5000"),
])
def test_what_a_welcome_tells_a_job_takes_the_wires_bounds(data, message):
    """QA: these started a node that died at the first registration (its Welcome could not be built)."""
    with pytest.raises(ValueError) as info:
        NodeConfig.from_dict(data)
    assert str(info.value) == message


def test_the_wires_edges_are_accepted_and_welcomed():
    from colocate import protocol as P
    from colocate.gpus import GpuSpec
    from colocate.node.core import NodeCore, Send

    for hb, lv in ((P.HEARTBEAT_S.lo, P.LIVENESS.hi), (P.HEARTBEAT_S.hi, P.LIVENESS.lo)):
        core = NodeCore([GpuSpec(index=0, kind="sim", mem_total=1 << 30)],
                        NodeConfig.from_dict({"heartbeat_s": hb, "liveness": lv}), node_epoch=1)
        out = core.handle(P.Register(job_id="j", pid=1, gpu=0, priority="guaranteed", mem_request=None, sm_share=1.0,
                                     mem_cap=1 << 30, epoch=1), 0.0)
        (welcome,) = [c.msg for c in out if isinstance(c, Send) and isinstance(c.msg, P.Welcome)]
        assert (welcome.heartbeat_s, welcome.liveness) == (hb, lv)


@pytest.mark.parametrize("config, flags, fragment", [
    ({"heartbeat_s": 0}, [], "heartbeat_s: expected a finite number in [0.01, 3600.0]"),
    ({"liveness": 5000}, [], "liveness: expected an integer in [1, 1000]"),
])
def test_a_node_refuses_at_its_start_what_it_could_not_tell_a_job(tmp_path, config, flags, fragment):
    cfg = tmp_path / "node.json"
    cfg.write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "colocate", "node", "--device", "sim", "--config", str(cfg), *flags,
                           "--endpoint", f"ipc://{tmp_path}/n.sock"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"colocate node: error: {fragment}" + proc.stderr.split(fragment, 1)[-1].rstrip()]
