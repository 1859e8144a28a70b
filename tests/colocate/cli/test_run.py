"""`colocate run` bad input: exit code 2, one clear error line, never a traceback.

Also checks that well-formed values are accepted and reach the job's environment
(the commands here never import torch, so each case costs one small process).
"""
import sys

import pytest

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


def error_lines(stderr):
    return [l for l in stderr.splitlines() if "error:" in l]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--gpu-mem", "12XB", "--", "python", "-c", "pass"], "12XB"),
        (["--gpu-mem", "abc", "--", "python", "-c", "pass"], "'abc'"),
        (["--gpu-mem", "-1GiB", "--", "python", "-c", "pass"], "--gpu-mem"),
        (["--sm-share", "1.5", "--", "python", "-c", "pass"], "1.5"),
        (["--sm-share", "-0.1", "--", "python", "-c", "pass"], "-0.1"),
        (["--sm-share", "nan", "--", "python", "-c", "pass"], "nan"),
        (["--sm-share", "half", "--", "python", "-c", "pass"], "half"),
        (["--gpu-mem", "0", "--", "python", "-c", "pass"], "more than 0 bytes"),  # was a 0-byte cap: all on the host
        (["--sm-share", "0", "--", "python", "-c", "pass"], "--sm-share 0 pauses the job"),  # waited for ever
        (["--"], "no command"),
        ([], "no command"),
        (["--", "python", "nope.py"], "nope.py"),
        (["--", "python", "-u", "nope.py"], "nope.py"),
        (["--device", "tpu", "--", "python", "-c", "pass"], "tpu"),
        (["--priority", "urgent", "--", "python", "-c", "pass"], "urgent"),
        (["--on-cap", "swap", "--", "python", "-c", "pass"], "swap"),
        (["--gpu", "-1", "--", "python", "-c", "pass"], "--gpu"),
        (["--gpus", "0,0", "--", "python", "-c", "pass"], "--gpus"),
        (["--gpus", "0,x", "--", "python", "-c", "pass"], "--gpus"),
        (["--gpus", "-1", "--", "python", "-c", "pass"], "--gpus"),
        (["--gpus", "", "--", "python", "-c", "pass"], "--gpus"),
        (["--job-id", "j" * 113, "--", "python", "-c", "pass"], "--job-id"),
        (["--job-id", "a\x01b", "--", "python", "-c", "pass"], "--job-id: expected text without control"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_input_exits_2_with_one_error_line(colocate, tmp_path, args, fragment):
    args = [sys.executable if a == "python" else a for a in args]
    proc = colocate(["run", *args], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = error_lines(proc.stderr)
    assert len(errors) == 1, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert lines[-1] == errors[0]  # argparse may print its usage first; the error is the last line
    assert errors[0].startswith("colocate run: error:"), errors[0]
    assert fragment in errors[0], errors[0]
    assert proc.stdout == ""


def test_unknown_subcommand_and_no_subcommand(colocate):
    proc = colocate(["frobnicate"], timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = colocate([], timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "size, nbytes",
    [("1024B", 1024), ("2KiB", 2 * KiB), ("512MiB", 512 * MiB), ("1.5GiB", 3 * GiB // 2), ("100KB", 100_000),
     ("4MB", 4_000_000), ("2GB", 2_000_000_000), ("8gib", 8 * GiB)],
)
def test_sizes_reach_the_job(colocate, tmp_path, size, nbytes):
    code = "import os; print(os.environ['COLOCATE_GPU_MEM'], os.environ['COLOCATE_ENABLED'])"
    proc = colocate(["run", "--device", "sim", "--gpu-mem", size, "--", sys.executable, "-c", code],
                    cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(nbytes), "1"]


@pytest.mark.parametrize("share", ["0", "0.0", "0.25", "1", "1.0"])
def test_share_edges_accepted(colocate, tmp_path, share):
    """A share of 0 (paused) only with a node, whose operator can raise it (the command never imports torch: no
    node is needed to read its variable)."""
    code = "import os; print(os.environ['COLOCATE_SM_SHARE'])"
    node = ["--node", f"ipc://{tmp_path}/node.sock"] if float(share) == 0 else []
    proc = colocate(["run", "--device", "sim", "--sm-share", share, *node, "--", sys.executable, "-c", code],
                    cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) == float(share)


def test_command_options_are_not_parsed_by_colocate(colocate, tmp_path):
    """Everything after `--` belongs to the command, even options colocate also has."""
    code = "import sys; print(sys.argv[1:])"
    proc = colocate(["run", "--device", "sim", "--", sys.executable, "-c", code, "--gpu-mem", "bogus", "--", "x"],
                    cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['--gpu-mem', 'bogus', '--', 'x']"


def test_combined_short_flags_with_c(colocate, tmp_path):
    proc = colocate(["run", "--device", "sim", "--", sys.executable, "-uc", "print('ok')"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_colocate_side_never_imports_torch(run_py):
    code = ("import sys, colocate.cli, colocate.launcher, colocate.cli.run, colocate.base.env, colocate.base.units, "
            "colocate.gpus, colocate.node.server, colocate.clients.node, torch_hooks, torch_hooks.throttle; print('torch' in sys.modules)")
    proc = run_py(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_a_launcher_imports_only_its_own_command(run_py):
    """The node starts one launcher per job: ``colocate run`` loads the run command's module, not every command's
    (the demo, the simulator, Slurm...), and not psutil."""
    code = ("import sys; from colocate.cli import main; "
            "rc = main(['run', '--device', 'sim', '--', sys.executable, '-c', 'pass']); "
            "print(rc, sorted(m for m in sys.modules if m.startswith('colocate.cli.') or m == 'psutil'))")
    proc = run_py(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0 ['colocate.cli._common', 'colocate.cli.run']"


def test_help_and_errors_of_the_whole_command_line_still_list_every_command(colocate):
    from colocate.cli import COMMANDS

    for argv in (["--help"], ["no-such-command"]):
        proc = colocate(argv, timeout=60)
        text = proc.stdout + proc.stderr
        assert all(name in text for name in COMMANDS), (argv, text)


def test_job_that_never_imports_torch_pays_nothing(colocate, tmp_path):
    code = "import sys; print('torch' in sys.modules, 'torch_hooks' in sys.modules)"
    proc = colocate(["run", "--device", "sim", "--", sys.executable, "-c", code], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_gpus_reach_the_job_and_local_rank_picks_a_process_gpu(colocate, tmp_path):
    """--gpus 1,0: the job's list in order; a process with LOCAL_RANK=i sees GPU number i, a worker id JOB/RANK."""
    code = ("import os, subprocess, sys\n"
            "from colocate.base.env import JobEnv\n"
            "print(os.environ['COLOCATE_GPUS'], os.environ.get('COLOCATE_GPU'))\n"
            "for lr in ('0', '1', '2'):\n"
            "    e = JobEnv.from_environ({**os.environ, 'LOCAL_RANK': lr, 'RANK': str(4 + int(lr))})\n"
            "    print(e.gpu, e.device_index, e.worker_id)\n")
    proc = colocate(["run", "--device", "sim", "--gpus", "1,0", "--job-id", "w", "--exit-file", tmp_path / "rc",
                     "--", sys.executable, "-c", code], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["1,0 None", "1 0 w/4", "0 1 w/5", "1 0 w/6"]  # modulo the list's length
    assert (tmp_path / "rc").read_text() == "0\n"
    alias = colocate(["run", "--device", "sim", "--gpu", "1", "--", sys.executable, "-c",
                      "import os; print(os.environ['COLOCATE_GPUS'])"], cwd=tmp_path, timeout=60)
    assert alias.stdout.strip() == "1", alias.stderr


def test_exit_file_records_the_code_even_when_the_command_is_missing(colocate, tmp_path):
    proc = colocate(["run", "--device", "sim", "--exit-file", tmp_path / "rc", "--", sys.executable, "-c",
                     "raise SystemExit(7)"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 7 and (tmp_path / "rc").read_text() == "7\n"
    proc = colocate(["run", "--device", "sim", "--exit-file", tmp_path / "rc2", "--", "no-such-prog-xyz"],
                    cwd=tmp_path, timeout=60)
    assert proc.returncode == 127 and (tmp_path / "rc2").read_text() == "127\n"  # a shell's "not found"


@pytest.mark.parametrize("make, command, code", [
    (None, ["no-such-prog-xyz"], 127),
    (None, ["./no/such/path/prog"], 127),
    (0o644, ["./plain.py"], 126),  # found, not executable
])
def test_a_command_not_found_or_not_runnable_exits_as_a_shell_says(colocate, tmp_path, make, command, code):
    if make is not None:
        (tmp_path / "plain.py").write_text("print('hi')\n")
        (tmp_path / "plain.py").chmod(make)
    proc = colocate(["run", "--device", "sim", "--", *command], cwd=tmp_path, timeout=60)
    errors = error_lines(proc.stderr)
    assert proc.returncode == code and len(errors) == 1 and command[0] in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
