"""Every benchmark script imports and explains itself (``--help``): a refactoring that breaks one is
caught here, not on the day someone wants its numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import child_env

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 6


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_help(script):
    res = subprocess.run([sys.executable, str(script), "--help"], env=child_env(), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "usage:" in res.stdout


def test_the_cpu_probe_times_its_loop_in_each_tenth_and_stops_its_process(tmp_path, monkeypatch):
    """``_common.CpuProbe``: a child process times its loop until the probe's block ends; the summary gives the
    median of each tenth of the samples, the child is gone and its file removed."""
    from tests.support import alive, wait_for

    monkeypatch.syspath_prepend(str(BENCH))
    import _common as C

    with C.CpuProbe(tmp_path, every_s=0.01, n=1000) as probe:
        wait_for(lambda: probe.path.read_text().count("\n") >= 20, 60, what="20 probe samples")
        pid = probe._proc.pid
    summary = probe.summary()
    assert summary["n"] >= 20 and len(summary["tenths_ms"]) == 10
    assert 0 < min(summary["tenths_ms"]) <= summary["p50_ms"] * 10
    assert summary["steal_pct"] >= 0 or summary["steal_pct"] != summary["steal_pct"]  # a share, or NaN off Linux
    wait_for(lambda: not alive(pid), 30, what="the probe's process to be gone")
    assert not probe.path.exists()


@pytest.mark.parametrize("truth, true_r, true_a, true_b, started", [
    ("none", 25.0, 1.0, 500.0, ["b"]),  # the default: shortest by estimate (b: 20 s) first
    ("order", 25.0, 1.0, 500.0, ["a"]),  # the order by true run time: a first, admitted on its estimate (50 s)
    ("admit", 25.0, 500.0, 1.0, ["b"]),  # order by estimate; b's true 1 s ends before the shadow time
    ("admit", 25.0, 1.0, 500.0, ["a"]),  # b truly runs 500 s: it would delay the head; a passes instead
    ("shadow", 25.0, 1.0, 500.0, []),  # r truly ends at 25: b (20 s from 10) would delay the head
    ("shadow", 100.0, 1.0, 500.0, ["b"]),
])
def test_backfill_hindsight_answers_one_use_with_the_true_run_time(truth, true_r, true_a, true_b, started):
    """benchmarks/backfill_hindsight.py's plugin: two free GPUs before the head's reserved start (100 s by the
    running job's estimate)."""
    sys.path.insert(0, str(BENCH))
    try:
        import backfill_hindsight as H
    finally:
        sys.path.remove(str(BENCH))
    from tests.cluster.helpers import config, job, make_core, run, starts, submit

    core = make_core(config(["fifo", "gang", "binpack", "backfill_hindsight", "predictor"],
                            backfill_hindsight={"truth": truth}), [("n0", 8)])
    H.TRUE.clear()
    H.TRUE.update(r=true_r, head=100.0, a=true_a, b=true_b)
    run(core, job("r", gpus=6, estimate_s=100.0))
    out = submit(core, job("head", gpus=8, t=1, estimate_s=100.0), job("a", gpus=2, t=2, estimate_s=50.0),
                 job("b", gpus=2, t=3, estimate_s=20.0), now=10.0)
    assert sorted(starts(out)) == started


_WRITER = """
import sys
sys.path.insert(0, sys.argv[1])
import _common as C
from pathlib import Path
for i in range(int(sys.argv[4])):
    C.update_results(f"{sys.argv[3]}-{i}", f"body {sys.argv[3]} {i}", Path(sys.argv[2]))
"""


def test_benchmarks_writing_results_at_once_lose_no_section(tmp_path):
    """``_common.update_results`` from several processes at once: every section each one wrote is in the file
    at the end, once, and no temporary file is left."""
    results, writers, each = tmp_path / "RESULTS.md", 6, 25
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(BENCH), str(results), f"w{w}", str(each)],
                              env=child_env()) for w in range(writers)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    text = results.read_text()
    missing = [f"w{w}-{i}" for w in range(writers) for i in range(each)
               if text.count(f"<!-- bench:w{w}-{i} -->\nbody w{w} {i}\n<!-- /bench:w{w}-{i} -->") != 1]
    assert not missing, f"{len(missing)} of {writers * each} sections lost: {missing[:5]}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RESULTS.md", "RESULTS.md.lock"]


def test_process_cpu_counts_what_a_process_and_its_reaped_children_used_between_marks(monkeypatch):
    """``_common.ProcessCpu``: a process that spins between two marks shows that CPU time, its reaped child's
    shows under ``children``; a pid that is gone reads NaN."""
    import math

    from tests.support import wait_for

    monkeypatch.syspath_prepend(str(BENCH))
    import _common as C

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n" + spin.format(s=0.1)
                               + f"subprocess.run([sys.executable, '-c', {spin.format(s=0.6)!r}])\n"
                               + "sys.stdin.read()\n"], stdin=subprocess.PIPE, env=child_env())
    try:
        cpu = C.ProcessCpu({"p": parent.pid})
        cpu.mark()
        wait_for(lambda: C.ProcessCpu.read(parent.pid)[1] >= 0.55, 60, what="the child to be reaped")
        cpu.mark()
        own, children = cpu.per_step_ms("p", 1)[0], cpu.per_step_ms("p", 1, children=True)[0]
        assert 0 < own < 450 and 550 <= children <= 2000  # the parent spun 0.1 s (and started), its child 0.6 s
    finally:
        parent.communicate(b"", timeout=30)
    assert all(math.isnan(x) for x in C.ProcessCpu.read(parent.pid))


