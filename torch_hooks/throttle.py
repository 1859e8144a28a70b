"""Pure throttle arithmetic (no clock, no torch).

The SM share caps the job's device busy fraction. At each mini-batch boundary
the job has been busy ``busy_s`` seconds of device time during ``elapsed_s``
seconds of wall time since it last resumed; it then idles long enough that
busy / (elapsed + idle) <= share. When the job already idles enough on its own
(host-side data phases) nothing is inserted. This is AntMan's perfControl
(busy x (1/share - 1)) corrected for idle time the job already has.
"""

from __future__ import annotations

MAX_IDLE_S = 60.0  # one boundary never sleeps longer than this (share changes re-evaluate)


def idle_after(busy_s: float, elapsed_s: float, share: float) -> float:
    """Seconds to idle at this boundary so the batch's busy fraction is <= share.

    ``share`` must be in (0, 1]; share 1 never idles. A share of 0 is a pause and
    is handled by the caller (wait until the share is raised).
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share}")
    if share >= 1.0 or busy_s <= 0.0:
        return 0.0
    return min(MAX_IDLE_S, max(0.0, busy_s / share - max(0.0, elapsed_s)))


def host_penalty_s(host_bytes_touched: int, host_gbps: float) -> float:
    """Modelled extra device time for touching host-served bytes over the bus."""
    if host_bytes_touched <= 0:
        return 0.0
    return host_bytes_touched / (host_gbps * 1e9)
