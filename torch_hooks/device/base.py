"""The in-job device interface both implementations (sim, cuda) follow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class MemoryStats:
    """A snapshot of the job's device memory, in bytes.

    ``allocated``/``reserved`` follow PyTorch's caching allocator: bytes in live
    blocks vs bytes held in segments (live + cached). ``host`` counts live bytes
    that were served from host memory because the cap was reached. ``win_*``
    values cover the current statistics window (since the last mini-batch
    boundary); ``win_host_touched`` is the host bytes the window touched
    (host bytes live at its start plus host bytes allocated in it).
    """

    cap: int
    allocated: int
    reserved: int
    host: int
    peak_allocated: int
    peak_reserved: int
    peak_host: int
    win_peak_allocated: int
    win_peak_reserved: int
    win_host_touched: int


class JobDevice(Protocol):
    """The device as one job process sees it. Every method is thread-safe.

    ``busy_time()`` is monotonic seconds of device work done by this process.
    ``set_cap`` takes effect for new segments at once; cached memory above a
    lowered cap is released by ``release_cache`` (the runtime calls it at the
    next mini-batch boundary). ``set_low_priority(True)`` makes the device run
    this job's work only when other jobs' work is not waiting, where the device
    can change that while the job runs (returns False where it cannot).
    """

    kind: str
    index: int
    mem_total: int

    def install(self) -> None: ...
    def set_cap(self, cap_bytes: int) -> None: ...
    def release_cache(self) -> int: ...
    def memory(self) -> MemoryStats: ...
    def reset_window(self) -> None: ...
    def busy_time(self) -> float: ...
    def phase_start(self) -> None: ...
    def phase_end(self) -> None: ...
    def mem_get_info(self) -> tuple[int, int]: ...
    def charge(self, seconds: float) -> None: ...
    def set_low_priority(self, on: bool) -> bool: ...
    # optional: ``control_thread()``: the calling thread carries control messages (the node link), not
    # device work; a device that moves or deprioritizes the job's threads leaves it alone.
    # optional: ``quiet(cap) -> bool``: nothing for a boundary to charge or enforce since the window's
    # start (no host bytes touched, reserved within ``cap``); a device without it gets full boundaries
