"""The fault soak's judge: what the progress file and the journal say happened (not a benchmark itself).

A pure function over parsed records: no clock, no files, no processes. ``benchmarks/_soak.py`` collects
the records; ``check`` counts the four invariants the issue asks for, each 0 for a pass:

* **lost**: a job ``colocate submit`` acknowledged that neither finished (a "done" line of every rank)
  nor ended in the journal as failed or cancelled with a reason. A job the journal calls succeeded
  without every rank's done line counts as lost (its work is), and so does one still active after the
  drain or missing from the journal.
* **finished twice**: a job of which two different placements each did work (wrote a step line) and
  wrote the done lines of all its ranks. A placement that resumed at the last step and only said
  "done" did nothing twice: that is what at-least-once delivery gives when a job ends on a node whose
  report of it never arrived (no fence can prevent it), so it is shown apart (``redone``). A gang rank
  that finished in a placement whose other rank was lost and runs again in the next placement is the
  gang's rule, not a second finish.
* **two copies**: two different processes (pids) of the same job and rank whose progress interleaved:
  a line of one was written between the first and the last line of the other. Counted once per pair;
  ``two_copies_s`` adds up how long each pair's spans overlapped.
* **GPU double**: two different guaranteed jobs whose processes' progress interleaved (same rule) on
  the same node and GPU. Counted once per pair of processes; ``gpu_double_s`` as above.

A worker writes one line per step and a last one when it is done (``format_line``)::

    step JOB PLACEMENT RANK NODE GPU PRIORITY PID STEP UNIX_TIME
    done JOB PLACEMENT RANK NODE GPU PRIORITY PID STEPS UNIX_TIME
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

STEP, DONE = "step", "done"
ENDED = frozenset(("failed", "cancelled"))  # terminal states that need a reason to excuse an unfinished job
TERMINAL = ENDED | {"succeeded"}


@dataclass(frozen=True)
class Line:
    kind: str  # STEP or DONE
    job: str
    placement: str  # "?" when the worker could not tell
    rank: int
    node: str
    gpu: int
    priority: str
    pid: int
    step: int
    t: float  # seconds since the epoch, the worker's clock (one machine: one clock)


@dataclass(frozen=True)
class JobRow:
    """One job of the scheduler's journal, as the soak reads it after the drain."""
    job_id: str
    state: str
    reason: str
    workers: int
    priority: str
    attempt: int = 0


@dataclass
class Report:
    jobs: int = 0  # acknowledged by submit
    finished: int = 0  # acknowledged jobs with a done line of every rank
    ended: dict = field(default_factory=dict)  # journal state -> count, over acknowledged jobs
    lost: list = field(default_factory=list)  # job ids
    finished_twice: list = field(default_factory=list)  # job ids
    redone: list = field(default_factory=list)  # job ids said done again by a placement that did no step
    two_copies: list = field(default_factory=list)  # (job, rank, pid, pid, overlap seconds)
    gpu_double: list = field(default_factory=list)  # (node, gpu, job, pid, job, pid, overlap seconds)
    lines: int = 0

    @property
    def two_copies_s(self) -> float:
        return sum(c[-1] for c in self.two_copies)

    @property
    def gpu_double_s(self) -> float:
        return sum(c[-1] for c in self.gpu_double)

    @property
    def violations(self) -> dict:
        return {"lost": len(self.lost), "finished twice": len(self.finished_twice),
                "two copies progressed": len(self.two_copies), "GPU with two guaranteed jobs": len(self.gpu_double)}

    @property
    def passed(self) -> bool:
        return not any(self.violations.values())


def format_line(ln: Line) -> str:
    return (f"{ln.kind} {ln.job} {ln.placement} {ln.rank} {ln.node} {ln.gpu} {ln.priority} {ln.pid} {ln.step} "
            f"{ln.t:.3f}\n")


def parse(text: str) -> tuple[list[Line], int]:
    """The well-formed lines of a progress file, and how many others it had."""
    out, bad = [], 0
    for raw in text.splitlines():
        parts = raw.split()
        if not parts:
            continue
        try:
            kind, job, placement, rank, node, gpu, prio, pid, step, t = parts
            if kind not in (STEP, DONE):
                raise ValueError(kind)
            out.append(Line(kind, job, placement, int(rank), node, int(gpu), prio, int(pid), int(step), float(t)))
        except ValueError:
            bad += 1
    return out, bad


