"""What every trace reader shares: the record and result types, bad-row accounting, CSV opening,
number parsing, the gang rule, GPU-model constraints and format detection.

Contracts (all readers):
  * A reader returns a ``TraceResult`` (jobs) or ``NodeResult`` (nodes). ``jobs`` is a list of
    ``TraceJob(spec, duration_s, line)`` sorted by ``spec.submit_time``, stable on ties (file order).
  * A bad row never raises and is never dropped silently: it is counted in ``skipped[reason]``
    and, for the first ``max_problems`` bad rows, described in ``problems`` as
    ``"PATH:LINE: reason: detail"``. Every data row is accounted for:
    ``rows == len(jobs) + sum(skipped.values()) + beyond_limit``. Blank lines are not rows.
  * A file that cannot be opened or decoded, is empty, lacks a required column, is not CSV (a line
    longer than ``MAX_LINE_CHARS``, a field over the csv module's limit of 131,072 characters: /dev/zero,
    a binary file) raises one ``ValueError`` naming the file (and the column, or the line).
  * Times and durations (``to_seconds``) are finite and at most ``MAX_SECONDS`` (100 years: Unix
    times up to 2070 pass); a row stating more is a bad row (``bad duration``, ``bad submit_time``...),
    not a job that would stall the simulated clock or overflow every report.
  * No clock, no global random state: the same file and the same seed give the same records.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from cluster.spec import JobSpec, NodeSpec, SpecError, allowed_models, model_allows  # noqa: F401 (the readers' API: re-exported)
from colocate.base.units import LONGEST_S, parse_size

MAX_PROBLEMS = 50  # problem lines kept per file; all bad rows are still counted
MAX_SECONDS = LONGEST_S  # 100 years: the largest time or duration (s) a trace row may state, as a job's report
MAX_LINE_CHARS = 1 << 20  # one line of a table file: a longer one is not a table, and is not read whole


class TraceJob(NamedTuple):
    """One job of a trace: what it asks for, how long it ran (None: the trace does not say) and
    the file line it came from (1-based, the header is line 1)."""

    spec: JobSpec
    duration_s: float | None
    line: int


@dataclass
class TraceResult:
    path: str
    format: str
    jobs: list[TraceJob] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)  # reason -> bad rows
    problems: list[str] = field(default_factory=list)  # the first few bad rows, one line each
    rows: int = 0  # data rows read (blank lines excluded)
    beyond_limit: int = 0  # good jobs left out by ``limit``
    ignored_columns: tuple[str, ...] = ()  # header columns this format does not use


@dataclass
class NodeResult:
    path: str
    format: str
    nodes: list[NodeSpec] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    rows: int = 0
    ignored_columns: tuple[str, ...] = ()


class BadRow(Exception):
    """Raised while parsing one row: ``reason`` is the short key counted in ``skipped``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class RowLog:
    """Counts bad rows by reason and keeps the first ``max_problems`` one-line descriptions."""

    def __init__(self, path: str, max_problems: int | None = None) -> None:
        self.path = path
        self.max_problems = MAX_PROBLEMS if max_problems is None else max_problems
        self.skipped: Counter = Counter()
        self.problems: list[str] = []

    def skip(self, line: int, reason: str, detail: str = "") -> None:
        self.skipped[reason] += 1
        if len(self.problems) < self.max_problems:
            self.problems.append(f"{self.path}:{line}: {reason}" + (f": {detail}" if detail else ""))


def data_rows(reader, width: int, result, log: RowLog) -> Iterator[tuple[int, list[str]]]:
    """A table's data rows as ``(line, row)``: blank lines skipped, the others counted in
    ``result.rows``; a row whose field count is not ``width`` is logged ("wrong field count")
    and not yielded."""
    for row in reader:
        if not row:
            continue
        result.rows += 1
        if len(row) != width:
            log.skip(reader.line_num, "wrong field count", f"{len(row)} fields, the header has {width}")
            continue
        yield reader.line_num, row


# ---------------------------------------------------------------- files


