"""The architecture rules of pyproject.toml's ``[tool.importlinter]`` hold, and each one can fail.

``lint-imports`` (import-linter) checks the contracts on the real tree. To show that every
contract really guards something, each is broken on purpose in a copy of the packages (one
violating import added) and must be reported BROKEN there, while the others stay kept.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from colocate.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("colocate", "torch_hooks", "cluster")
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())", "--no-cache", "--config", "pyproject.toml"]


def contracts() -> list[dict]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(LINT, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_tree_keeps_every_contract():
    res = lint(REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert f"{len(contracts())} kept, 0 broken" in res.stdout


def test_every_command_is_in_the_independence_contract():
    independent = next(c for c in contracts() if c["id"] == "commands-independent")["modules"]
    on_disk = {f"colocate.cli.{p.stem}" for p in (REPO / "colocate" / "cli").glob("*.py")
               if not p.stem.startswith("_")}
    assert set(independent) == on_disk == set(COMMANDS.values())


# (contract id, file to edit, the violating import added to it)
VIOLATIONS = [
    ("no-torch-outside-the-job", "colocate/base/units.py", "import torch_hooks"),
    ("no-torch-outside-the-job", "cluster/spec.py", "import torch"),
    ("no-torch-outside-the-job", "colocate/ray/worker.py", "import torch_hooks"),  # an engine is called back
    ("colocate-layers", "colocate/base/units.py", "import colocate.cli"),
    ("colocate-layers", "colocate/node/core.py", "import colocate.demo"),
    ("commands-independent", "colocate/cli/ctl.py", "import colocate.cli.run"),
    ("job-runtime-uses-the-base-only", "torch_hooks/throttle.py", "import colocate.node.core"),
    ("packages-layered", "colocate/base/units.py", "import cluster.spec"),  # the base never knows the scheduler
    ("packages-layered", "cluster/server/service.py", "import colocate.node.agent"),  # scheduler and node
    ("packages-layered", "colocate/node/agent.py", "import cluster.core"),  # talk only over the protocol
    ("packages-layered", "colocate/launcher.py", "import colocate.node.agent"),  # the launcher is below the node
    ("packages-layered", "torch_hooks/throttle.py", "import colocate.launcher"),
    ("pure-policy-core", "cluster/plugins/fifo.py", "import time"),
    ("pure-policy-core", "cluster/core.py", "import cluster.server.journal"),
    ("pure-policy-core", "cluster/framework.py", "import os"),
    ("pure-policy-core", "cluster/state.py", "import threading"),
    ("pure-policy-core", "cluster/plugins/binpack.py", "import subprocess"),
    ("pure-policy-core", "cluster/capacity.py", "import socket"),
    ("pure-policy-core", "cluster/config.py", "import tomllib"),  # reading the config file is at the edge
    ("pure-policy-core", "cluster/config.py", "import cluster.config_file"),
    ("pure-policy-core", "cluster/predict/crosshw.py", "import time"),  # the run-time model is policy too
    ("core-never-knows-it-is-simulated", "cluster/core.py", "import cluster.sim"),
    ("cluster-layers", "cluster/recovery.py", "import cluster.core"),  # recovery sees the core as recovery.Host
    ("cluster-layers", "cluster/plugins/fifo.py", "import cluster.framework"),  # a plugin sees points.Handle
    ("cluster-layers", "cluster/points.py", "import cluster.framework"),  # the plugin API is below the framework
    ("cluster-layers", "cluster/selection.py", "import cluster.framework"),  # node selection is below the framework
    # the node's core (issue 23) is pure: no OS, no clock, no file half of the worker table
    ("pure-node-core", "colocate/node/core.py", "import os"),
    ("pure-node-core", "colocate/node/placements.py", "import subprocess"),
    ("pure-node-core", "colocate/node/state.py", "import time"),
    ("pure-node-core", "colocate/node/table.py", "import fcntl"),
    ("pure-node-core", "colocate/node/events.py", "import threading"),
    ("pure-node-core", "colocate/node/claims.py", "import socket"),
    ("pure-node-core", "colocate/node/pick.py", "import colocate.node.worker_table"),  # the table's file half
    ("pure-node-core", "colocate/gpus/spec.py", "import colocate.base.env"),  # the GPU specs' data half reads no environment
]


# issue 23's four probes: each of these imports passed lint-imports when it was filed; each must now fail it,
# reported by the contract named
PROBES = [
    pytest.param("colocate-layers", "colocate/node/core.py", "import colocate.ray.launch",
                 id="colocate.node.core->colocate.ray.launch"),
    pytest.param("engines-never-know-the-scheduler", "colocate/slurm/site.py", "import cluster.core",
                 id="colocate.slurm.site->cluster.core"),
    pytest.param("cluster-layers", "cluster/sim/engine.py", "import cluster.server.journal",
                 id="cluster.sim.engine->cluster.server.journal"),
    pytest.param("pure-node-core", "colocate/node/placements.py", "import subprocess",
                 id="colocate.node.placements->subprocess"),
]


@pytest.mark.parametrize("contract, path, line", PROBES)
def test_each_probe_of_issue_23_fails_lint_imports(tree_copy, contract, path, line):
    test_each_contract_fails_when_broken_on_purpose(tree_copy, contract, path, line)


def test_a_module_in_no_layer_breaks_the_layers(tree_copy):
    """The layers contracts are exhaustive: a new module of colocate or cluster must be given its layer."""
    for pkg, contract in (("colocate", "colocate-layers"), ("cluster", "cluster-layers")):
        added = tree_copy / pkg / "unlayered.py"
        added.write_text('"""A module no layer lists."""\n')
        try:
            res = lint(tree_copy)
        finally:
            added.unlink()
        name = next(c["name"] for c in contracts() if c["id"] == contract)
        assert res.returncode != 0 and re.sub(r"\s", "", name) + "BROKEN" in re.sub(r"\s", "", res.stdout), \
            res.stdout[-2000:]


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the three packages it imports, as grimp (import-linter's graph) reads the
    files: imports inside functions and under ``TYPE_CHECKING`` count, and so does ``colocate.base.engines``'s
    ``import_module`` of each engine's resolver."""
    import grimp

    from colocate.base.engines import ENGINES

    graph = grimp.build_graph(*PACKAGES, cache_dir=None, exclude_type_checking_imports=False)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    edges["colocate.base.engines"] |= {target.partition(":")[0] for target in ENGINES.values()}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles between files: each strongly connected set of more than one module, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