def _interleaved(a: list[float], b: list[float]) -> float | None:
    """How long two sorted series of line times overlapped, when a line of one lies strictly inside the
    other's [first, last] span; None when they did not interleave."""
    def inside(t: float, span: list[float]) -> bool:
        return span[0] < t < span[-1]

    same = (a[0], a[-1]) == (b[0], b[-1]) and a[0] < a[-1]
    if not (same or inside(b[0], a) or inside(b[-1], a) or inside(a[0], b) or inside(a[-1], b)):
        return None
    return max(0.0, min(a[-1], b[-1]) - max(a[0], b[0]))


def check(lines: list[Line], acked: dict[str, int], journal: dict[str, JobRow]) -> Report:
    """Count the invariants. ``acked``: job id -> workers for every job ``colocate submit`` acknowledged;
    ``journal``: every job row of the scheduler's state file. Jobs that ran but were never acknowledged
    (a submit whose answer was lost) are judged for copies and GPUs like any other."""
    rep = Report(jobs=len(acked), lines=len(lines))
    copies: dict[tuple[str, int, int], list[Line]] = defaultdict(list)  # (job, rank, pid) -> lines
    for ln in lines:
        copies[(ln.job, ln.rank, ln.pid)].append(ln)
    times = {k: sorted(ln.t for ln in v) for k, v in copies.items()}

    done_by_placement: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    done_ranks: dict[str, set[int]] = defaultdict(set)
    worked: set[tuple[str, str]] = set()  # (job, placement) that wrote a step line
    for ln in lines:
        if ln.kind == DONE:
            done_by_placement[ln.job][ln.placement].add(ln.rank)
            done_ranks[ln.job].add(ln.rank)
        else:
            worked.add((ln.job, ln.placement))

    def workers_of(job: str) -> int:
        row = journal.get(job)
        return row.workers if row is not None else acked.get(job, 1)

    for job in sorted(acked, key=_job_key):
        row = journal.get(job)
        if row is not None:
            rep.ended[row.state] = rep.ended.get(row.state, 0) + 1
        finished = done_ranks[job] >= set(range(workers_of(job)))
        rep.finished += finished
        excused = row is not None and row.state in ENDED and bool(row.reason.strip())
        if not (finished or excused):
            rep.lost.append(job)

    for job in sorted(done_by_placement, key=_job_key):
        full = [p for p, ranks in done_by_placement[job].items() if ranks >= set(range(workers_of(job)))]
        if sum((job, p) in worked for p in full) > 1:
            rep.finished_twice.append(job)
        elif len(full) > 1:
            rep.redone.append(job)

    by_worker: dict[tuple[str, int], list[int]] = defaultdict(list)
    for job, rank, pid in copies:
        by_worker[(job, rank)].append(pid)
    for (job, rank), pids in sorted(by_worker.items(), key=lambda kv: (_job_key(kv[0][0]), kv[0][1])):
        pids.sort()
        for i, p in enumerate(pids):
            for q in pids[i + 1:]:
                overlap = _interleaved(times[(job, rank, p)], times[(job, rank, q)])
                if overlap is not None:
                    rep.two_copies.append((job, rank, p, q, round(overlap, 3)))

    on_gpu: dict[tuple[str, int], list[tuple[str, int, int]]] = defaultdict(list)
    for key, lns in copies.items():
        first = lns[0]
        if first.priority == "guaranteed":
            on_gpu[(first.node, first.gpu)].append(key)
    for (node, gpu), keys in sorted(on_gpu.items()):
        keys.sort(key=lambda k: times[k][0])
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                if a[0] == b[0]:
                    continue  # one job's copies are the previous count's business
                if times[b][0] > times[a][-1]:
                    continue
                overlap = _interleaved(times[a], times[b])
                if overlap is not None:
                    rep.gpu_double.append((node, gpu, a[0], a[2], b[0], b[2], round(overlap, 3)))
    return rep


def _job_key(job: str):
    return (0, int(job), "") if job.isdigit() else (1, 0, job)
