"""The ``--stats-file`` summary: its fields, their units, and how a job's processes merge.

Each job process that installed the runtime writes one summary at exit
(``torch_hooks.records.StatsBook.summary`` builds it from ``FIELDS``); the launcher merges
the summaries of all of a job's processes into the ``--stats-file``
(``merge``), adding ``exit_code`` and ``processes`` (the per-process summaries).
Times are seconds, sizes bytes; ``busy_fraction`` is device busy time over wall time, both
counted from the process's first device work.
"""

from __future__ import annotations

from typing import Any

FIELDS: dict[str, str] = {
    "job_id": "the job's id (COLOCATE_JOB_ID)",
    "pid": "process id of the (main) process",
    "device": "sim or cuda",
    "gpu": "GPU index",
    "priority": "guaranteed or opportunistic",
    "on_cap": "host or error",
    "sm_share": "compute share in force at exit",
    "iterations": "mini-batches (boundaries) seen",
    "boundaries": "boundaries by how they were found: optimizer, backward, step (torch_hooks.step()), scaler",
    "ready_at": "CLOCK_MONOTONIC seconds when the process reached its first device work (null: never); "
                "a job paused then waits there",
    "wall_s": "seconds from the first device work to exit",
    "device_busy_s": "device busy seconds in that time",
    "busy_fraction": "device_busy_s / wall_s",
    "throttle_idle_s": "seconds idled by the SM-share throttle",
    "paused_s": "seconds paused (share 0)",
    "host_penalty_s": "sim: modelled device seconds for touching host-served bytes",
    "mem_cap_bytes": "memory cap in force at exit",
    "mem_reserved_peak_bytes": "peak reserved device bytes",
    "mem_allocated_peak_bytes": "peak allocated device bytes",
    "host_bytes_peak": "peak bytes served from host memory over the cap",
    "mem_floor_peak_bytes": "largest reserved-over-cap floor reported at a boundary",
    "boundary_reserved_over_cap_max_bytes": "largest excess of reserved over cap left at a boundary",
}

# numeric fields every --stats-file carries, zeros for a job that never imported torch
NUMERIC = ("iterations", "wall_s", "device_busy_s", "busy_fraction", "mem_cap_bytes", "mem_reserved_peak_bytes",
           "mem_allocated_peak_bytes", "host_bytes_peak")
# merged over processes: peaks by max; busy time by sum
_PEAKS = ("mem_reserved_peak_bytes", "mem_allocated_peak_bytes", "host_bytes_peak", "mem_floor_peak_bytes",
          "boundary_reserved_over_cap_max_bytes")


def merge(procs: list[dict]) -> dict:
    """One summary for a job from its processes' summaries (``processes`` keeps them all)."""
    if not procs:
        out: dict[str, Any] = dict.fromkeys(NUMERIC, 0)
        out["note"] = "no process of the job installed the runtime (it never imported torch)"
        out["processes"] = []
        return out
    main = max(procs, key=lambda p: p.get("iterations", 0))
    out = dict(main)
    if len(procs) > 1:
        out["device_busy_s"] = sum(p.get("device_busy_s", 0.0) for p in procs)
        out["wall_s"] = max(p.get("wall_s", 0.0) for p in procs)
        out["busy_fraction"] = out["device_busy_s"] / out["wall_s"] if out["wall_s"] > 0 else 0.0
        for key in _PEAKS:
            out[key] = max(p.get(key, 0) for p in procs)
    out["processes"] = procs
    return out
