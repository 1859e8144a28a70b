"""A Slurm site's colocate set-up: the lines it adds, and the checks ``colocate slurm config`` runs.

``SiteSettings`` are the site's choices (node coordinator endpoint, shards per GPU, device kind); the
SPANK plugin takes them as plugstack.conf arguments and the TaskProlog as its settings block, both
rendered here so the two stay the same. ``gres_shards(text, node)`` reads gres.conf to check the shards
per GPU the site states against what Slurm gives out.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from colocate.base.vocab import DeviceKind

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "spank_colocate.c"
TASK_PROLOG = HERE / "task_prolog.sh"
INJECT_DIR = HERE.parent / "_inject"
PROJECT_ROOT = HERE.parent.parent
ENFORCE = ("shard", "all", "none")  # which tasks are under colocate without asking: shard holders, any GPU, none


@dataclass(frozen=True)
class SiteSettings:
    """What every task of the site gets; ``node`` may contain ``%n`` (the Slurm node's name)."""

    node: str
    shards: int | None = None  # shards per GPU, as gres.conf gives them out
    device: str = DeviceKind.CUDA
    sim_gpu_mem: str | None = None
    enforce: str = "shard"  # shard: a task holding shards is always fenced; all: any Slurm GPU; none: only askers
    opp_gres: str | None = None  # a count-only GRES whose jobs are opportunistic (e.g. colocate_opp)
    inject: str = str(INJECT_DIR)
    root: str = str(PROJECT_ROOT)

    def arguments(self) -> list[str]:
        """The plugin's plugstack.conf arguments (``name=value``)."""
        args = [f"inject={self.inject}", f"root={self.root}", f"node={self.node}"]
        if self.shards is not None:
            args.append(f"shards={self.shards}")
        args.append(f"device={self.device}")
        if self.sim_gpu_mem:
            args.append(f"sim_gpu_mem={self.sim_gpu_mem}")
        if self.enforce != "shard":
            args.append(f"enforce={self.enforce}")
        if self.opp_gres:
            args.append(f"opp_gres={self.opp_gres}")
        return args


def build_command(out: str | Path) -> list[str]:
    """The one command that builds the plugin (needs gcc and libslurm-dev's ``slurm/spank.h``)."""
    return ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-o", str(out), str(SOURCE)]


def plugstack_line(plugin: str | Path, settings: SiteSettings) -> str:
    """The plugstack.conf line: ``required`` (a task that asks for colocate never runs without it)."""
    return " ".join(["required", str(plugin), *settings.arguments()])


PLUGIN_NAME = "spank_colocate.so"


def with_plugstack_line(text: str, line: str) -> str:
    """plugstack.conf ``text`` with ``line`` in place of its colocate lines (those loading a
    ``spank_colocate.so``; the first one's place is kept), or added at the end; every other line kept.
    Idempotent: writing the same line twice leaves one. Pure."""
    out, placed = [], False
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) >= 2 and words[1].endswith(PLUGIN_NAME):
            if not placed:
                out.append(line)
                placed = True
            continue
        out.append(raw)
    if not placed:
        out.append(line)
    return "\n".join(out) + "\n"


def task_prolog(settings: SiteSettings) -> str:
    """The TaskProlog script with the site's settings filled in."""
    values = {"INJECT": settings.inject, "ROOT": settings.root, "NODE": settings.node,
              "SHARDS": "" if settings.shards is None else str(settings.shards), "DEVICE": settings.device,
              "SIM_GPU_MEM": settings.sim_gpu_mem or "", "ENFORCE": settings.enforce,
              "OPP_GRES": settings.opp_gres or ""}
    lines = TASK_PROLOG.read_text().splitlines(keepends=True)
    out = []
    for line in lines:
        name = line.split("=", 1)[0]
        if name in values and line.startswith(f"{name}=\""):
            line = f"{name}={shlex.quote(values[name])}\n"
        out.append(line)
    return "".join(out)


# ---------------------------------------------------------------- gres.conf


def expand_hosts(expr: str) -> list[str]:
    """Slurm's host list form: ``n[1-3,7],gpu0`` -> n1 n2 n3 n7 gpu0 (one bracket per name)."""
    names = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", expr):
        m = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
        if not m:
            names.append(part)
            continue
        head, ranges, tail = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{head}{i:0{width}d}{tail}")
    return names


def gres_shards(text: str, node: str) -> tuple[int, int] | None:
    """(shards, GPUs they are spread on) that gres.conf ``text`` gives ``node``, or None without shards.

    Reads ``Name=shard Count=N [File=...]`` lines and the node's ``Name=gpu File=...`` lines; a line with
    ``NodeName=`` applies to the nodes it lists, one without to every node."""
    shard_count, shard_files, gpu_count = 0, 0, 0
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = {}
        for word in line.split():
            key, _, value = word.partition("=")
            fields[key.lower()] = value
        if "nodename" in fields and node not in expand_hosts(fields["nodename"]):
            continue
        name = fields.get("name", "")
        files = len(expand_hosts(fields["file"])) if "file" in fields else 0
        if name == "shard":
            shard_count += int(fields.get("count", "0") or 0)
            shard_files += files
        elif name == "gpu":
            gpu_count += int(fields["count"]) if "count" in fields else files
    if not shard_count:
        return None
    return shard_count, (shard_files or gpu_count or 1)
