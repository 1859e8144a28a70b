"""Fixtures of the test-suite; the helpers they use live in ``tests/support.py``.

Anything that installs the simulated allocator or the runtime into a process is
process-global and irreversible, so those tests run their code in a fresh
Python subprocess (``run_py`` / ``run_py_json``) or under the real launcher
(``colocate``), never in the pytest process.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests import support as S

# ---------------------------------------------------------------- running the suite on several workers (xdist)
#
# `addopts` runs the suite on pytest-xdist workers (`--dist loadgroup`): most of its time is spent waiting on
# daemons' timers (heartbeats, leases, fault windows) rather than computing, so it runs more workers than the
# reference machine has cores (three on two): one test's waits overlap the others' work. Every test is in one
# group (one worker runs a group's tests in order), its module's, so that module-scoped fixtures are set up once,
# except:
# - SIM_CORE: tests whose point is how the simulated GPU's core is shared (a job's busy fraction under a share,
#   a low-priority job getting the core): they pin their jobs to the same core, so they run one after another.
# - SPREAD: modules of independent, long tests (each its own cluster, node or job), spread over the workers.
# Groups run longest first (a test's declared `timeout`, else its `slow` mark, stands for its length), so that
# no long test starts last.
SIM_CORE = {"tests/torch_hooks/test_boundaries.py::test_hand_update_loop_finds_backward_boundaries_and_holds_the_share",
            "tests/colocate/test_launcher.py::test_sm_share_half_holds_busy_fraction",
            "tests/torch_hooks/test_sim_device.py::test_low_priority_job_gets_the_core_only_while_the_other_waits"}
SPREAD = {"tests/integration/test_cluster.py", "tests/integration/test_node.py",
          "tests/integration/test_node_placements.py", "tests/integration/test_multiworker.py",
          "tests/integration/test_examples_checkpoint.py", "tests/integration/test_examples.py",
          "tests/integration/test_identity.py", "tests/colocate/cli/test_cluster_commands.py",
          "tests/torch_hooks/test_boundaries.py", "tests/test_packaging.py"}


def _length(item) -> float:
    timeout = item.get_closest_marker("timeout")
    if timeout is not None and timeout.args:
        return float(timeout.args[0])
    return 60.0 if item.get_closest_marker("slow") is not None else 0.0


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids ("@group")
def pytest_collection_modifyitems(config, items):
    groups: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        group = ("sim-core" if item.nodeid.split("[")[0] in SIM_CORE else item.nodeid if module in SPREAD
                 else module)
        item.add_marker(pytest.mark.xdist_group(group))
        item.stash[_GROUP] = group
        groups[group] = max(groups.get(group, 0.0), _length(item))
    order = {g: i for i, g in enumerate(groups)}
    items.sort(key=lambda it: (-groups[it.stash[_GROUP]], order[it.stash[_GROUP]]))


_GROUP = pytest.StashKey[str]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that started processes through the ``procs`` fixture carries the tail of each one's log
    in its report (a daemon's view of a timeout on a loaded machine), taken before teardown removes them."""
    outcome = yield
    rep = outcome.get_result()
    procs = getattr(item, "funcargs", {}).get("procs")
    if rep.failed and rep.when == "call" and isinstance(procs, S.Procs):
        for name, tail in procs.log_tails(LOG_TAIL_LINES):
            rep.sections.append((f"log of {name} (last {LOG_TAIL_LINES} lines)", tail))


LOG_TAIL_LINES = 60


def pytest_configure(config):
    """The processes the suite starts (daemons, launchers, jobs: hundreds) import this checkout's packages and torch.
    Where the environment says PYTHONDONTWRITEBYTECODE, each would compile the checkout's modules again at its
    start; for the session, Python writes bytecode as it does by default instead: the checkout's modules are
    compiled once into their ``__pycache__`` folders (ignored by git), and installed packages (torch) keep
    using the bytecode their install wrote. Set once, by the first pytest process (xdist's workers inherit it)."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        config.stash[_NO_BYTECODE] = os.environ.pop("PYTHONDONTWRITEBYTECODE")


def pytest_unconfigure(config):
    if _NO_BYTECODE in config.stash:
        os.environ["PYTHONDONTWRITEBYTECODE"] = config.stash[_NO_BYTECODE]


_NO_BYTECODE = pytest.StashKey[str]()


@pytest.fixture(scope="session", autouse=True)
def private_keys(tmp_path_factory):
    """Every scheduler, node and client of the suite (and the processes it starts, which inherit the
    environment) keeps its default CURVE keys in a folder of the session, never in ~/.config."""
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    yield os.environ["XDG_CONFIG_HOME"]
    if old is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = old


@pytest.fixture(scope="session")
def run_py():
    return S.run_py


@pytest.fixture(scope="session")
def run_py_json():
    return S.run_py_json


@pytest.fixture(scope="session")
def colocate():
    return S.colocate_run


@pytest.fixture
def job_env():
    """A clean environment for a subprocess (no inherited COLOCATE_* variables)."""
    return S.clean_env()


@pytest.fixture(scope="session")
def repo():
    return S.REPO


@pytest.fixture(scope="session")
def sim_ext():
    """Build (or find cached) the simulated-GPU allocator once, so job start-up times are short."""
    proc = subprocess.run([S.PY, "-c", "from torch_hooks import _ext; _ext.load()"], cwd=S.REPO, env=S.child_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _remove_gates(endpoint: str) -> None:
    """The shared-memory files of a test's node (its GPUs' gate blocks and memory ledgers), which a node killed by
    the test leaves behind."""
    from colocate.gpus.ledger import ledger_path
    from torch_hooks.gate import gate_path

    for gpu in range(4):
        for path in (gate_path(endpoint, gpu), ledger_path(endpoint, gpu)):
            try:
                os.unlink(path)
            except OSError:
                pass


@pytest.fixture
def ipc_dir():
    """A short private directory (ipc socket paths are limited to ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cl-"))
    yield path
    _remove_gates(f"ipc://{path}/node.sock")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def module_ipc_dir():
    """``ipc_dir`` shared by the tests of one module."""
    path = Path(tempfile.mkdtemp(prefix="cm-"))
    yield path
    _remove_gates(f"ipc://{path}/node.sock")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def procs(ipc_dir):
    """The test's background processes, SIGKILLed (by process group) when it ends, pass or fail."""
    p = S.Procs(ipc_dir)
    yield p
    p.cleanup()
