"""colocate.base.env: the one table of COLOCATE_* variables and its typed view."""
import os
from dataclasses import fields

import pytest

from colocate.base import env as envmod
from colocate.base.env import DEFAULT_SIM_GPU_MEM, NAMES, PREFIX, VARIABLES, JobEnv, markdown_table
from tests.support import REPO


def test_variables_are_prefixed_unique_and_documented():
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names))
    assert set(names) == NAMES
    for v in VARIABLES:
        assert v.name.startswith(PREFIX)
        assert v.name == v.name.upper()
        assert v.meaning.strip(), v.name
        assert v.default is not None


def test_every_variable_is_used_by_the_code():
    """The table is the source of truth: no variable is documented but never read or written."""
    sources = ""
    for pkg in ("colocate", "torch_hooks"):
        for path in (REPO / pkg).rglob("*.py"):
            if path.name == "env.py" and path.parent.name == "base":
                continue
            sources += path.read_text()
    # env.py reads the variables through JobEnv; count those uses too (outside the table).
    env_src = (REPO / "colocate" / "base" / "env.py").read_text()
    body = env_src.split("NAMES = frozenset", 1)[1]
    for v in VARIABLES:
        assert v.name in body or v.name in sources, f"{v.name} is documented but never used"


def test_markdown_table_has_one_row_per_variable():
    table = markdown_table().splitlines()
    assert table[0].startswith("| variable")
    rows = table[2:]
    assert len(rows) == len(VARIABLES)
    for v, row in zip(VARIABLES, rows):
        assert row.startswith(f"| `{v.name}` |")


def test_defaults_from_empty_environment():
    e = JobEnv.from_environ({})
    assert e.enabled is False
    assert e.job_id == str(os.getpid())
    assert e.device == "sim"
    assert e.gpu == 0
    assert e.gpu_mem is None
    assert e.sm_share == 1.0
    assert e.klass == "guaranteed"
    assert e.on_cap == "host"
    assert e.stats_dir is None and e.node is None and e.sim_core is None
    assert e.sim_gpu_mem == DEFAULT_SIM_GPU_MEM == 16 << 30
    assert e.sim_host_gbps == 2.0
    assert e.log == "warning"
    assert e.yield_via == ("priority",)


def test_empty_values_count_as_unset():
    e = JobEnv.from_environ({name: "" for name in NAMES})
    d = JobEnv.from_environ({})
    assert e == d


def test_parses_every_field():
    raw = {
        "COLOCATE_ENABLED": "1",
        "COLOCATE_JOB_ID": "job-7",
        "COLOCATE_DEVICE": "cuda",
        "COLOCATE_GPU": "3",
        "COLOCATE_GPU_MEM": "2GiB",
        "COLOCATE_SM_SHARE": "0.25",
        "COLOCATE_PRIORITY": "opportunistic",
        "COLOCATE_ON_CAP": "error",
        "COLOCATE_STATS_DIR": "/tmp/stats",
        "COLOCATE_NODE": "ipc:///tmp/node.sock",
        "COLOCATE_SIM_CORE": "1",
        "COLOCATE_SIM_GPU_MEM": "8GiB",
        "COLOCATE_SIM_HOST_GBPS": "4.5",
        "COLOCATE_LOG": "debug",
        "COLOCATE_YIELD_VIA": "gate",
    }
    e = JobEnv.from_environ(raw)
    assert e == JobEnv(
        enabled=True, job_id="job-7", device="cuda", gpu=3, gpu_mem=2 << 30, sm_share=0.25,
        klass="opportunistic", on_cap="error", stats_dir="/tmp/stats", node="ipc:///tmp/node.sock",
        sim_core=1, sim_gpu_mem=8 << 30, sim_host_gbps=4.5, log="debug", yield_via=("gate",),
    )


@pytest.mark.parametrize("raw, want", [
    ("priority,gate", ("priority", "gate")),
    ("gate, priority", ("priority", "gate")),  # order and spaces do not matter
    ("gate,gate", ("gate",)),
    ("priority", ("priority",)),
    ("none", ()),
])
def test_yield_via(raw, want):
    assert JobEnv.from_environ({"COLOCATE_YIELD_VIA": raw}).yield_via == want
    assert JobEnv.from_environ(JobEnv(job_id="x", yield_via=want).to_environ()).yield_via == want


@pytest.mark.parametrize("value", ["0", "true", "yes", "2", "on"])
def test_enabled_only_by_exactly_one(value):
    assert JobEnv.from_environ({"COLOCATE_ENABLED": value}).enabled is False


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("COLOCATE_GPU", "5")
    monkeypatch.setenv("COLOCATE_SM_SHARE", "0.5")
    e = JobEnv.from_environ()
    assert e.gpu == 5 and e.sm_share == 0.5


