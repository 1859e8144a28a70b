"""A Slurm cluster on one machine, on loopback, for trying colocate's Slurm support (the test suite and
``benchmarks/slurm_colocation.py`` use it): one slurmctld and several slurmd (``slurmd -N NAME``) on
127.0.0.1, fake GPUs made with mknod and named in gres.conf, and colocate's SPANK plugin built from the
package and loaded through plugstack.conf.

- Without ``plugin``, plugstack.conf starts empty: a site's own set-up lines fill it (the README's test).
- Node ``n1`` has one GPU given out whole (``gpu:1``) or as ``shards`` shards; the others one whole GPU
  each. Every node also offers a count-only ``colocate_opp`` GRES.
- Authentication is ``auth/none`` (Slurm 22.05 still ships it; nothing leaves the host). Needs root
  (slurmd, mknod). Slurm's daemons bind every interface: address them at 127.0.0.1 only.
- Every daemon runs in the foreground in its own session; ``stop()`` ends each by its pid, then kills
  what is left of its process group.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from colocate.base.vocab import DeviceKind
from colocate.slurm.site import SiteSettings, build_command, plugstack_line

BINARIES = ("slurmctld", "slurmd", "srun", "sinfo", "gcc")
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])  # the daemons live in sbin


def binary(name: str) -> str:
    """The path of Slurm program ``name`` (PATH, then sbin); ``name`` itself when absent."""
    return shutil.which(name, path=SEARCH) or name


def missing() -> str | None:
    """Why a loopback cluster cannot start here (one line), or None."""
    absent = [b for b in BINARIES if shutil.which(b, path=SEARCH) is None]
    if absent:
        return f"Slurm not installed ({', '.join(absent)} missing): apt-get install slurm-wlm libslurm-dev"
    if not os.path.exists("/usr/include/slurm/spank.h"):
        return "slurm/spank.h missing: apt-get install libslurm-dev"
    if os.geteuid() != 0:
        return "a loopback Slurm cluster starts slurmd, which needs root"
    if not glob.glob("/usr/lib/*/slurm-wlm/auth_none.so") + glob.glob("/usr/lib*/slurm/auth_none.so"):
        return "this Slurm has no auth/none plugin (Slurm >= 23.11) for a loopback cluster"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LoopbackCluster:
    """``start()`` it, then ``srun`` with ``env()``; ``stop()`` always (a ``with`` block does both)."""

    folder: Path  # short: holds the ipc sockets of the colocate nodes (FOLDER/NODE/node.sock)
    nodes: tuple[str, ...] = ("n1", "n2")
    shards: int = 4
    sim_gpu_mem: str = "1GiB"
    plugin: bool = True  # build colocate's plugin and load it; False: an empty plugstack.conf (the site's to fill)
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def node_endpoint(self, name: str) -> str:
        """Where the SPANK plugin sends node ``name``'s tasks: its colocate node's job endpoint."""
        return f"ipc://{self.folder}/{name}/node.sock"

    def env(self, base: dict | None = None) -> dict:
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def __enter__(self) -> LoopbackCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> LoopbackCluster:
        self.folder.mkdir(parents=True, exist_ok=True)
        plugin = self.folder / "spank_colocate.so"
        if self.plugin:
            built = subprocess.run(build_command(plugin), capture_output=True, text=True, timeout=120)
            if built.returncode != 0:
                raise RuntimeError(f"building the SPANK plugin failed: {built.stderr.strip()}")
        self._write_config(plugin)
        self._spawn([binary("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        for name in self.nodes:
            self._spawn([binary("slurmd"), "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{name}.out")
        deadline = time.monotonic() + timeout
        while not all(self.sinfo().get(n) == "idle" for n in self.nodes):
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Slurm daemon exited ({proc.returncode}): see {self.folder}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the slurmd did not register within {timeout:.0f}s: see {self.folder}")
            time.sleep(0.1)
        return self

    def sinfo(self) -> dict[str, str]:
        """Node name -> Slurm state (idle, alloc, ...)."""
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True,
                              text=True, timeout=10)
        return dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # the slurmd, then slurmctld: each by its pid
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        for proc in self.procs:  # what is left of each session (a stray slurmstepd)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _spawn(self, argv: list[str], log_name: str) -> None:
        with open(self.folder / log_name, "ab") as log:
            self.procs.append(subprocess.Popen(argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def _write_config(self, plugin: Path) -> None:
        tmp = self.folder
        dev = tmp / "dev"
        dev.mkdir(exist_ok=True)
        for i, name in enumerate(self.nodes):
            if not (dev / f"nvidia{i}").exists():  # a character device, as NVIDIA's are
                os.mknod(dev / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
            (tmp / f"spool-{name}").mkdir(exist_ok=True)
            (tmp / name).mkdir(exist_ok=True)
        (tmp / "state").mkdir(exist_ok=True)
        first = self.nodes[0]
        lines = [
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={_free_port()} CPUs=8 "
            f"RealMemory=1000 Gres=gpu:1,{f'shard:{self.shards},' if name == first else ''}colocate_opp:8"
            for name in self.nodes]
        self.conf.write_text(f"""ClusterName=colotest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool-%n
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd-%n.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu,shard,colocate_opp
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
PlugStackConfig={tmp}/plugstack.conf
""" + "\n".join(lines) + f"""
PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")
        gres = [f"NodeName={first} Name=gpu File={dev}/nvidia0",
                f"NodeName={first} Name=shard Count={self.shards} File={dev}/nvidia0"]
        gres += [f"NodeName={name} Name=gpu File={dev}/nvidia{i}" for i, name in enumerate(self.nodes) if i]
        gres.append(f"NodeName={','.join(self.nodes)} Name=colocate_opp Count=8 Flags=CountOnly")
        (tmp / "gres.conf").write_text("\n".join(gres) + "\n")
        settings = SiteSettings(node=f"ipc://{tmp}/%n/node.sock", shards=self.shards, device=DeviceKind.SIM,
                                sim_gpu_mem=self.sim_gpu_mem, opp_gres="colocate_opp")
        (tmp / "plugstack.conf").write_text(plugstack_line(plugin, settings) + "\n" if self.plugin else "")
