"""The node's table of placements and their worker processes, persisted so it survives a node crash.

Plain data plus one JSON file: ``STATE_DIR/workers.json``, rewritten atomically (write, then rename)
after every change, and a lock file ``STATE_DIR/lock`` (``flock``) held while a node uses the folder, so
two nodes never share a table. The file records, per placement: the job, its priority, whether it was
promoted or is stopping, and per worker its rank, GPUs, pid, the process's create time (so that a
reused pid is never taken for the worker), its log and exit-status files and, once known, its exit code.
It also keeps the ids of placements that ended, were refused or were stopped before they started, so
that no placement id starts twice, not even across a restart (the newest ``KEEP_IDS`` of each).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field

from colocate.files import write_json_atomic

log = logging.getLogger("colocate.node.workers")

FORMAT = 1
KEEP_IDS = 10000  # finished / refused / stopped-before-start placement ids remembered


class StateDirError(Exception):
    """The state folder cannot be used (another node holds it, or it cannot be created)."""


@dataclass
class Worker:
    rank: int
    local_rank: int
    gpus: list
    pid: int
    create_time: float  # psutil's create time of ``pid``: the pid and this name one process
    log_path: str
    exit_file: str
    exit_code: int | None = None  # None while it runs
    kill_at: float | None = None  # wall clock: SIGKILL the group then (a stop's grace period)
    killed: bool = False  # SIGKILL sent
    fenced: bool = False  # it ended (non-zero) while the node's lease had lapsed

    @property
    def running(self) -> bool:
        return self.exit_code is None


@dataclass
class Placement:
    placement_id: str
    job_id: str
    priority: str
    workers: list = field(default_factory=list)  # [Worker]
    promoted: bool = False
    stopping: bool = False
    stop_reason: str = ""
    ended_at: float | None = None  # wall clock when its last worker exited
    cluster: str = ""  # the cluster id of the scheduler that placed it ("" if it named none)

    @property
    def running(self) -> bool:
        return any(w.running for w in self.workers)


def scoped(cluster_id: str, placement_id: str) -> str:
    """The node's key of a placement: its id within its cluster (the bare id when no cluster was named)."""
    return f"{cluster_id}/{placement_id}" if cluster_id else placement_id


class WorkerTable:
    """Placements by key (``scoped(cluster, placement id)``) plus the remembered keys; the pure placement core
    (``colocate.node.placements``) changes them, the edge calls ``save()`` after each change."""

    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "workers.json")
        self.placements: dict[str, Placement] = {}
        self.done: dict[str, str] = {}  # key -> job id: ended and forgotten
        self.refused: dict[str, list] = {}  # key -> [job id, reason]
        self.stopped_unknown: dict[str, str] = {}  # key -> job id: stopped before it was ever started
        self._lock_fd: int | None = None

    # ------------------------------------------------------------------ folder
    def lock(self) -> None:
        """Take the folder for this node; ``StateDirError`` when another live node holds it."""
        try:
            os.makedirs(self.state_dir, exist_ok=True)
            fd = os.open(os.path.join(self.state_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StateDirError(f"cannot use state folder {self.state_dir}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StateDirError(f"state folder {self.state_dir} is in use by another running node "
                                "(give each node its own --state-dir)") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    # ------------------------------------------------------------------ load / save
    def load(self) -> None:
        """Read the file if there is one. A file that cannot be read is moved aside (and logged):
        the node starts with an empty table rather than not at all."""
        if not os.path.exists(self.path):
            return
        try:
            with open(self.path) as f:
                data = json.load(f)
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
            for p in data["placements"]:
                workers = [Worker(**{**w, "gpus": list(w["gpus"])}) for w in p.pop("workers")]
                placement = Placement(**p, workers=workers)
                self.placements[scoped(placement.cluster, placement.placement_id)] = placement
            self.done = dict(data.get("done", {}))
            self.refused = {k: list(v) for k, v in data.get("refused", {}).items()}
            self.stopped_unknown = dict(data.get("stopped_unknown", {}))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            aside = f"{self.path}.unreadable-{int(time.time())}"
            log.error("worker table %s is unreadable (%s): moved to %s, starting with an empty table",
                      self.path, exc, aside)
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            self.placements, self.done, self.refused, self.stopped_unknown = {}, {}, {}, {}

    def save(self) -> None:
        data = {
            "format": FORMAT,
            "saved_at": time.time(),
            "placements": [{**asdict(p), "workers": [asdict(w) for w in p.workers]} for p in self.placements.values()],
            "done": self.done,
            "refused": self.refused,
            "stopped_unknown": self.stopped_unknown,
        }
        try:
            write_json_atomic(self.path, data)
        except OSError as exc:  # a full disk must not take the node down; the table stays in memory
            log.error("cannot save the worker table to %s: %s", self.path, exc.strerror)

    # ------------------------------------------------------------------ ids
    def known(self, placement_id: str) -> bool:
        return (placement_id in self.placements or placement_id in self.done or placement_id in self.refused
                or placement_id in self.stopped_unknown)

    def remember(self, table: dict, key: str, value) -> None:
        table[key] = value
        while len(table) > KEEP_IDS:
            table.pop(next(iter(table)))

    def retire(self, now_wall: float, keep_s: float) -> bool:
        """Move placements that ended more than ``keep_s`` ago to ``done``; True if any moved."""
        old = [p for p in self.placements.values() if p.ended_at is not None and now_wall - p.ended_at > keep_s]
        for p in old:
            key = scoped(p.cluster, p.placement_id)
            del self.placements[key]
            self.remember(self.done, key, p.job_id)
        return bool(old)