@pytest.mark.parametrize(
    "name, value",
    [
        ("COLOCATE_DEVICE", "tpu"),
        ("COLOCATE_DEVICE", "auto"),  # the launcher resolves auto; the job only sees sim|cuda
        ("COLOCATE_GPU", "-1"),
        ("COLOCATE_GPU", "x"),
        ("COLOCATE_GPU", "1.5"),
        ("COLOCATE_GPU_MEM", "12XB"),
        ("COLOCATE_GPU_MEM", "abc"),
        ("COLOCATE_SM_SHARE", "1.5"),
        ("COLOCATE_SM_SHARE", "-0.1"),
        ("COLOCATE_SM_SHARE", "nan"),
        ("COLOCATE_PRIORITY", "best-effort"),
        ("COLOCATE_ON_CAP", "swap"),
        ("COLOCATE_SIM_CORE", "-2"),
        ("COLOCATE_SIM_GPU_MEM", "lots"),
        ("COLOCATE_SIM_HOST_GBPS", "0"),
        ("COLOCATE_SIM_HOST_GBPS", "-1"),
        ("COLOCATE_SIM_HOST_GBPS", "nan"),
        ("COLOCATE_SIM_HOST_GBPS", "fast"),
        ("COLOCATE_YIELD_VIA", "nice"),
        ("COLOCATE_YIELD_VIA", "gate,none"),
        ("COLOCATE_YIELD_VIA", ","),
        ("COLOCATE_ITERATIONS", "0"),
        ("COLOCATE_ITERATIONS", "many"),
        ("COLOCATE_EPOCHS", "-3"),
        ("COLOCATE_EPOCHS", "2.5"),
    ],
)
def test_bad_value_names_the_variable(name, value):
    with pytest.raises(ValueError) as info:
        JobEnv.from_environ({name: value})
    msg = str(info.value)
    assert msg.startswith(f"{name}={value!r}: "), msg
    assert "\n" not in msg


def test_to_environ_round_trips():
    e = JobEnv(
        enabled=True, job_id="j1", device="sim", gpu=2, gpu_mem=3 << 20, sm_share=0.3,
        klass="opportunistic", on_cap="error", stats_dir="/tmp/s", node="tcp://h:1",
        sim_core=0, sim_gpu_mem=4 << 30, sim_host_gbps=1.25, log="info", iterations=5000, epochs=3,
    )
    out = e.to_environ()
    assert (out["COLOCATE_ITERATIONS"], out["COLOCATE_EPOCHS"]) == ("5000", "3")
    assert set(out) <= NAMES
    assert all(isinstance(v, str) for v in out.values())
    assert JobEnv.from_environ(out) == e


def test_to_environ_omits_unset_optionals():
    out = JobEnv(job_id="x").to_environ()
    for name in ("COLOCATE_GPU_MEM", "COLOCATE_STATS_DIR", "COLOCATE_NODE", "COLOCATE_SIM_CORE", "COLOCATE_ITERATIONS",
                 "COLOCATE_EPOCHS"):
        assert name not in out
    assert out["COLOCATE_ENABLED"] == "0"
    assert JobEnv.from_environ(out) == JobEnv(job_id="x")


@pytest.mark.parametrize("share", [0.0, 0.1, 1 / 3, 0.999, 1.0])
def test_share_round_trips_exactly(share):
    assert JobEnv.from_environ(JobEnv(job_id="x", sm_share=share).to_environ()).sm_share == share


def test_jobenv_fields_cover_the_table():
    """Every per-job variable the launcher writes has a JobEnv field (CHAIN_SITECUSTOMIZE is launcher-internal)."""
    field_names = {f.name for f in fields(JobEnv)}
    for v in VARIABLES:
        if v.name == "COLOCATE_CHAIN_SITECUSTOMIZE" or v.scope in ("client", "engine", "node"):
            continue
        # the job class keeps its documented variable name; in code it is ``klass`` ("priority" is the device's)
        attr = {"COLOCATE_PRIORITY": "klass"}.get(v.name, v.name[len(PREFIX):].lower())
        assert attr in field_names, v.name
    assert envmod.DEVICES == ("sim", "cuda")


@pytest.mark.parametrize("env, gpu, gpus, index", [
    ({"COLOCATE_GPUS": "2,5"}, 2, (2, 5), 0),  # no LOCAL_RANK: the first
    ({"COLOCATE_GPUS": "2,5", "LOCAL_RANK": "1"}, 5, (2, 5), 1),  # torchrun's worker 1: GPU number 1, cuda:1
    ({"COLOCATE_GPUS": "2,5", "LOCAL_RANK": "3"}, 5, (2, 5), 1),  # more workers than GPUs: modulo the list
    ({"COLOCATE_GPUS": "2,5", "COLOCATE_GPU": "5"}, 5, (2, 5), 1),  # an explicit one wins
    ({"COLOCATE_GPU": "3", "LOCAL_RANK": "1"}, 3, (), 0),  # the single-GPU form
    ({"COLOCATE_GPUS": " 1 , 0 "}, 1, (1, 0), 0),
])
def test_a_process_gpu_comes_from_the_job_gpus_and_local_rank(env, gpu, gpus, index):
    e = JobEnv.from_environ(env)
    assert (e.gpu, e.gpus, e.device_index) == (gpu, gpus, index)
    back = JobEnv.from_environ({**e.to_environ(), **{k: v for k, v in env.items() if not k.startswith("COLOCATE_")}})
    assert (back.gpu, back.gpus) == (gpu, gpus)


