"""python_script: which script a python command line runs."""

import pytest

from colocate.base.commandline import entry_point, python_script


@pytest.mark.parametrize(
    "args, script",
    [
        (["train.py", "--epochs", "3"], "train.py"),
        (["-u", "train.py"], "train.py"),
        (["-O", "-B", "train.py"], "train.py"),
        (["-W", "ignore", "train.py"], "train.py"),
        (["-X", "dev", "train.py"], "train.py"),
        (["-Wignore", "train.py"], "train.py"),
        (["-c", "print(1)"], None),
        (["-m", "pkg.train"], None),
        (["-mpkg.train"], None),
        (["-cprint(1)"], None),
        (["-u", "-m", "pkg"], None),
        ([], None),
        (["-"], "-"),
    ],
)
def test_python_script_detection(args, script):
    assert python_script(args) == script


@pytest.mark.parametrize(
    "command, expected",
    [
        (["python", "train.py", "--lr", "0.1"], ("script", "train.py", ("--lr", "0.1"))),
        (["/usr/bin/python3.11", "-u", "-W", "ignore", "a/b.py"], ("script", "a/b.py", ())),
        (["python", "-m", "pkg.train", "--bs", "8"], ("module", "pkg.train", ("--bs", "8"))),
        (["python", "-mpkg", "x"], ("module", "pkg", ("x",))),
        (["python", "-uc", "print(1)", "y"], ("code", "print(1)", ("y",))),
        (["python", "-", "z"], ("stdin", "-", ("z",))),
        (["python", "--", "t.py", "q"], ("script", "t.py", ("q",))),
        (["python"], ("program", "python", ())),
        (["./run.sh", "--x"], ("script", "./run.sh", ("--x",))),
        (["torchrun", "--nproc", "2", "t.py"], ("program", "torchrun", ("--nproc", "2", "t.py"))),
        ([], ("program", "", ())),
    ],
)
def test_entry_point(command, expected):
    assert entry_point(command) == expected
