"""Issue 22, items 3 and 5: a node's local sockets know who calls. A second Unix account (made and removed by
the test) squats the runtime folder, poses as a job (claiming pid 1, a predictable Slurm job id, another
user's job id) and knocks on the operator socket; the kernel's answer (SO_PEERCRED) decides, not the message.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.support import PY, NodeProc, child_env
from tests.users import needs_root, open_dir, shared_python, users  # noqa: F401 (fixtures)

pytestmark = needs_root

# run as another account: connect to the node's sockets, send each message, print what came back (JSON)
POSER = r"""
import json, os, sys, time, zmq
from colocate import protocol as P
endpoint, asks = sys.argv[1], json.loads(sys.argv[2])
ctx = zmq.Context()
out, kept = [], []
for ask in asks:
    if ask.get("hold"):  # keep what was registered alive (heartbeats) until the test ends this process
        print(json.dumps(out), flush=True)
        while True:
            for s, job_id in kept:
                s.send(P.encode(P.Heartbeat(job_id=job_id, sent_at=0.0)))
            time.sleep(0.2)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(ask.get("endpoint", endpoint))
    fields = dict(ask["register"]) if "register" in ask else None
    if fields is not None:
        fields["pid"] = os.getpid() if fields["pid"] == "self" else fields["pid"]
        msg = P.Register(gpu=0, priority="opportunistic", mem_request=None, sm_share=1.0, mem_cap=1 << 30, epoch=1,
                         token="t", sm_request=1.0, **fields)
    else:
        msg = P.CtlList()
    sock.send(P.encode(msg))
    if sock.poll(int(ask.get("wait_s", 5) * 1000)):
        reply = P.decode(sock.recv())
        out.append({"type": reply.TYPE, "code": getattr(reply, "code", None), "message": getattr(reply, "message", "")})
    else:
        out.append({"type": None})
    if ask.get("keep") and fields is not None:
        kept.append((sock, fields["job_id"]))
    else:
        sock.close()
