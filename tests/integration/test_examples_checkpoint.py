"""The example scripts' --checkpoint: SIGTERM mid-run saves after the current iteration and exits 143; started
again with the same file, the script resumes from the saved iteration (a preempted job loses no finished work).
Plain processes (no colocate): the behaviour belongs to the scripts. Waits poll the scripts' own progress lines."""
from __future__ import annotations

import os
import re
import signal

import pytest

from tests.support import PY, REPO, finish, read_log, wait_for


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", ["train_cnn.py", "train_transformer.py", "train_recsys.py"])
def test_sigterm_saves_and_a_restart_resumes(procs, ipc_dir, script):
    path, ckpt = str(REPO / "examples" / script), ipc_dir / f"{script}.pt"
    first = procs.start([PY, path, "--duration", 120, "--log-every", 10, "--host-ms", 2, "--checkpoint", ckpt],
                        "first.log")

    def iteration():
        found = [int(n) for n in re.findall(r"^iter (\d+)/", read_log(first), re.M)]
        return max(found, default=0)

    wait_for(lambda: iteration() >= 20, 120, what=f"{script} to pass iteration 20")
    os.killpg(first.pid, signal.SIGTERM)
    assert finish(first, 60) == 143, read_log(first)[-2000:]
    saved = re.search(r"SIGTERM: checkpoint saved at iteration (\d+)", read_log(first))
    assert saved and int(saved.group(1)) >= 20 and ckpt.exists(), read_log(first)[-2000:]
    k = int(saved.group(1))
    again = procs.start([PY, path, "--iters", k + 10, "--log-every", 0, "--host-ms", 0, "--checkpoint", ckpt],
                        "again.log")
    assert finish(again, 120) == 0, read_log(again)[-2000:]
    text = read_log(again)
    assert f"resumed from iteration {k}" in text and f"done: {k + 10} iterations" in text
    plain = procs.start([PY, path, "--iters", 3, "--log-every", 0, "--host-ms", 0], "plain.log")
    assert finish(plain, 120) == 0 and "resumed" not in read_log(plain)  # no --checkpoint: nothing read or written