def table_lines(f, path: str) -> Iterator[str]:
    """The lines of the text file ``f`` (opened with ``newline=""``: a line ends at ``\n``, ``\r`` or ``\r\n``
    only), each with its line break, for a ``csv.reader``. A line longer than ``MAX_LINE_CHARS`` raises a
    ``ValueError`` naming the file and line, before it is read whole (/dev/zero has no line break at all)."""
    n = 0
    while line := f.readline(MAX_LINE_CHARS + 1):
        n += 1
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(f"{path}:{n}: a line longer than {MAX_LINE_CHARS:,} characters: not a CSV table")
        yield line


def csv_error(path: str, line: int, e: csv.Error) -> ValueError:
    """A ``csv.Error`` (a field over the module's limit, a NUL, a stray quote) as one line naming the file and line."""
    return ValueError(f"{path}:{line}: malformed CSV: {e}")


@contextmanager
def open_table(path, what: str) -> Iterator[tuple[Iterator[list[str]], list[str]]]:
    """Open ``path`` as CSV and read its header (names stripped, lower-cased, BOM removed).
    Yields ``(reader, names)``. Unreadable, undecodable, malformed or empty files raise
    ``ValueError`` naming the file; ``what`` says what the file should be."""
    path = str(path)
    try:
        f = open(path, newline="", encoding="utf-8-sig")
    except OSError as e:
        raise ValueError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    with f:
        reader = csv.reader(table_lines(f, path))
        try:
            header = next(reader, None)
            if header is None or not any(h.strip() for h in header):
                raise ValueError(f"{path}: empty file or empty header line, expected {what}")
            yield reader, [h.strip().lower() for h in header]
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
        except csv.Error as e:
            raise csv_error(path, reader.line_num, e) from None


def columns(path, names: list[str], what: str, required: tuple[str, ...], optional: tuple[str, ...],
            hint: str = "") -> tuple[dict[str, int], tuple[str, ...]]:
    """Map column name -> index. A missing required column or a repeated name raises
    ``ValueError``; returns the index map and the columns the format ignores."""
    index: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in index:
            raise ValueError(f"{path}: column {n!r} appears twice in the header")
        index[n] = i
    missing = [col for col in required if col not in index]
    if missing:
        raise ValueError(
            f"{path}: missing column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} ({what} "
            f"needs {', '.join(required)}; header has {', '.join(names)}){hint}")
    known = set(required) | set(optional)
    return index, tuple(n for n in names if n not in known)


# ---------------------------------------------------------------- values


def to_float(text: str, col: str, minimum: float | None = None) -> float:
    """A finite number, at least ``minimum`` when given; else ``BadRow('bad COL')``."""
    try:
        v = float(text)
    except ValueError:
        raise BadRow(f"bad {col}", repr(text)) from None
    if not math.isfinite(v) or (minimum is not None and v < minimum):
        raise BadRow(f"bad {col}", repr(text))
    return v


def to_seconds(text: str, col: str, minimum: float | None = None) -> float:
    """A time or duration in seconds: ``to_float``'s number, at most ``MAX_SECONDS`` (100 years) in size;
    else ``BadRow('bad COL')``."""
    v = to_float(text, col, minimum)
    if abs(v) > MAX_SECONDS:
        raise BadRow(f"bad {col}", f"{text!r}: over 100 years ({MAX_SECONDS:.0f} s)")
    return v


def to_size(text: str, col: str) -> int:
    """Bytes from a size (``"16GiB"``, ``"512MB"``, a number); else ``BadRow('bad COL')``."""
    try:
        return parse_size(text)
    except ValueError:
        raise BadRow(f"bad {col}", repr(text)) from None


def to_int(text: str, col: str, minimum: int = 0) -> int:
    """A whole number (``"8"`` or ``"8.0"``) of at least ``minimum``; else ``BadRow('bad COL')``."""
    try:
        v = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise BadRow(f"bad {col}", repr(text)) from None
        if not (math.isfinite(f) and f.is_integer()):
            raise BadRow(f"bad {col}", repr(text)) from None
        v = int(f)
    if v < minimum:
        raise BadRow(f"bad {col}", repr(text))
    return v


def split_gang(n: int, node_gpus: int) -> tuple[int, int]:
    """(workers, gpus per worker) for a job of ``n`` GPUs on nodes of ``node_gpus`` GPUs:
    one worker when it fits one node, else ``n / node_gpus`` full nodes when that divides,
    else ``n`` single-GPU workers."""
    if n <= node_gpus:
        return 1, n
    if n % node_gpus == 0:
        return n // node_gpus, node_gpus
    return n, 1


