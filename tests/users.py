"""Temporary Unix accounts for the tests of who may do what (issue 22): made with ``useradd``, removed with
``userdel`` at the end of the test. Where the suite is not root, ``needs_root`` skips with one line."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                                reason="needs root and useradd: the test runs a second Unix account")


def _open_to_others(path: str) -> bool:
    """True when every folder on the way to ``path`` and ``path`` itself let others pass (execute)."""
    path = os.path.realpath(path)
    while True:
        try:
            if not os.stat(path).st_mode & 0o001:
                return False
        except OSError:
            return False
        if path == "/":
            return True
        path = os.path.dirname(path)


def shared_python() -> tuple[str, str]:
    """An interpreter of this Python version that other accounts can run, and the PYTHONPATH that gives it
    this checkout and this suite's packages (a venv under root's closed home is not runnable by them).
    Skips with one line where there is none."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for exe in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if os.path.exists(exe) and _open_to_others(exe):
            return exe, os.pathsep.join([repo, sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    pytest.skip(f"no python{version} that other accounts can run")


class Users:
    """Accounts made for one test; ``add(role)`` returns the account's name (short, unique on this host)."""

    def __init__(self):
        self.names: list[str] = []

    def add(self, role: str) -> str:
        name = f"cl{os.getpid() % 100000}{role}"[:31]
        subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", "--home-dir",
                        f"/nonexistent/{name}", name], check=True, capture_output=True, text=True, timeout=60)
        self.names.append(name)
        return name

    def uid(self, name: str) -> int:
        return pwd.getpwnam(name).pw_uid

    def as_user(self, name: str) -> dict:
        """``subprocess`` arguments that run a command as account ``name`` (its uid, group and groups)."""
        pw = pwd.getpwnam(name)
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(name, pw.pw_gid)}

    def remove(self) -> None:
        import psutil

        for name in self.names:
            uid = self.uid(name)
            for proc in psutil.process_iter(["uids"]):  # the account is this test's: so is every process of it
                if proc.info["uids"] and proc.info["uids"].real == uid:
                    try:
                        proc.kill()
                    except psutil.Error:
                        pass
            subprocess.run(["userdel", name], capture_output=True, timeout=60)
        self.names.clear()


@pytest.fixture
def users():
    u = Users()
    yield u
    u.remove()


@pytest.fixture
def open_dir():
    """A folder (0711, root's) others may pass through but not list: node sockets, state and logs of tests
    whose jobs run as other accounts (pytest's own tmp folders are closed to them)."""
    path = Path(tempfile.mkdtemp(prefix="cl-open-"))
    os.chmod(path, 0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)
