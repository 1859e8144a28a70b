"""`colocate node` options of the scheduler link: where the scheduler comes from, and start-up failures that
exit with one line (2: bad keys or endpoint; 1: a state folder another node holds)."""
from __future__ import annotations

import pytest

from colocate import protocol as P
from tests.support import PY, FakeScheduler, NodeProc, read_log


def node_argv(ipc_dir, name: str, *extra) -> list:
    """A node's command line; without ``--keys`` it speaks without CURVE, as the fake scheduler does."""
    keys = [] if "--keys" in extra else ["--insecure"]
    return [PY, "-m", "colocate", "node", "--device", "sim", "--endpoint", f"ipc://{ipc_dir}/{name}.sock",
            "--state-dir", ipc_dir / "state", "--log-dir", ipc_dir / "logs", *keys, *extra]


@pytest.fixture
def sched():
    s = FakeScheduler(background=True)
    yield s
    s.close()


def test_colocate_scheduler_variable_makes_a_node_join(procs, ipc_dir, sched):
    node = procs.start(node_argv(ipc_dir, "a", "--node-id", "from-env"), "a.log",
                       env_extra={"COLOCATE_SCHEDULER": sched.endpoint})
    _, hello = sched.expect(P.NodeHello, 30)
    assert hello.node_id == "from-env" and node.poll() is None


def test_without_scheduler_the_node_is_standalone(procs, ipc_dir, sched):
    node = NodeProc(procs, ipc_dir).start()  # no --scheduler, no COLOCATE_SCHEDULER: as before
    assert "joins the scheduler" not in node.log()
    assert sched.recv(1.0) is None


def test_a_state_folder_in_use_stops_a_second_node(procs, ipc_dir, sched):
    first = procs.start(node_argv(ipc_dir, "a", "--scheduler", sched.endpoint, "--node-id", "n1"), "a.log")
    sched.expect(P.NodeHello, 30)
    second = procs.start(node_argv(ipc_dir, "b", "--scheduler", sched.endpoint, "--node-id", "n2"), "b.log")
    assert second.wait(60) == 1
    assert "in use by another running node" in read_log(second) and "Traceback" not in read_log(second)
    assert first.poll() is None


@pytest.mark.parametrize("extra, fragment", [
    (["--keys", "/no/such/keys"], "missing key file"),
    (["--scheduler", "not-an-endpoint"], "--scheduler"),
])
def test_bad_scheduler_options_exit_2_with_one_line(procs, ipc_dir, sched, extra, fragment):
    args = ["--scheduler", sched.endpoint, *extra] if extra[0] == "--keys" else extra
    proc = procs.start(node_argv(ipc_dir, "c", *args), "c.log")
    assert proc.wait(60) == 2
    lines = [line for line in read_log(proc).splitlines() if line.startswith("colocate node:")]
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in read_log(proc)