@pytest.fixture(scope="module")
def edges():
    return import_graph()


def test_no_import_cycle_between_files(edges):
    assert cycles(edges) == []


@pytest.mark.parametrize("source, target", [
    ("cluster.recovery", "cluster.core"),  # recovery through the core's fields (before issue 23)
    ("cluster.points", "cluster.framework"),  # the plugin API typed against the whole framework (ditto)
    ("colocate.ray.worker", "torch_hooks"),  # an engine's resolver importing the runtime (ditto)
    ("colocate.gpus.sim", "colocate.gpus"),  # a device module importing its package for GpuSpec (ditto)
])
def test_an_import_back_is_a_cycle(edges, source, target):
    back = {m: set(ts) for m, ts in edges.items()}
    back[source].add(target)
    assert any(source in c and target in c for c in cycles(back))


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory):
    root = tmp_path_factory.mktemp("arch")
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, root / pkg, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


@pytest.mark.parametrize("contract, path, line", VIOLATIONS, ids=[f"{c}:{p}" for c, p, _ in VIOLATIONS])
def test_each_contract_fails_when_broken_on_purpose(tree_copy, contract, path, line):
    assert contract in {c["id"] for c in contracts()}
    target = tree_copy / path
    original = target.read_text()
    target.write_text(original + f"\n{line}  # broken on purpose\n")
    try:
        res = lint(tree_copy)
    finally:
        target.write_text(original)
    name = next(c["name"] for c in contracts() if c["id"] == contract)
    assert res.returncode != 0, res.stdout[-2000:]
    # the summary line "<name> BROKEN" (wrapped at 80 columns, so compare without whitespace); an indirect
    # import may break other contracts too
    flat = re.sub(r"\s", "", res.stdout)
    assert re.sub(r"\s", "", name) + "BROKEN" in flat, res.stdout[-3000:]
