"""``colocate.gpus.sim.claim_cores``: a node holds its simulated GPUs' cores; a second node of the user on the same
machine with the same cores is told, in one warning per core (both ran at half speed without a word)."""

import os
import subprocess
import sys

from colocate.gpus import sim


def test_a_core_another_node_holds_is_warned_about_naming_its_pid(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from colocate.gpus import sim; "
        f"print(sim.claim_cores({{0: 1}}, {str(tmp_path)!r}), flush=True); sys.stdin.readline()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "[]"  # the handshake: it holds core 1
        warnings = sim.claim_cores({0: 1, 1: 0}, str(tmp_path))
        assert len(warnings) == 1 and "GPU 0's core 1" in warnings[0] and f"pid {holder.pid}" in warnings[0]
    finally:
        holder.communicate("\n", timeout=30)
    assert os.path.exists(tmp_path / "sim-core-0.lock")  # core 0 was free: this process holds it now