def check_node_gpus(node_gpus: int) -> None:
    if not (isinstance(node_gpus, int) and node_gpus >= 1):
        raise ValueError(f"node_gpus must be an integer >= 1, got {node_gpus!r}")


def read_job_table(path: str, fmt: str, what: str, required: tuple[str, ...], optional: tuple[str, ...],
                   make: Callable[[dict[str, str], int], tuple[JobSpec, float | None]], limit: int | None,
                   max_problems: int | None) -> TraceResult:
    """A job table with a header: each data row's present columns (stripped) given to ``make(cells, line)``,
    which returns (spec, duration) or raises ``BadRow``/``SpecError`` (the row is skipped and logged); a
    repeated job id is skipped too. The jobs sorted and cut by ``finish``."""
    log = RowLog(path, max_problems)
    result = TraceResult(path, fmt)
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    with open_table(path, what) as (reader, names):
        index, result.ignored_columns = columns(path, names, what, required, optional)
        pick = [(c, index[c]) for c in required + optional if c in index]
        for line, row in data_rows(reader, len(names), result, log):
            try:
                spec, duration = make({c: row[i].strip() for c, i in pick}, line)
                if spec.job_id in seen:
                    raise BadRow("duplicate job_id", spec.job_id)
            except BadRow as e:
                log.skip(line, e.reason, e.detail)
                continue
            except SpecError as e:
                log.skip(line, "bad spec", str(e))
                continue
            seen.add(spec.job_id)
            jobs.append(TraceJob(spec, duration, line))
    result.skipped, result.problems = log.skipped, log.problems
    return finish(result, jobs, limit)


def finish(result: TraceResult, jobs: list[TraceJob], limit: int | None) -> TraceResult:
    """Sort by submit time (stable), keep the first ``limit`` jobs, fill ``result``."""
    if limit is not None and not (isinstance(limit, int) and limit >= 0):
        raise ValueError(f"limit must be an integer >= 0, got {limit!r}")
    jobs.sort(key=lambda j: j.spec.submit_time)
    if limit is not None and len(jobs) > limit:
        result.beyond_limit = len(jobs) - limit
        del jobs[limit:]
    result.jobs = jobs
    return result


# ---------------------------------------------------------------- GPU models


@lru_cache(maxsize=4096)
def normalize_models(raw: str) -> str:
    """Canonical constraint string: the named models, deduplicated, sorted, joined by ``|``
    (``"V100M32|V100M16|V100M32"`` -> ``"V100M16|V100M32"``)."""
    return "|".join(sorted(allowed_models(raw.strip())))


# ---------------------------------------------------------------- detection

JOB_FORMATS = ("philly", "alibaba2023", "pai2020", "csv")
NODE_FORMATS = ("alibaba2023", "pai2020", "csv")
_JOB_SIGNS = (("csv", {"submit_time", "duration", "num_gpus"}),
              ("philly", {"timestamp", "duration", "num_gpus"}),
              ("alibaba2023", {"name", "num_gpu", "gpu_milli"}),
              ("pai2020", {"submit_time", "duration", "num_gpu", "group"}))
_NODE_SIGNS = (("alibaba2023", {"sn", "gpu", "model"}),
               ("pai2020", {"machine", "gpu_type", "cap_gpu"}),
               ("csv", {"gpu_count"}))


def _detect(path, signs, what: str) -> str:
    with open_table(path, what) as (_, names):
        have = set(names)
    for fmt, need in signs:
        if need <= have:
            return fmt
    expected = "; ".join(f"{fmt} ({', '.join(sorted(need))})" for fmt, need in signs)
    raise ValueError(f"{path}: unknown {what} format: header has {', '.join(names)}; expected the columns of "
                     f"{expected}")


def detect_format(path) -> str:
    """Guess a job trace's format from its header: ``philly``, ``alibaba2023``, ``pai2020`` or ``csv``."""
    return _detect(path, _JOB_SIGNS, "job trace")


def detect_node_format(path) -> str:
    """Guess a node list's format from its header: ``alibaba2023``, ``pai2020`` or ``csv``."""
    return _detect(path, _NODE_SIGNS, "node list")
