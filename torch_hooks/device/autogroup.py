"""Linux autogroups and the simulated device's priority.

With autogroup scheduling on (``/proc/sys/kernel/sched_autogroup_enabled``), the kernel first shares a
CPU fairly between *sessions* and only then between the threads of one session. ``SCHED_IDLE`` orders
threads inside one autogroup only: an idle-class job in a session of its own still gets half of a
shared core against a normal job in another session (measured here: a 44 ms sleep+compute batch became
72 ms). That is the case whenever jobs are started in sessions of their own: by a node's launcher, by
slurmstepd (each task is a session leader), by a shell per terminal.

``lower(on)`` gives this process's autogroup the lowest weight (nice 19) while it asks for low device
priority, and back (nice 0) when it stops, but only when the session holds nothing but this job: this
process's own tree (itself, its ancestors and its descendants) and the other processes of its job (the same
``COLOCATE_JOB_ID`` in their environment at start, such as a launcher's other ranks) with their descendants.
Lowering a session shared with another job would slow that job too, and jobs in one session are already
ordered by ``SCHED_IDLE``. Raising the weight
back needs ``CAP_SYS_NICE`` (or RLIMIT_NICE); without it the session stays low, as the idle class does.
This process restores the weight at exit (``atexit``); a job killed before (SIGKILL) cannot, and its launcher,
which outlives it in the same session, restores the nice it read before the job started
(``colocate.launcher.restore_autogroup``).
"""

from __future__ import annotations

import atexit
import os

from colocate.base.autogroup import nice, set_nice

LOW_NICE = 19
_lowered = False


def enabled() -> bool:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def _stat(pid: str) -> tuple[int, int] | None:
    """(ppid, session) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _job_of(pid: int) -> str | None:
    """The COLOCATE_JOB_ID ``pid`` started with, if this process may read it."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"COLOCATE_JOB_ID="):
                    return item.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        pass
    return None


def own_session(job_id: str | None = None) -> bool:
    """True when every process in this session is this process, an ancestor or a descendant, or (given
    ``job_id``) a process that started with ``COLOCATE_JOB_ID=job_id`` or a descendant of one."""
    me, sid = os.getpid(), os.getsid(0)
    parent: dict[int, int] = {}
    members: list[int] = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for p in pids:
        st = _stat(p)
        if st is None:
            continue
        parent[int(p)] = st[0]
        if st[1] == sid:
            members.append(int(p))
    ancestors: set[int] = set()
    up = me
    while up in parent and up not in ancestors:
        ancestors.add(up)
        up = parent[up]

    def descends(q: int, roots: set[int]) -> bool:
        seen = set()
        while q in parent and q not in seen:
            if q in roots:
                return True
            seen.add(q)
            q = parent[q]
        return False

    outside = [m for m in members if m not in ancestors and not descends(m, {me})]
    if outside and job_id:
        ranks = {m for m in outside if _job_of(m) == job_id}
        outside = [m for m in outside if not descends(m, ranks)]
    return not outside


def lower(on: bool, job_id: str | None = None) -> bool:
    """Lower (``on``) or restore this session's autogroup weight; ``job_id``: this job's COLOCATE_JOB_ID
    (its other processes may share the session); see the module's docstring. Idempotent. False only when
    the OS refused a change it should have made."""
    global _lowered
    if on == _lowered:
        return True
    if on:
        if not enabled() or nice() is None or not own_session(job_id):
            return True  # nothing to do: no autogroups, or a session shared with other work
        if not _write(LOW_NICE):
            return False
        _lowered = True
        return True
    _lowered = False
    return _write(0)


def _write(value: int) -> bool:
    try:
        set_nice(value)
        return True
    except OSError:
        return False


@atexit.register
def _restore() -> None:  # an ancestor (a launcher, a shell) outlives this process in the session
    if _lowered:
        lower(False)