SECTIONED = ["backfill_hindsight", "backfill_jitter", "prediction", "topology"]


@pytest.mark.parametrize("script", SECTIONED)
def test_a_bad_section_name_is_refused_in_one_line_before_any_work(script):
    res = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--section", "x -->"], env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].endswith("'x -->': a section name is letters, digits, '_', '.' and '-'")


def test_update_results_writes_a_named_section_and_refuses_a_name_that_would_break_its_markers(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _common as C

    path = tmp_path / "RESULTS.md"
    C.update_results("prediction-order", "one", path)
    C.update_results("prediction-order", "two", path)
    assert path.read_text().count("<!-- bench:prediction-order -->\ntwo\n<!-- /bench:prediction-order -->") == 1
    with pytest.raises(ValueError, match="not a section name"):
        C.update_results("a -->", "three", path)
    assert "three" not in path.read_text()


def test_a_results_write_waits_for_the_lock_and_says_so(tmp_path):
    """A writer that finds the lock held (another benchmark writing, or one stopped while it writes) says so on
    stderr, waits, and writes once the lock is free."""
    import fcntl
    import select

    results = tmp_path / "RESULTS.md"
    with open(tmp_path / "RESULTS.md.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(BENCH), str(results), "w", "1"], env=child_env(),
                                  stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([writer.stderr], [], [], 60)  # the handshake, bounded: it found the lock held
        line = writer.stderr.readline() if ready else ""
        assert line.startswith("waiting for ") and "another benchmark is writing RESULTS.md" in line
        assert writer.poll() is None and not results.exists()
    assert writer.wait(timeout=60) == 0  # the lock released with the file's close
    assert "<!-- bench:w-0 -->\nbody w 0\n<!-- /bench:w-0 -->" in results.read_text()


@pytest.mark.parametrize("damage", ["end", "start", "both twice", "swapped"])
def test_a_section_with_damaged_markers_is_refused_and_no_other_section_is_touched(tmp_path, monkeypatch, damage):
    """A lone, doubled or swapped marker of the section being written: a replacement from it would take the
    sections after it along, so the write is refused (``DamagedResults``, a one-line exit naming the section) and
    the file is left as is; the section that was to be written is kept beside it."""
    monkeypatch.syspath_prepend(str(BENCH))
    import _common as C

    path = tmp_path / "RESULTS.md"
    for name in ("a", "b"):
        C.update_results(name, f"{name} body", path)
    start, end = "<!-- bench:a -->", "<!-- /bench:a -->"
    text = path.read_text()
    text = {"end": text.replace(end, ""), "start": text.replace(start, ""),
            "both twice": text + f"\n{start}\nx\n{end}\n",
            "swapped": text.replace(start, "@@").replace(end, start).replace("@@", end)}[damage]
    path.write_text(text)
    with pytest.raises(C.DamagedResults, match="section 'a' has") as exc:
        C.update_results("a", "new a", path)
    assert path.read_text() == text and "b body" in text
    kept = tmp_path / "RESULTS.md.a.rejected"
    assert kept.read_text() == "<!-- bench:a -->\nnew a\n<!-- /bench:a -->\n" and str(kept) in str(exc.value)


def test_a_benchmark_that_meets_a_damaged_section_ends_in_one_line(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("<!-- bench:w-0 -->\nold\n")  # a lone start marker
    res = subprocess.run([sys.executable, "-c", _WRITER, str(BENCH), str(results), "w", "1"], env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: {results}: section 'w-0' has 1 start and 0 end markers; mend the file to one of each, in order, or "
        f"none. This run's section is in {results}.w-0.rejected"]
    assert results.read_text() == "<!-- bench:w-0 -->\nold\n"


def test_a_damaged_section_whose_rejected_file_cannot_be_written_prints_the_section(tmp_path):
    """Nowhere to keep the section (a directory where ``RESULTS.md.NAME.rejected`` would go): the run still ends
    with exit status 1 and no traceback, and its section follows the error line on standard error."""
    results = tmp_path / "RESULTS.md"
    results.write_text("<!-- bench:w-0 -->\nold\n")  # a lone start marker
    (tmp_path / "RESULTS.md.w-0.rejected").mkdir()
    res = subprocess.run([sys.executable, "-c", _WRITER, str(BENCH), str(results), "w", "1"], env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {results}: section 'w-0' has 1 start and 0 end markers") and (
        f"could not be kept in {results}.w-0.rejected (Is a directory); it follows." in lines[0]), lines
    assert lines[1:] == ["<!-- bench:w-0 -->", "body w 0", "<!-- /bench:w-0 -->"], lines
    assert results.read_text() == "<!-- bench:w-0 -->\nold\n"


def test_a_results_file_that_cannot_be_written_ends_in_one_line_and_prints_the_section(tmp_path):
    """RESULTS.md's lock cannot be opened (a directory by that name; a read-only folder fails the same way for a
    user other than root): exit status 1, one line saying why, the section after it on stderr, no traceback."""
    results = tmp_path / "RESULTS.md"
    results.write_text("<!-- bench:w-0 -->\nold\n<!-- /bench:w-0 -->\n")
    (tmp_path / "RESULTS.md.lock").mkdir()
    res = subprocess.run([sys.executable, "-c", _WRITER, str(BENCH), str(results), "w", "1"], env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: cannot write section 'w-0' of {results} (Is a directory); it follows.",
        "<!-- bench:w-0 -->", "body w 0", "<!-- /bench:w-0 -->"], res.stderr
    assert results.read_text() == "<!-- bench:w-0 -->\nold\n<!-- /bench:w-0 -->\n"
