"""``colocate slurm``: a Slurm site's set-up.

``colocate slurm build-plugin [PATH]`` compiles this installation's SPANK plugin source with gcc into PATH
(its folder made first) and prints PATH: no other Python needs to import colocate, so a venv install works.

``colocate slurm config`` prints the lines a site adds: the build command, the plugstack.conf line with this
installation's paths (with ``--plugstack FILE``, written into FILE in place of any colocate line there; with
``--task-prolog FILE``, the TaskProlog for sites that do not compile), the slurm.conf/gres.conf lines, and the
node coordinator to run beside slurmd. Then it checks this node: the shards per GPU against gres.conf, that the
node coordinator answers at its endpoint, and that its GPUs are what the plugin's line says (device kind, and
for simulated GPUs ``sim_gpu_mem=`` against the node's ``--sim-gpu-mem``). Exit 0 when every check passes, 1
otherwise, 2 on a bad option or a file it cannot write.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from colocate.base.units import parse_size
from colocate.base.vocab import DeviceKind
from colocate.cli._common import POSITIVE_INT, argtype
from colocate.slurm.site import ENFORCE

DEFAULT_NODE = "ipc:///run/colocate/node.sock"
DEFAULT_PLUGIN = "/usr/local/lib/colocate/spank_colocate.so"


def register(sub) -> None:
    p = sub.add_parser("slurm", help="run colocate inside Slurm (site set-up)",
                       description="colocate inside Slurm: a SPANK plugin (or a TaskProlog) turns colocate on in "
                       "the tasks that ask for it or hold GPU shards; see docs/slurm.md.")
    cmds = p.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND", required=True)
    c = cmds.add_parser("config", help="print the site's configuration lines and check this node",
                        description="Print the lines a Slurm site adds (plugin build, plugstack.conf, slurm.conf, "
                        "gres.conf, the node coordinator) and check this node: shards per GPU against gres.conf, "
                        "the node coordinator's endpoint. Exit 1 when a check fails.")
    c.add_argument("--node", default=DEFAULT_NODE, metavar="ENDPOINT",
                   help=f"the node coordinator's job endpoint on every node; %%n is the Slurm node name "
                   f"(default {DEFAULT_NODE})")
    c.add_argument("--ctl", default=None, metavar="ENDPOINT",
                   help="the node coordinator's operator endpoint, to check it (default: the job endpoint + '.ctl')")
    c.add_argument("--shards", type=POSITIVE_INT, default=None, metavar="S",
                   help="shards per GPU, as gres.conf gives them out (default: read from --gres-conf)")
    c.add_argument("--device", choices=tuple(DeviceKind), default=DeviceKind.CUDA, help="GPU kind (default cuda)")
    c.add_argument("--sim-gpu-mem", type=argtype(_size, "size"), default=None, metavar="SIZE",
                   help="sim: memory of each simulated GPU (the node coordinator's --sim-gpu-mem)")
    c.add_argument("--enforce", choices=ENFORCE, default="shard",
                   help="which tasks run under colocate without asking: shard (holding GPU shards; the default), all "
                   "(any Slurm GPU: opportunistic work then always yields to them), none")
    c.add_argument("--opp-gres", default=None, metavar="NAME",
                   help="a count-only GRES whose jobs are opportunistic, e.g. colocate_opp (default: none; users say "
                   "--colocate=opportunistic)")
    c.add_argument("--plugin", default=DEFAULT_PLUGIN, metavar="PATH", help=f"where the plugin is installed "
                   f"(default {DEFAULT_PLUGIN})")
    c.add_argument("--gres-conf", default=None, metavar="PATH",
                   help="gres.conf to check (default: beside $SLURM_CONF, else /etc/slurm/gres.conf)")
    c.add_argument("--node-name", default=None, metavar="NAME", help="this node's Slurm name (default: host name)")
    c.add_argument("--task-prolog", default=None, metavar="FILE",
                   help="write the TaskProlog (with these settings) to FILE, for sites that do not build the plugin")
    c.add_argument("--plugstack", default=None, metavar="FILE",
                   help="write the plugstack.conf line into FILE (e.g. /etc/slurm/plugstack.conf), in place of any "
                   "colocate line there; other lines are kept (default: print it only)")
    c.set_defaults(func=main)
    b = cmds.add_parser("build-plugin", help="compile the SPANK plugin (gcc, libslurm-dev) and print its path",
                        description="Compile this installation's SPANK plugin (spank_colocate.c) with gcc into PATH, "
                        "making its folder first; print PATH. Needs gcc and libslurm-dev (slurm/spank.h).")
    b.add_argument("path", nargs="?", default=DEFAULT_PLUGIN, metavar="PATH",
                   help=f"where to write the plugin (default {DEFAULT_PLUGIN})")
    b.add_argument("--print-source", action="store_true",
                   help="print the path of the plugin's C source instead, and build nothing")
    b.set_defaults(func=build_plugin)


def _size(text: str) -> str:
    parse_size(text)
    return text


def build_plugin(args) -> int:
    """``colocate slurm build-plugin``: 0 and the plugin's path on stdout; 1 with one line when it cannot."""
    import shutil
    import subprocess

    from colocate.slurm import site

    if args.print_source:
        print(site.SOURCE)
        return 0
    out = Path(args.path)
    if shutil.which("gcc") is None:
        print("colocate slurm build-plugin: error: gcc not found: install gcc (and libslurm-dev)", file=sys.stderr)
        return 1
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"colocate slurm build-plugin: error: cannot make {out.parent}: {exc.strerror}", file=sys.stderr)
        return 1
    proc = subprocess.run(site.build_command(out), capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if "cannot" in line or "error:" in line] or lines or ["(no message)"]
        hint = " (install libslurm-dev)" if "spank.h" in proc.stderr else ""
        print(f"colocate slurm build-plugin: error: gcc failed{hint}: {errors[0].strip()[:300]}", file=sys.stderr)
        return 1
    print(out)
    return 0


