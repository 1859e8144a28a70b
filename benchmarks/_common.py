"""Helpers shared by the benchmark scripts (not a benchmark itself).

* ``machine_info()``: date, architecture, cores, CPU model, torch version;
* ``colocate_cmd()``: how to invoke the ``colocate`` launcher;
* ``update_results(name, body)``: replace (or append) the section of
  ``benchmarks/RESULTS.md`` delimited by ``<!-- bench:NAME -->`` ...
  ``<!-- /bench:NAME -->``, leaving every other section untouched;
* ``markdown_table(headers, rows)``;
* ``median_ci(values)``: a sign-test confidence interval for a median (medians
  themselves: ``statistics.median``).
"""

from __future__ import annotations

import argparse
import fcntl
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
EXAMPLES_DIR = ROOT / "examples"
RESULTS = BENCH_DIR / "RESULTS.md"
EXAMPLES = ("cnn", "transformer", "recsys")

RESULTS_HEADER = """# Benchmark results

Each section below is written by one script in `benchmarks/`; re-running a script
replaces only its own section (between its `<!-- bench:NAME -->` markers).
Numbers come from a shared, noisy machine: read medians and ratios, not single times.
"""

DONE_RE = re.compile(r"^done: (\d+) iterations in ([0-9.]+) s \(([0-9.]+) it/s\)", re.M)
ITER_RE = re.compile(r"^iter (\d+)/\S+ loss \S+ it/s ([0-9.]+)", re.M)


def example_path(name: str) -> Path:
    path = EXAMPLES_DIR / f"train_{name}.py"
    if not path.exists():
        raise SystemExit(f"unknown example {name!r}: {path} does not exist (have: {', '.join(EXAMPLES)})")
    return path


def colocate_cmd() -> list[str]:
    """The launcher: the ``colocate`` console script next to this python, else ``python -m colocate``."""
    exe = Path(sys.executable).with_name("colocate")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("colocate")
    if found:
        return [found]
    return [sys.executable, "-m", "colocate"]


def sim_core(gpu: int = 0) -> int:
    """The CPU core the sim device pins GPU ``gpu``'s jobs to (same rule as the runtime)."""
    env_core = os.environ.get("COLOCATE_SIM_CORE")
    if env_core is not None and env_core.strip().isdigit():
        return int(env_core)
    try:
        from colocate.gpus.sim import default_core

        return default_core(gpu)
    except Exception:
        n = os.cpu_count() or 1
        return (n - 1 - gpu) % n


def _sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def torch_version() -> str:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def machine_info() -> dict:
    return {
        "date": _sh(["date", "-u"]) or "unknown",
        "arch": _sh(["uname", "-m"]) or platform.machine(),
        "nproc": _sh(["nproc"]) or str(os.cpu_count()),
        "cpu": cpu_model(),
        "torch": torch_version(),
        "python": platform.python_version(),
    }


def machine_lines(info: dict) -> list[str]:
    return [
        f"- date: {info['date']}",
        f"- machine: {info['arch']}, {info['nproc']} cores, CPU `{info['cpu']}`, "
        f"torch {info['torch']}, Python {info['python']}",
    ]


def invocation() -> str:
    """The command line that ran this benchmark, relative to the repository root."""
    script = Path(sys.argv[0]).resolve()
    try:
        script_s = str(script.relative_to(ROOT))
    except ValueError:
        script_s = str(script)
    return shlex.join(["python", script_s] + sys.argv[1:])


def display(cmd: list[str]) -> str:
    """A command as a reader would type it (``python``, ``colocate``, paths relative to the repo)."""
    out = []
    for i, part in enumerate(cmd):
        if part == sys.executable:
            part = "python"
        elif i == 0 and Path(part).name == "colocate":
            part = "colocate"
        out.append(part)
    return shlex.join(out)


class RunError(Exception):
    """A benchmark run that failed or timed out."""


