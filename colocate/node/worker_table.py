"""The node's table of placements and their worker processes, persisted so it survives a node crash.

The data is ``colocate.node.table.PlacementTable`` (what the node's pure core changes); this module is its files:
``STATE_DIR/workers.json`` (compact JSON), rewritten atomically (write, then rename) after every change,
``STATE_DIR/done.log``, appended to, and a lock file ``STATE_DIR/lock`` (``flock``) held while a node uses the
folder, so two nodes never share a table. ``workers.json`` records, per placement: the job, its priority, whether
it was promoted or is stopping, and per worker its rank, GPUs, pid, the process's create time (so that a reused pid
is never taken for the worker), its log and exit-status files and, once known, its exit code; and the ids of
placements refused or stopped before they started. ``done.log`` has one line (``KEY JOB``) per placement retired
after it ended, appended before the ``workers.json`` that no longer holds it, and rewritten with the newest
``KEEP_IDS`` once it holds twice that. So no placement id starts twice, not even across a restart, and a save costs
what the live placements cost, not the thousands of ids retired before (format 1 files, which kept those ids in
``workers.json``, are read too). Each worker
records the node incarnation (epoch) that started it: the lease covers the epochs of the workers the node holds.

A file that is not a table (bad JSON, a field of the wrong type, a placement that is not a map...) is refused by
``decode`` in one line (``TableError``); ``load`` then moves it aside, starts empty and marks the table ``lost``, as
it does for a missing table whose node left a lease behind: the node then fences what the lost table held
(``colocate.node.fencing``). A state folder deleted under a running node is made again by ``restore``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import time
from dataclasses import MISSING, fields

from colocate.base.files import remove_temporaries, write_json_atomic, write_text_atomic
from colocate.base.vocab import JobClass
from colocate.node.table import KEEP_IDS, LocalPlacement, PlacementTable, Worker, scoped

log = logging.getLogger("colocate.node.workers")

FORMAT = 2  # 2: retired ids in done.log, not in workers.json
FORMATS = (1, FORMAT)  # read
__all__ = ["FORMAT", "KEEP_IDS", "LocalPlacement", "PlacementTable", "StateDirError", "TableError", "Worker", "WorkerTable",
           "decode", "scoped"]


class StateDirError(Exception):
    """The state folder cannot be used (another node holds it, or it cannot be created)."""


class TableError(ValueError):
    """A worker table file that is not one; ``str()`` is one line naming what is wrong."""


_NUM = (int, float)
_WORKER_TYPES = {"rank": int, "local_rank": int, "gpus": list, "pid": int, "create_time": _NUM, "log_path": str,
                 "exit_file": str, "exit_code": (int, type(None)), "kill_at": (*_NUM, type(None)), "killed": bool,
                 "fenced": bool, "epoch": int, "oom": bool, "reclaimed": bool}
_PLACEMENT_TYPES = {"placement_id": str, "job_id": str, "priority": str, "workers": list, "promoted": bool,
                    "stopping": bool, "stop_reason": str, "ended_at": (*_NUM, type(None)), "cluster": str,
                    "start_mem": int, "start_share": _NUM}
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", list: "a list", bool: "true or false",
               dict: "a map"}


def _typed(obj, types: dict, defaults: dict, where: str) -> dict:
    """The fields of ``types`` from map ``obj`` (unknown keys ignored: a newer node's), checked."""
    if type(obj) is not dict:
        raise TableError(f"{where}: expected a map, got {type(obj).__name__}")
    out = {}
    for name, want in types.items():
        if name not in obj:
            if name not in defaults:
                raise TableError(f"{where}: missing {name!r}")
            continue
        v = obj[name]
        wants = want if isinstance(want, tuple) else (want,)
        # bool is an int to Python, never to the table; a float must be finite
        if type(v) not in wants or (type(v) is float and not math.isfinite(v)):
            shown = repr(v)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            what = " or ".join(_TYPE_NAMES.get(t, "null") for t in wants)
            raise TableError(f"{where}.{name}: expected {what}, got {shown}")
        out[name] = v
    return out


_PLACEMENT_FIELDS = tuple(f.name for f in fields(LocalPlacement))
_WORKER_FIELDS = tuple(f.name for f in fields(Worker))


def _placement_map(p: LocalPlacement) -> dict:
    """``p`` as the table file writes it (the job class under its file key, "priority"): what ``asdict`` gives,
    field by field, without its deep copies (the node saves its table on every event). The lists in it are
    ``p``'s own: serialise it before ``p`` changes."""
    out = {name: getattr(p, name) for name in _PLACEMENT_FIELDS}
    out["priority"] = out.pop("klass")
    out["workers"] = [{name: getattr(w, name) for name in _WORKER_FIELDS} for w in p.workers]
    return out


def _defaults(cls) -> dict:
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


def _str_map(obj, where: str, value=str) -> dict:
    if type(obj) is not dict:
        raise TableError(f"{where}: expected a map, got {type(obj).__name__}")
    for k, v in obj.items():
        if value is list:
            if type(v) is not list or len(v) != 2 or not all(type(x) is str for x in v):
                raise TableError(f"{where}[{k!r}]: expected [job id, reason]")
        elif type(v) is not str:
            raise TableError(f"{where}[{k!r}]: expected a string, got {type(v).__name__}")
    return {k: (list(v) if value is list else v) for k, v in obj.items()}


def decode(data) -> tuple[dict, dict, dict, dict]:
    """(placements by key, done, refused, stopped_unknown) from a table file's JSON value; ``TableError`` (one
    line) for anything that is not a table of this ``FORMAT``."""
    if type(data) is not dict:
        raise TableError(f"expected a map, got {type(data).__name__}")
    if data.get("format") not in FORMATS or type(data.get("format")) is not int:
        raise TableError(f"format {data.get('format')!r}, expected {FORMAT}")
    raw = data.get("placements")
    if type(raw) is not list:
        raise TableError(f"placements: expected a list, got {type(raw).__name__}")
    placements: dict[str, LocalPlacement] = {}
    wdef, pdef = _defaults(Worker), {**_defaults(LocalPlacement), "workers": []}
    for i, p in enumerate(raw):
        where = f"placements[{i}]"
        fields_ = _typed(p, _PLACEMENT_TYPES, pdef, where)
        if fields_["priority"] not in tuple(JobClass):
            raise TableError(f"{where}.priority: {fields_['priority']!r} is not a priority")
        fields_["klass"] = JobClass(fields_.pop("priority"))
        workers = []
        for j, w in enumerate(fields_.pop("workers", [])):
            wf = _typed(w, _WORKER_TYPES, wdef, f"{where}.workers[{j}]")
            if not all(type(g) is int and g >= 0 for g in wf["gpus"]):
                raise TableError(f"{where}.workers[{j}].gpus: expected GPU indices")
            if wf["pid"] <= 0 or wf["rank"] < 0 or wf["local_rank"] < 0:
                raise TableError(f"{where}.workers[{j}]: a pid, rank or local rank out of range")
            workers.append(Worker(**wf))
        placement = LocalPlacement(**fields_, workers=workers)
        placements[scoped(placement.cluster, placement.placement_id)] = placement
    done = _str_map(data.get("done", {}), "done")  # format 1
    refused = _str_map(data.get("refused", {}), "refused", list)
    stopped = _str_map(data.get("stopped_unknown", {}), "stopped_unknown")
    return placements, done, refused, stopped


def lease_path(state_dir: str) -> str:
    """The node's lease file (``colocate.base.lease``): beside its table, in its state folder."""
    return os.path.join(state_dir, "lease")


class WorkerTable(PlacementTable):
    """A ``PlacementTable`` with its file and folder: the edge loads it, calls ``save()`` after each change the
    node's core makes, and holds the folder's lock while the node uses it."""

    def __init__(self, state_dir: str):
        super().__init__()
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, "workers.json")
        self.done_path = os.path.join(state_dir, "done.log")
        self.lease_path = lease_path(state_dir)
        self._done_lines = 0  # lines in done.log (rewritten at 2 * KEEP_IDS)
        self._done_new: list[tuple[str, str]] = []  # retired since the last save: appended to done.log first
        self.lost = False  # load(): the last incarnation's table is gone or unreadable
        self._lock_fd: int | None = None

    # ------------------------------------------------------------------ folder
    def lock(self) -> None:
        """Take the folder for this node, and remove the temporaries of its table and lease that a node killed while
        saving left (``PATH.tmp.PID``); ``StateDirError`` when another live node holds it."""
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
        # no other node writes here now: a temporary of the table, its done.log or the lease is a dead node's,
        # never read
        for path in (self.path, self.done_path, self.lease_path):
            for p in remove_temporaries(path):
                log.info("removed %s, left by a node that stopped while saving", p)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def remember(self, table: dict, key: str, value) -> None:
        super().remember(table, key, value)
        if table is self.done:
            self._done_new.append((key, value))

    # ------------------------------------------------------------------ load / save
    def load(self) -> None:
        """Read the file if there is one. A file that is not a table is moved aside (and refused in one line):
        the node starts with an empty table, marked ``lost``, rather than not at all. A missing file is ``lost``
        too when the folder holds a lease (a node ran here and saved a table: it was removed)."""
        self.lost = False
        self._load_done()
        if not os.path.exists(self.path):
            self.lost = os.path.exists(self.lease_path)
            if self.lost:
                log.error("worker table %s is missing, but a node ran on this folder (its lease is there): the "
                          "workers it held are fenced", self.path)
            return
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read().decode("utf-8"))
            self.placements, done, self.refused, self.stopped_unknown = decode(data)
            self.done = {**done, **self.done}  # a format 1 file's ids, then done.log's
        except (OSError, ValueError, RecursionError) as exc:  # TableError, JSON and UTF-8 errors are ValueErrors
            aside = f"{self.path}.unreadable-{int(time.time())}"
            why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            log.error("worker table %s is unreadable (%s): moved to %s, starting with an empty table",
                      self.path, why, aside)
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            self.placements, self.refused, self.stopped_unknown = {}, {}, {}
            self.lost = True

    def _load_done(self) -> None:
        """``done.log``'s ids, the newest ``KEEP_IDS`` (a torn last line, from a crash mid-append, is skipped)."""
        self.done, self._done_new = {}, []
        try:
            with open(self.done_path, "rb") as f:
                lines = f.read().decode("utf-8", errors="replace").split("\n")[:-1]  # after the last newline: torn
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("cannot read retired placement ids from %s: %s", self.done_path, exc.strerror)
            return
        for line in lines:
            parts = line.split(" ")
            if len(parts) == 2 and parts[0] and parts[1]:
                self.done.pop(parts[0], None)
                self.done[parts[0]] = parts[1]
        while len(self.done) > KEEP_IDS:
            self.done.pop(next(iter(self.done)))
        self._done_lines = len(lines)

    def _write(self, data: dict) -> None:
        """``done.log`` first, then ``workers.json``: a crash between them leaves an ended placement in both
        (known twice, harmless), never in neither. Raises OSError."""
        if self._done_new:
            self._append_done()
        write_json_atomic(self.path, data, compact=True)

    def _append_done(self) -> None:
        """Write the ids retired since the last save to ``done.log`` (rewritten with the newest ``KEEP_IDS`` once
        it would hold twice that). Raises OSError (the ids then wait for the next save)."""
        new = self._done_new
        if self._done_lines + len(new) > 2 * KEEP_IDS:
            write_text_atomic(self.done_path, "".join(f"{k} {j}\n" for k, j in self.done.items()))
            self._done_lines = len(self.done)
        else:
            with open(self.done_path, "a") as f:
                f.write("".join(f"{k} {j}\n" for k, j in new))
            self._done_lines += len(new)
        self._done_new = []

    def save(self) -> None:
        data = {
            "format": FORMAT,
            "saved_at": time.time(),
            "placements": [_placement_map(p) for p in self.placements.values()],
            "refused": self.refused,
            "stopped_unknown": self.stopped_unknown,
        }
        try:
            try:
                self._write(data)
            except FileNotFoundError:  # the folder was deleted under the node: made again, then saved
                self.restore()
                self._done_lines, self._done_new = 0, list(self.done.items())  # a new done.log: every id again
                self._write(data)
        except OSError as exc:  # a full disk must not take the node down; the table stays in memory
            log.error("cannot save the worker table to %s: %s", self.path, exc.strerror or exc)

    def restore(self) -> bool:
        """Make the state folder again if it was deleted under this node, and take its lock again; True when it was
        missing (logged once per deletion). Raises OSError when it cannot be made."""
        if os.path.isdir(self.state_dir):
            return False
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        log.error("state folder %s was deleted under this node: made it again (the worker table is saved again, "
                  "the lease renewed)", self.state_dir)
        old, self._lock_fd = self._lock_fd, None
        try:
            self.lock()
        except StateDirError as exc:
            log.error("%s", exc)
        finally:
            if old is not None:
                os.close(old)
        return True