def main(args) -> int:
    from colocate.slurm import site

    node_name = args.node_name or socket.gethostname().split(".")[0]
    gres_path = Path(args.gres_conf) if args.gres_conf else Path(
        os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).with_name("gres.conf")
    shards, check = _check_shards(gres_path, node_name, args.shards)
    settings = site.SiteSettings(node=args.node, shards=shards, device=args.device, sim_gpu_mem=args.sim_gpu_mem,
                                 enforce=args.enforce, opp_gres=args.opp_gres)
    endpoint = args.node.replace("%n", node_name)
    node_ok, node_line, gpus = _check_node(endpoint, args.ctl and args.ctl.replace("%n", node_name))
    checks = [check, (node_ok, node_line)]
    if gpus:
        checks.append(_check_gpus(gpus, settings))
    if args.plugstack:
        path = Path(args.plugstack)
        try:
            old = path.read_text() if path.exists() else ""
            path.write_text(site.with_plugstack_line(old, site.plugstack_line(args.plugin, settings)))
        except OSError as exc:
            print(f"colocate slurm config: error: cannot write {path}: {exc.strerror}", file=sys.stderr)
            return 2
    if args.task_prolog:
        path = Path(args.task_prolog)
        try:
            path.write_text(site.task_prolog(settings))
            path.chmod(0o755)
        except OSError as exc:
            print(f"colocate slurm config: error: cannot write {path}: {exc.strerror}", file=sys.stderr)
            return 2
    _print_lines(args, settings, endpoint)
    print("\n# checks on this node")
    for ok, line in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {line}")
    return 0 if all(ok for ok, _ in checks) else 1


def _check_shards(path: Path, node: str, shards: int | None) -> tuple[int | None, tuple[bool, str]]:
    """The shards per GPU to use (``shards``, else gres.conf's) and the check of ``shards`` against gres.conf."""
    from colocate.slurm import site

    try:
        found = site.gres_shards(path.read_text(), node)
    except OSError as exc:
        return shards, (False, f"cannot read {path}: {exc.strerror}")
    except ValueError as exc:
        return shards, (False, f"{path}: cannot read its shard lines ({exc})")
    if found is None:
        return shards, (True, f"{path}: node {node} has no shards (only --gres=gpu and opportunistic jobs)")
    total, gpus = found
    per_gpu, rest = divmod(total, gpus)
    if rest:
        return shards, (False, f"{path}: node {node} has {total} shards on {gpus} GPUs: not the same number on "
                        "every GPU, which colocate needs")
    where = f"{path}: node {node}: {per_gpu} shards per GPU on {gpus} GPU(s)"
    if shards is None:
        return per_gpu, (True, where)
    return shards, (shards == per_gpu, f"{where}; --shards {shards} {'matches' if shards == per_gpu else 'does NOT match'}")


