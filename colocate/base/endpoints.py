"""Default endpoints and the rules that derive one endpoint from another (the one place for them).

* a node coordinator takes jobs on ``node_endpoint()`` (``RUNTIME/node.sock``, where RUNTIME is
  ``runtime_dir()``: ``$XDG_RUNTIME_DIR/colocate`` where that variable names a folder, else
  ``/tmp/colocate-$UID``) and operators (``colocate ctl``, ``colocate top``) on ``ctl_endpoint(job endpoint)``: the same
  ipc path with ``.ctl`` appended;
* the global scheduler listens on ``SCHEDULER_ENDPOINT`` unless ``--bind`` says otherwise; clients
  and nodes look for it at ``scheduler_endpoint()`` (``COLOCATE_SCHEDULER`` overrides);
* the scheduler tells each node (``NodeWelcome``) to send a heartbeat every ``NODE_HEARTBEAT_S``
  seconds unless ``--heartbeat`` says otherwise, and marks a node down after ``NODE_LIVENESS``
  silent intervals (``--liveness``);
* fencing (``docs/node-placements.md``, "Fencing"): each echoed heartbeat renews the node's lease for
  ``NODE_LEASE_S`` from the moment the node SENT that heartbeat; the launcher of every placed worker checks
  the lease every ``LEASE_CHECK_S`` and, once it has lapsed, SIGTERMs the worker's process group and
  SIGKILLs it ``FENCE_GRACE_S`` later. The scheduler re-places a silent node's jobs only
  ``replace_after_s(lease)`` after it last heard the node, by when every such worker is gone. A scheduler
  outage longer than the lease therefore stops every placed worker; ``NODE_LEASE_S`` is long enough for a
  scheduler ``kill -9`` and restart (a few seconds) to stop none;
* ``colocate logs`` waits for the nodes' answers at most ``LOGS_DEADLINE_S`` at the scheduler (less
  than a client's default 5 s timeout, so a node that does not answer is named, not a "no answer").
"""

from __future__ import annotations

import os

SCHEDULER_ENDPOINT = "tcp://127.0.0.1:5555"
NODE_HEARTBEAT_S = 0.8  # seconds (zguide's ~1 s, so that a dead node is down within 3 s of its death)
NODE_LIVENESS = 3  # missed heartbeats: a silent node is down 2.4 s after its last heartbeat
NODE_LEASE_S = 10.0  # seconds a node's placed workers may run after the heartbeat of its last echo was sent
FENCE_GRACE_S = 3.0  # seconds between a launcher's SIGTERM and SIGKILL when its node's lease lapsed
LEASE_CHECK_S = 0.25  # how often a launcher reads its node's lease file


def replace_after_s(lease_s: float = NODE_LEASE_S) -> float:
    """Seconds after the scheduler last heard a node before it re-places the node's jobs elsewhere: the
    lease, the stop grace and two lease checks (by then the fenced workers are gone); 0 without a lease."""
    return lease_s + FENCE_GRACE_S + 2 * LEASE_CHECK_S if lease_s > 0 else 0.0
LOGS_DEADLINE_S = 2.0  # seconds the scheduler waits for nodes' log tails before it answers without them


def scheduler_endpoint(environ=None) -> str:
    """Where clients and nodes find the scheduler: ``COLOCATE_SCHEDULER``, else ``SCHEDULER_ENDPOINT``."""
    environ = os.environ if environ is None else environ
    return environ.get("COLOCATE_SCHEDULER") or SCHEDULER_ENDPOINT


def runtime_dir(environ=None) -> str:
    """Per-user folder for ipc sockets: ``$XDG_RUNTIME_DIR/colocate`` where ``XDG_RUNTIME_DIR`` is a folder,
    else ``/tmp/colocate-$UID``. Whoever binds in it makes it private first (``private_dir``)."""
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return os.path.join(xdg, "colocate")
    return f"/tmp/colocate-{os.getuid()}"


class UnsafeFolder(ValueError):
    """A socket folder another user could have planted or could change; ``str()`` is one line naming the fix."""


def private_dir(path: str, mode: int = 0o700) -> None:
    """Make ``path`` (``mode``, the parents as needed) unless it exists, then check it: a real folder (not a
    link) owned by this process's user or by root, writable by its owner only. A folder pre-created by
    another user (``/tmp/colocate-$UID`` squatted with mode 0777) raises ``UnsafeFolder``: nothing is bound
    there. A group/world-writable folder is accepted only when it is root's with the sticky bit (``/tmp``
    itself, for an endpoint given there): nobody else can remove or replace what this user binds in it.

    Idempotent; safe under concurrent callers (a folder made meanwhile by this same user is checked)."""
    import stat

    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # the umask does not narrow what was asked for
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", 0o700, exist_ok=True)
        return private_dir(path, mode)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"refusing socket folder {path}: it is not a folder (a link or a file?): remove it")
    me = os.getuid()
    if st.st_uid not in (me, 0):
        raise UnsafeFolder(f"refusing socket folder {path}: it belongs to uid {st.st_uid}, not to uid {me}: "
                           f"remove it (another user may have planted it) or give an endpoint in a folder of yours")
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (st.st_mode & stat.S_ISVTX and st.st_uid == 0):
        raise UnsafeFolder(f"refusing socket folder {path}: mode {stat.S_IMODE(st.st_mode):04o} lets others write "
                           f"in it: `chmod go-w {path}`")


def node_endpoint() -> str:
    """The job endpoint ``colocate node`` binds by default."""
    return f"ipc://{runtime_dir()}/node.sock"


def ipc_path(endpoint: str) -> str | None:
    """The filesystem path of an ``ipc://`` endpoint, else None."""
    return endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else None


def ctl_endpoint(job_endpoint: str) -> str:
    """The operator endpoint of the node whose job endpoint is ``job_endpoint``.

    Raises ValueError when it cannot be derived (the job endpoint is not ``ipc://``)."""
    path = ipc_path(job_endpoint)
    if path is None:
        raise ValueError(f"cannot derive the operator endpoint from {job_endpoint!r}: give --ctl ENDPOINT "
                         "when the job endpoint is not ipc://")
    return f"ipc://{path}.ctl"