print(json.dumps(out))
"""


def run_as(users, name: str, endpoint: str, asks: list) -> list:  # noqa: F811 (the fixture's object)
    py, path = shared_python()
    res = subprocess.run([py, "-c", POSER, endpoint, json.dumps(asks)], env=child_env({"PYTHONPATH": path}),
                         capture_output=True, text=True, timeout=60, cwd="/", **users.as_user(name))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


# ---------------------------------------------------------------- item 3: the runtime folder


def _squat(users, name: str, path: Path) -> None:  # noqa: F811
    subprocess.run([shared_python()[0], "-c", f"import os; os.mkdir({str(path)!r}); os.chmod({str(path)!r}, 0o777)"], check=True,
                   timeout=60, cwd="/", **users.as_user(name))


def _node_start(argv: list, env: dict) -> subprocess.CompletedProcess:
    """A node that refuses its folder exits at once; one that does not runs on (the timeout fails the test)."""
    try:
        return subprocess.run([PY, "-m", "colocate", "node", "--device", "sim", "--sim-gpus", "1", *argv],
                              env=child_env(env), capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the node started in a folder another user planted")


def test_a_runtime_folder_planted_by_another_user_is_refused_in_one_line(users, tmp_path):  # noqa: F811
    squatter = users.add("sq")
    xdg = Path(tempfile.mkdtemp(prefix="cl-xdg-"))
    try:
        os.chmod(xdg, 0o1777)  # like /tmp: anyone may create a folder in it
        _squat(users, squatter, xdg / "colocate")
        # the default endpoint: $XDG_RUNTIME_DIR/colocate/node.sock, where the squatter was first
        res = _node_start([], {"XDG_RUNTIME_DIR": str(xdg)})
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert f"refusing socket folder {xdg}/colocate" in lines[0] and "belongs to uid" in lines[0]
        assert os.listdir(xdg / "colocate") == []  # nothing was bound there
        # an endpoint given in a folder others may write is refused too, naming the fix
        os.rmdir(xdg / "colocate")
        (xdg / "mine").mkdir(mode=0o700)
        os.chmod(xdg / "mine", 0o777)
        res = _node_start(["--endpoint", f"ipc://{xdg}/mine/node.sock"], {})
        assert res.returncode == 2 and f"`chmod go-w {xdg}/mine`" in res.stderr, res.stderr
        assert not (xdg / "mine" / "node.sock").exists()
    finally:
        subprocess.run(["rm", "-rf", str(xdg)], timeout=60)


def test_the_runtime_folder_is_made_private_where_xdg_runtime_dir_says(procs, tmp_path):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    node = NodeProc(procs, tmp_path)
    node.endpoint = f"ipc://{xdg}/colocate/node.sock"  # what the default is with XDG_RUNTIME_DIR (checked below)
    node.ctl = node.endpoint + ".ctl"
    from colocate.base.endpoints import node_endpoint, runtime_dir

    assert runtime_dir({"XDG_RUNTIME_DIR": str(xdg)}) == f"{xdg}/colocate"
    assert runtime_dir({}) == f"/tmp/colocate-{os.getuid()}"
    node.start()
    st = os.stat(xdg / "colocate")
    assert st.st_uid == os.getuid() and not stat.S_IMODE(st.st_mode) & 0o066  # others may not list nor write
    assert stat.S_IMODE(os.stat(xdg / "colocate" / "node.sock.ctl").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(xdg / "colocate" / "node.sock").st_mode) == 0o666  # root's node takes others' jobs
    assert node_endpoint().startswith("ipc://")


# ---------------------------------------------------------------- item 5: who registers, who operates


@pytest.fixture
def root_node(procs, open_dir):  # noqa: F811
    node = NodeProc(procs, open_dir, "--sim-gpus", "1", metrics=False, record=False)
    node.start()
    return node


def test_a_registration_is_bound_to_the_callers_pid_and_uid(users, root_node):  # noqa: F811
    mallory, bob = users.add("ma"), users.add("bo")
    sock = root_node.endpoint
    os.chmod(sock[len("ipc://"):], 0o666)  # as a unit with UMask=0000 leaves it (a root node makes it so itself)
    replies = run_as(users, mallory, sock, [
        {"register": {"job_id": "slurm-42.0/0", "pid": 1, "rank": 0}},  # a predictable id, claiming pid 1
        {"register": {"job_id": "mine", "pid": "self"}, "keep": True},  # its own process: welcome
    ])
    assert replies[0]["type"] == "error" and replies[0]["code"] == "forbidden", replies
    assert "pid 1 is not the caller" in replies[0]["message"]
    assert replies[1]["type"] == "welcome", replies
    assert "slurm-42.0/0" not in root_node.jobs()
    # bob cannot take the id of the job mallory registered (her process holds it: the node knows her uid)
    py, path = shared_python()
    keep = subprocess.Popen([py, "-c", POSER, sock, json.dumps([
        {"register": {"job_id": "held", "pid": "self"}, "keep": True}, {"hold": True}])],
        env=child_env({"PYTHONPATH": path}), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
        **users.as_user(mallory))
    try:
        assert json.loads(keep.stdout.readline())[0]["type"] == "welcome"  # the handshake: registered, holding
        (theirs,) = run_as(users, bob, sock, [{"register": {"job_id": "held", "pid": "self"}}])
        assert theirs["type"] == "error" and theirs["code"] == "forbidden", theirs
        assert f"registered by uid {users.uid(mallory)}" in theirs["message"]
    finally:
        keep.kill()
        keep.wait(10)


def test_the_operator_socket_admits_the_nodes_owner_and_root_only(users, root_node):  # noqa: F811
    mallory = users.add("op")
    ctl = root_node.ctl
    (closed,) = run_as(users, mallory, root_node.endpoint, [{"endpoint": ctl, "wait_s": 2}])
    assert closed["type"] is None  # 0600, root's: the socket does not even open
    os.chmod(ctl[len("ipc://"):], 0o666)  # as a unit with UMask=0000 would leave it
    (refused,) = run_as(users, mallory, root_node.endpoint, [{"endpoint": ctl}])
    assert refused["type"] == "error" and refused["code"] == "forbidden", refused
    assert f"admits uid 0 and root only, not uid {users.uid(mallory)}" in refused["message"]
    assert root_node.listing() is not None  # root (the owner) is served
