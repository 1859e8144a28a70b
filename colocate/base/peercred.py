"""Who is on the other end of a local (``ipc://``) ZeroMQ socket: the kernel's answer, not the peer's.

libzmq (4.3, Linux) reads ``SO_PEERCRED`` when it accepts an ipc connection and attaches it to every
message of that connection as the ``Peer-Address`` property: ``"HOST:UID:GID:PID"`` (receive with
``copy=False``; ``frame.get("Peer-Address")``). The pid is that of the process that connected, the uid
and gid its credentials at ``connect()``; no message can change them. TCP connections carry an address
and no credentials (``of_frame`` returns None).

``claims(cred, pid)`` is the rule for a claimed pid: the caller itself, or a process below it, of the
caller's uid (root may claim any process).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Cred:
    uid: int
    gid: int
    pid: int


def of_frame(frame) -> Cred | None:
    """The credentials of the connection that sent ``frame`` (a ``zmq.Frame``), None when unknown."""
    try:
        address = frame.get("Peer-Address")
    except Exception:  # no metadata (inproc, an old libzmq)
        return None
    return parse(address)


def parse(address: str | None) -> Cred | None:
    """``"HOST:UID:GID:PID"`` -> Cred; anything else (a TCP address) -> None."""
    parts = (address or "").rsplit(":", 3)
    if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
        return None
    return Cred(uid=int(parts[1]), gid=int(parts[2]), pid=int(parts[3]))


def uid_of(pid: int) -> int | None:
    """The real uid of process ``pid`` (None: no such process)."""
    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return None


def descends(pid: int, ancestor: int) -> bool:
    """True when ``pid`` is ``ancestor`` or a process below it."""
    try:
        proc: psutil.Process | None = psutil.Process(pid)
        while proc is not None:
            if proc.pid == ancestor:
                return True
            proc = proc.parent()
    except psutil.Error:
        return False
    return False


def claims(cred: Cred, pid: int) -> str | None:
    """Why the caller ``cred`` may not speak for process ``pid`` (None: it may)."""
    if cred.pid == 0:  # the kernel's answer for a peer in a PID namespace this process cannot see
        return ("the caller's process is not visible to the node (another PID namespace): run the node in the "
                "jobs' PID namespace (Kubernetes: shareProcessNamespace: true)")
    if not descends(pid, cred.pid):
        return f"pid {pid} is not the caller (pid {cred.pid}) nor a process it started"
    owner = uid_of(pid)
    if cred.uid != 0 and owner != cred.uid:
        return f"pid {pid} belongs to uid {owner}, the caller is uid {cred.uid}"
    return None
