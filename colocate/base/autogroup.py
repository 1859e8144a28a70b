"""This process's session autogroup nice (``/proc/self/autogroup``): read and written by the job's runtime
(``torch_hooks.device.autogroup`` lowers an opportunistic job's session) and by the launcher (which puts it
back when the job was killed before it could). Linux only; elsewhere there is no autogroup and ``nice()`` is
None."""

from __future__ import annotations

_AUTOGROUP = "/proc/self/autogroup"


def nice() -> int | None:
    """This process's session autogroup nice (-20..19), or None where there are no autogroups."""
    try:
        with open(_AUTOGROUP) as f:
            return int(f.read().split("nice")[1])
    except (OSError, IndexError, ValueError):
        return None


def set_nice(value: int) -> None:
    """Set the session's autogroup nice. Raises OSError where the OS refuses (raising the weight back needs
    ``CAP_SYS_NICE`` or RLIMIT_NICE) or there are no autogroups."""
    with open(_AUTOGROUP, "w") as f:
        f.write(str(value))