@pytest.mark.parametrize("name, value", [("COLOCATE_GPUS", "0,0"), ("COLOCATE_GPUS", "x"), ("COLOCATE_GPUS", "-1"),
                                         ("COLOCATE_GPUS", "0,,1")])
def test_bad_gpu_lists_name_the_variable(name, value):
    with pytest.raises(ValueError) as info:
        JobEnv.from_environ({name: value})
    assert str(info.value).startswith(f"{name}={value!r}: ")


def test_an_explicit_gpu_outside_the_job_gpus_is_an_error():
    with pytest.raises(ValueError, match="COLOCATE_GPU=3: must be one of COLOCATE_GPUS"):
        JobEnv.from_environ({"COLOCATE_GPUS": "0,1", "COLOCATE_GPU": "3"})


def test_torchrun_variables_give_the_worker_id():
    e = JobEnv.from_environ({"COLOCATE_JOB_ID": "j", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"})
    assert (e.rank, e.local_rank, e.world_size, e.worker_id) == (3, 1, 4, "j/3")
    assert JobEnv.from_environ({"COLOCATE_JOB_ID": "j"}).worker_id == "j"
    assert JobEnv.from_environ({"COLOCATE_JOB_ID": "j", "RANK": "x"}).worker_id == "j"  # not ours to reject


@pytest.mark.parametrize("env, rank, local_rank, world, worker", [
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, 3, 1, 4, "j/3"),  # torchrun's names
    ({"COLOCATE_RANK": "2", "COLOCATE_LOCAL_RANK": "0", "COLOCATE_WORLD_SIZE": "3", "RANK": "9"}, 2, 0, 3, "j/2"),
    ({"RANK": "x"}, None, None, None, "j"),  # torchrun's are not colocate's to reject
])
def test_ranks_come_from_colocate_names_before_torchrun_names(env, rank, local_rank, world, worker):
    e = JobEnv.from_environ({"COLOCATE_JOB_ID": "j", **env})
    assert (e.rank, e.local_rank, e.world_size, e.worker_id) == (rank, local_rank, world, worker)


def test_engine_partition_pick_and_required_round_trip():
    raw = {"COLOCATE_ENGINE": "ray", "COLOCATE_PARTITION": "1", "COLOCATE_SM_SHARE": "0.5",
           "COLOCATE_GPU_MEM": "1GiB", "COLOCATE_NODE_REQUIRED": "1", "COLOCATE_NODE_WAIT_S": "2",
           "COLOCATE_NODE": "ipc:///tmp/n.sock"}
    e = JobEnv.from_environ(raw)
    assert (e.engine, e.partition, e.node_required, e.node_wait_s) == ("ray", True, True, 2.0)
    assert JobEnv.from_environ(e.to_environ()).partition
    pick = JobEnv.from_environ({"COLOCATE_GPUS": "node", "COLOCATE_PRIORITY": "opportunistic",
                                "COLOCATE_NODE": "ipc:///tmp/n.sock"})
    assert pick.pick_gpu and pick.gpus == () and pick.gpu == 0
    assert JobEnv.from_environ(pick.to_environ()).pick_gpu


@pytest.mark.parametrize("env, words", [
    ({"COLOCATE_RANK": "-1"}, "COLOCATE_RANK='-1': "),
    ({"COLOCATE_WORLD_SIZE": "0"}, "COLOCATE_WORLD_SIZE='0': "),
    ({"COLOCATE_PARTITION": "yes"}, "COLOCATE_PARTITION='yes': must be 0 or 1"),
    ({"COLOCATE_NODE_REQUIRED": "2"}, "COLOCATE_NODE_REQUIRED='2': must be 0 or 1"),
    ({"COLOCATE_NODE_REQUIRED": "1"}, "COLOCATE_NODE_REQUIRED=1: COLOCATE_NODE is not set"),
    ({"COLOCATE_NODE_WAIT_S": "0"}, "COLOCATE_NODE_WAIT_S='0': "),
    ({"COLOCATE_PARTITION": "1", "COLOCATE_SM_SHARE": "0.5"}, "needs both COLOCATE_SM_SHARE and COLOCATE_GPU_MEM"),
    ({"COLOCATE_PARTITION": "1", "COLOCATE_SM_SHARE": "0.5", "COLOCATE_GPU_MEM": "1GiB",
      "COLOCATE_PRIORITY": "opportunistic"}, "a partition is guaranteed"),
    ({"COLOCATE_GPUS": "node", "COLOCATE_NODE": "ipc:///tmp/n.sock"}, "only an opportunistic worker"),
    ({"COLOCATE_GPUS": "node", "COLOCATE_PRIORITY": "opportunistic"}, "with COLOCATE_NODE"),
])
def test_bad_engine_variables_are_one_line(env, words):
    with pytest.raises(ValueError) as info:
        JobEnv.from_environ(env)
    assert words in str(info.value) and "\n" not in str(info.value)
