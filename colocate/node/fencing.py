"""Fencing that survives lost files: a node finds the workers of its earlier incarnations from the processes.

Every worker a node places starts with two variables in its environment, which its launcher passes on to every
process of the job: ``COLOCATE_NODE_STATE`` (the node's state folder, absolute: which node placed it) and
``COLOCATE_PLACEMENT`` (``CLUSTER/PLACEMENT@EPOCH``: the placement's key and the node incarnation that started it;
``colocate.base.lease.placement_marker``). A node starting on a folder scans ``/proc`` for them (``find``) before it
takes work: a marked process whose ``(key, epoch)`` the node's table does not hold as a running worker (the table
was lost, corrupt, or the worker had ended) is an orphan and is killed with its process group (``kill_orphans``),
and the node waits until it is gone. The epochs of the workers it re-adopted go into the lease file
(``colocate.base.lease``): a launcher of any other incarnation stops within a lease check, even one the scan could not
see (another pid namespace).

Reading another user's ``/proc/PID/environ`` needs root (or the same user): a node started as root sees every
worker; a node of one user sees that user's processes, which are the only ones it starts.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import psutil

from colocate.base.lease import parse_marker, placement_marker

log = logging.getLogger("colocate.node.fencing")

NODE_STATE = "COLOCATE_NODE_STATE"
PLACEMENT = "COLOCATE_PLACEMENT"
KILL_WAIT_S = 10.0  # how long a node waits for SIGKILLed orphans to be gone (a process in D state can take a while)


def marker_env(state_dir: str, key: str, epoch: int) -> dict[str, str]:
    """The variables a worker of placement ``key`` started by incarnation ``epoch`` of the node on ``state_dir``
    carries."""
    return {NODE_STATE: os.path.abspath(state_dir), PLACEMENT: placement_marker(key, epoch)}


def find(state_dir: str) -> list[tuple[psutil.Process, str, int]]:
    """(process, key, epoch) of every live process marked by the node on ``state_dir`` (zombies and this process
    left out)."""
    state_dir = os.path.abspath(state_dir)
    me = os.getpid()
    out = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
            if env.get(NODE_STATE) != state_dir:
                continue
            marker = parse_marker(env.get(PLACEMENT))
            if marker is None or proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except (psutil.Error, OSError):  # gone, or not ours to read
            continue
        out.append((proc, *marker))
    return out


def kill_orphans(state_dir: str, held: set[tuple[str, int]], wait_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL every process marked by the node on ``state_dir`` whose ``(key, epoch)`` is not in ``held`` (the
    running workers of the node's table), with its process group when it leads one, and wait up to ``wait_s`` for
    them to be gone; returns their pids. Logged in one line per placement."""
    orphans = [(proc, key, epoch) for proc, key, epoch in find(state_dir) if (key, epoch) not in held]
    if not orphans:
        return []
    by_placement: dict[tuple[str, int], list[int]] = {}
    for proc, key, epoch in orphans:
        by_placement.setdefault((key, epoch), []).append(proc.pid)
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.kill()
        except (psutil.Error, OSError):
            pass
    for (key, epoch), pids in sorted(by_placement.items()):
        log.warning("killed %d orphan process(es) of placement %s (node incarnation %d), which this node's table "
                    "does not hold: pids %s", len(pids), key, epoch, ",".join(map(str, sorted(pids))))
    deadline = time.monotonic() + wait_s
    alive = [proc for proc, _, _ in orphans]
    while True:  # a zombie counts as gone (its parent, not this node, reaps it)
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if alive:
        log.error("orphan process(es) %s did not die within %.0f s of SIGKILL", ",".join(str(p.pid) for p in alive),
                  wait_s)
    return sorted(proc.pid for proc, _, _ in orphans)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
