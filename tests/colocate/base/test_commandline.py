"""python_script: which script a python command line runs."""

import pytest

from colocate.base.commandline import python_script


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