def console():
    """A rich console for a benchmark's tables: the terminal's width, or wide enough for any table in a
    pipe or a CI log (headers are never cut)."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=250)


def rich_table(title: str, headers: list[str], rows: list[list[str]], *, justify: str = "right", left=()):
    """A rich table of ``rows`` under ``headers``: columns justified ``justify``, those named in ``left`` left."""
    from rich.table import Table

    table = Table(title=title)
    for h in headers:
        table.add_column(h, justify="left" if h in left else justify)
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    def esc(cell) -> str:
        return str(cell).replace("|", "\\|")

    out = ["| " + " | ".join(esc(h) for h in headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


SECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def section_name(value: str) -> str:
    """``argparse`` type of a benchmark's ``--section``: a RESULTS.md section name (letters, digits, ``_``, ``.``,
    ``-``; it goes into the section's ``<!-- bench:NAME -->`` markers)."""
    if not SECTION_NAME.match(value):
        raise argparse.ArgumentTypeError(f"{value!r}: a section name is letters, digits, '_', '.' and '-'")
    return value


class DamagedResults(SystemExit):
    """RESULTS.md has the markers of the section being written damaged (lone, doubled or out of order): nothing
    is written there, the run's section is kept in ``RESULTS.md.NAME.rejected`` beside it, and the benchmark ends
    with one line naming both (exit status 1), not a traceback. Where that file cannot be written, the line says
    why and the section follows it on standard error, so the run's results are never lost."""


class ResultsNotWritten(SystemExit):
    """RESULTS.md (or its lock beside it) could not be written: a read-only folder or file, a directory by that
    name, a full disk. The benchmark ends with one line saying why (exit status 1), not a traceback, and the
    section it would have written follows that line on standard error."""


def update_results(name: str, body: str, path: Path = RESULTS) -> Path:
    """Write ``body`` as section ``name`` of RESULTS.md, replacing an earlier one.

    Safe against benchmarks finishing at once (each its own process): the read, replace and write hold an
    exclusive lock (``flock`` on ``RESULTS.md.lock`` beside it), and the new text goes to a temporary file of this
    writer's own that replaces the file in one rename, so a reader sees the old text or the new, and no section
    another writer put there in the meantime is lost. Raises ``DamagedResults`` where the file's markers of
    ``name`` are damaged, ``ResultsNotWritten`` where the file cannot be written, ``ValueError`` for a name that
    is not a section name."""
    if not SECTION_NAME.match(name):
        raise ValueError(f"update_results: {name!r} is not a section name (letters, digits, '_', '.', '-')")
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    section = f"{start}\n{body.strip()}\n{end}"
    try:
        _write_section(path, name, start, end, section)
    except OSError as e:
        raise ResultsNotWritten(f"error: cannot write section {name!r} of {path} ({e.strerror or e}); it follows."
                                f"\n{section}") from None
    return path