def _check_node(endpoint: str, ctl: str | None) -> tuple[bool, str, tuple]:
    """(ok, line, the node's GPUs: ``GpuInfo``s, () when not asked or no answer)."""
    from colocate.base.endpoints import ctl_endpoint
    from colocate.clients import node as client

    try:
        ctl = ctl or ctl_endpoint(endpoint)
    except ValueError:
        return True, f"node coordinator at {endpoint}: not an ipc:// endpoint and no --ctl, not checked", ()
    try:
        jobs = client.list_jobs(ctl, 1.0)
    except client.CtlClientError:
        return False, (f"no node coordinator answers at {ctl}: start `colocate node --endpoint {endpoint}` "
                       "beside slurmd (docs/slurm.md has a systemd unit)"), ()
    return (True, f"node coordinator at {endpoint}: answers, {len(jobs.gpus)} GPU(s), {len(jobs.jobs)} job(s)",
            tuple(jobs.gpus))


def _check_gpus(gpus, settings) -> tuple[bool, str]:
    """The node's GPUs against the plugin's ``device=`` and ``sim_gpu_mem=``: a task computes its shards' cap
    from the plugin's size, the node admits partitions by its own, so the two must be the same."""
    from colocate.base.env import DEFAULT_SIM_GPU_MEM
    from colocate.base.units import format_size

    kinds = sorted({g.kind for g in gpus})
    if kinds != [settings.device]:
        return False, (f"the plugin's device={settings.device} but the node coordinator's GPUs are "
                       f"{'/'.join(kinds)}: give both the same --device")
    if settings.device != DeviceKind.SIM:
        return True, f"the node coordinator's GPUs are {settings.device}, as the plugin's device="
    want = parse_size(settings.sim_gpu_mem) if settings.sim_gpu_mem else DEFAULT_SIM_GPU_MEM
    wrong = sorted({g.mem_total for g in gpus if g.mem_total != want})
    said = f"sim_gpu_mem={settings.sim_gpu_mem}" if settings.sim_gpu_mem else f"no sim_gpu_mem= ({format_size(want)})"
    if wrong:
        return False, (f"the plugin's {said} but the node coordinator's simulated GPUs have "
                       f"{', '.join(format_size(m) for m in wrong)}: give --sim-gpu-mem the same size to both")
    return True, f"the plugin's {said} is the node coordinator's simulated GPU memory"


def _print_lines(args, settings, endpoint: str) -> None:
    from colocate.slurm import site

    plugin = Path(args.plugin)
    step = 1
    if args.task_prolog and not args.plugstack:  # the site chose the TaskProlog: no plugin to build or load
        print(f"# {step}. slurm.conf (the same file at this path on every node): "
              f"TaskProlog={Path(args.task_prolog).resolve()}")
        print("#    (or the SPANK plugin instead: colocate slurm config without --task-prolog)")
        step += 1
    else:
        print(f"# {step}. build the SPANK plugin (needs gcc and libslurm-dev), on every node and login node:")
        print(f"mkdir -p {plugin.parent}")
        print(f"colocate slurm build-plugin {plugin}      # or: " + " ".join(site.build_command(plugin)))
        print(f"# {step + 1}. plugstack.conf (every node and login node)"
              + (f", written into {args.plugstack}:" if args.plugstack else "; --plugstack FILE writes it:"))
        print(site.plugstack_line(plugin, settings))
        if args.task_prolog:
            print(f"#    or, without the plugin, slurm.conf: TaskProlog={Path(args.task_prolog).resolve()}")
        else:
            print("#    or, without the plugin: colocate slurm config --task-prolog FILE, and slurm.conf TaskProlog=FILE")
        step += 2
    opp = settings.opp_gres
    print(f"# {step}. slurm.conf: shards (they need select/cons_tres)" + (f", and {opp}: opportunistic tasks per node"
                                                                   if opp else "") + ":")
    print("SelectType=select/cons_tres")
    print("GresTypes=gpu,shard" + (f",{opp}" if opp else ""))
    print(f"#    NodeName=... Gres=gpu:N,shard:N*S{f',{opp}:8' if opp else ''}   with gres.conf lines such as:")
    print(f"#    Name=shard Count=N*{settings.shards or 'S'}" + (f"   Name={opp} Count=8 Flags=CountOnly" if opp else ""))
    print(f"# {step + 1}. beside slurmd on every node (docs/slurm.md has a systemd unit):")
    sim = f" --sim-gpu-mem {settings.sim_gpu_mem}" if settings.sim_gpu_mem else ""
    ctl = f" --ctl {args.ctl}" if args.ctl else ""
    print(f"colocate node --device {settings.device}{sim} --endpoint {args.node}{ctl} --policy adaptive"
          + ("   (%n: this node's Slurm name)" if "%n" in args.node else ""))