def _write_section(path: Path, name: str, start: str, end: str, section: str) -> None:
    """``update_results``'s locked read, splice and replace of ``path``."""
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another benchmark is writing, or is stopped (SIGSTOP) while it writes: wait
            print(f"waiting for {lock.name}: another benchmark is writing {path.name}", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else RESULTS_HEADER
        starts, ends = text.count(start), text.count(end)
        at, till = text.find(start), text.find(end)
        if (starts, ends) not in ((0, 0), (1, 1)) or at > till:
            # a hand-edited or damaged file: a replacement from a lone marker would take other sections with it
            kept = path.with_name(f"{path.name}.{name}.rejected")
            try:
                kept.write_text(section + "\n")
                where = f"This run's section is in {kept}"
            except OSError as e:  # nowhere to keep it (a directory by that name, a read-only folder): print it
                where = f"This run's section could not be kept in {kept} ({e.strerror or e}); it follows.\n{section}"
            raise DamagedResults(f"error: {path}: section {name!r} has {starts} start and {ends} end markers; mend "
                                 f"the file to one of each, in order, or none. {where}")
        if starts:  # one of each, in order: the section replaces the span from its start to its end marker
            text = text[:at] + section + text[till + len(end):]
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text if text.endswith("\n") else text + "\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise


def median_ci(values, level: float = 0.95) -> tuple[float, float, float]:
    """Distribution-free confidence interval for the median of ``values`` (sign test).

    Returns ``(low, high, coverage)``: order statistics ``x_(k) .. x_(n+1-k)`` with
    ``k`` the largest rank whose two-sided binomial(n, 1/2) coverage is still >=
    ``level``; ``coverage`` is that exact coverage. With fewer than 6 values no
    95% interval exists: the whole range is returned with its (lower) coverage.
    """
    vals = sorted(values)
    n = len(vals)
    if n == 0:
        return float("nan"), float("nan"), 0.0

    def tail(k: int) -> float:  # P(X <= k - 1), X ~ Binomial(n, 1/2)
        return sum(math.comb(n, i) for i in range(k)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * tail(k + 1) >= level:
        k += 1
    return vals[k - 1], vals[n - k], 1 - 2 * tail(k)


def run_measured(cmd: list[str], *, cwd, env=None, timeout: float):
    """Run ``cmd`` to completion; returns (CompletedProcess, wall seconds, CPU seconds).

    CPU seconds are user+sys of every descendant the run waited for (the job and,
    under ``colocate run``, the launcher), from ``getrusage(RUSAGE_CHILDREN)``
    deltas, so runs must not overlap. cpu/wall well below 1 for a single-threaded
    job means it shared its core with someone else (contention).
    Raises ``subprocess.TimeoutExpired``.
    """
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, wall, cpu


def rank(sorted_values, q: float) -> float:
    """The ``q`` quantile (0-1) of already sorted values by the index ``int(q * n)``, clamped to the last;
    nan for none."""
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class DiskProbe:
    """What the disk does to an fsync while a benchmark runs: a thread appends ``chunk`` bytes to a file in
    ``folder`` (put it on the journal's filesystem) and fsyncs it every ``every_s`` seconds, timing each fsync.
    A daemon's commit waits the same way, so a latency tail that matches the probe's is the disk's (on a shared
    machine, other tenants' writes), not the code's. The probe's own load: ``chunk / every_s`` bytes/s.

        with DiskProbe(tmp) as probe:
            ...                       # the measured run
        probe.summary()               # {"n", "p50_ms", "p99_ms", "max_ms", "over_100ms", "tenths_ms"}
    """

    def __init__(self, folder, every_s: float = 0.05, chunk: int = 16384) -> None:
        import threading

        self.path = Path(folder) / "disk-probe.bin"
        self.every_s, self.chunk = every_s, chunk
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-probe", daemon=True)

    def __enter__(self) -> DiskProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        self.path.unlink(missing_ok=True)

    def _run(self) -> None:
        block = os.urandom(self.chunk)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while not self._stop.wait(self.every_s):
                os.write(fd, block)
                t0 = time.perf_counter()
                os.fsync(fd)
                self.samples.append(time.perf_counter() - t0)
        finally:
            os.close(fd)

    def summary(self) -> dict:
        s = sorted(self.samples)
        if not s:
            return {"n": 0, "p50_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan, "over_100ms": 0}
        return {"n": len(s), "p50_ms": rank(s, 0.5) * 1000, "p99_ms": rank(s, 0.99) * 1000, "max_ms": s[-1] * 1000,
                "over_100ms": sum(x > 0.1 for x in s),
                "tenths_ms": [x * 1000 for x in tenth_medians(self.samples)]}


class CpuProbe:
    """How fast this machine runs a fixed piece of Python while a benchmark runs: a child process (its own GIL)
    times a loop of ``n`` additions every ``every_s`` seconds. On a shared VM the host's other tenants slow every
    process, and steal time shows only part of it; the loop slows with them, so a slower tenth of a run that the probe
    shows too is the machine's. Our own processes share the cores with it as well: read it beside a steady load.
    Its own load: about one loop per ``every_s`` (~1 ms per 50 ms here, 2% of a core).

        with CpuProbe(tmp) as probe:
            ...                       # the measured run
        probe.summary()               # {"n", "p50_ms", "tenths_ms", "steal_pct"}

    ``steal_pct``: the share of the machine's CPU time that the hypervisor took while the probe ran (``/proc/stat``),
    NaN where the kernel does not say."""

    LOOP = ("import sys, time\nn, every = int(sys.argv[1]), float(sys.argv[2])\nwhile True:\n"
            "    t = time.perf_counter()\n    s = 0\n    for i in range(n):\n        s += i\n"
            "    print(f'{time.perf_counter() - t:.6f}', flush=True)\n    time.sleep(every)\n")

    def __init__(self, folder, every_s: float = 0.05, n: int = 20000) -> None:
        self.path = Path(folder) / "cpu-probe.txt"
        self.every_s, self.n = every_s, n
        self.samples: list[float] = []
        self._proc: subprocess.Popen | None = None
        self._ticks: list[list[int]] = []

    @staticmethod
    def _cpu_ticks() -> list[int]:
        """The machine's ``cpu`` line of ``/proc/stat``: user nice system idle iowait irq softirq steal ([] elsewhere)."""
        try:
            with open("/proc/stat") as f:
                return [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return []

    def __enter__(self) -> CpuProbe:
        self._ticks = [self._cpu_ticks()]
        with open(self.path, "w") as out:
            self._proc = subprocess.Popen([sys.executable, "-c", self.LOOP, str(self.n), str(self.every_s)],
                                          stdout=out, stderr=subprocess.DEVNULL, start_new_session=True)
        return self

    def __exit__(self, *exc) -> None:
        self._ticks.append(self._cpu_ticks())
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(30)
        with open(self.path) as f:
            self.samples = [float(line) for line in f if line.endswith("\n")]  # the last line may be cut
        self.path.unlink(missing_ok=True)

    def summary(self) -> dict:
        steal = math.nan
        if len(self._ticks) == 2 and all(len(t) == 8 for t in self._ticks):
            d = [b - a for a, b in zip(*self._ticks)]
            steal = 100 * d[7] / sum(d) if sum(d) else math.nan
        if not self.samples:
            return {"n": 0, "p50_ms": math.nan, "tenths_ms": [], "steal_pct": steal}
        return {"n": len(self.samples), "p50_ms": statistics.median(self.samples) * 1000,
                "tenths_ms": [x * 1000 for x in tenth_medians(self.samples)], "steal_pct": steal}


def tenths_of(values: list) -> list[list]:
    """``values`` cut in ten consecutive parts of (nearly) equal length, the empty ones left out."""
    n = len(values)
    return [part for i in range(10) if (part := values[i * n // 10:(i + 1) * n // 10])]


class ProcessCpu:
    """The CPU our own processes use between marks the caller sets (``psutil``'s ``cpu_times``): per process, its
    own (user + system) and that of the children it has reaped (a node's launchers). Beside a probe that shows the
    machine slower in a tenth of a run, a steady CPU per job of our daemons says the slowness was not theirs.

        cpu = ProcessCpu({"node": node.pid})
        cpu.mark()  # ... a tenth of the work ... cpu.mark() ...
        cpu.per_step_ms("node", 100)  # CPU ms per unit of work (100 per step) between consecutive marks

    A process that is gone reads as NaN."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.marks: list[dict[str, tuple[float, float]]] = []

    @staticmethod
    def read(pid: int) -> tuple[float, float]:
        """(own CPU s, reaped children's CPU s) of ``pid``; NaNs if it cannot be read."""
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            return math.nan, math.nan
        return t.user + t.system, t.children_user + t.children_system

    def mark(self) -> None:
        self.marks.append({name: self.read(pid) for name, pid in self.pids.items()})

    def per_step_ms(self, name: str, per_step: int, children: bool = False) -> list[float]:
        """CPU ms per unit between consecutive marks (``per_step`` units each) of process ``name``: its own, or
        with ``children`` its reaped children's."""
        k = 1 if children else 0
        return [1000 * (b[name][k] - a[name][k]) / per_step for a, b in zip(self.marks, self.marks[1:])]


def tenth_medians(values: list) -> list[float]:
    """The median of each of ``tenths_of(values)``: whether a run drifted, and when."""
    return [statistics.median(part) for part in tenths_of(values)]
