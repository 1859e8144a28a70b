"""Temporary Unix accounts for the tests of who may do what (issue 22): made with ``useradd``, removed with
``userdel`` at the end of the test. Where the suite is not root, ``needs_root`` skips with one line."""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support import dists_with_requirements

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


# what a process of another account imports: the daemons' own requirements (not torch, numpy, matplotlib)
_SHARED_DISTS = ("pyzmq", "msgpack", "psutil", "rich", "prometheus-client")
_SHARED_PACKAGES = ("colocate", "torch_hooks", "cluster")


def _open_copy(root: Path) -> None:
    """Copies this checkout's packages and the files of ``_SHARED_DISTS`` (and what they need) into ``root``,
    every file readable and every folder passable by others."""
    repo = Path(__file__).resolve().parent.parent
    for package in _SHARED_PACKAGES:
        shutil.copytree(repo / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    for dist in dists_with_requirements(_SHARED_DISTS):
        for f in dist.files or []:
            if f.parts[0] == ".." or "__pycache__" in f.parts:  # scripts in bin/, byte code
                continue
            src = Path(f.locate())
            if src.is_file():
                (root / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, root / f)
    for dirpath, _dirs, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


_shared: tuple[str, str] | None = None


def shared_python() -> tuple[str, str]:
    """An interpreter of this Python version that other accounts can run, and a PYTHONPATH they can read that
    gives it this checkout and the daemons' packages. The checkout and the suite's packages may lie where
    others cannot pass (a venv or a clone under root's closed home, as in CI): they are copied once per test
    process into a folder open to all, removed when the process ends. Skips with one line where there is no
    such interpreter."""
    global _shared
    if _shared is not None:
        return _shared
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    exe = next((e for e in (sys.executable, f"/usr/bin/python{version}", f"/usr/local/bin/python{version}")
                if os.path.exists(e) and _open_to_others(e)), None)
    if exe is None:
        pytest.skip(f"no python{version} that other accounts can run")
    root = Path(tempfile.mkdtemp(prefix="cl-shared-py-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    _open_copy(root)
    _shared = (exe, str(root))
    return _shared


class Users:
    """Accounts made for one test; ``add(role)`` returns the account's name (short, unique on this host)."""

    def __init__(self):
        self.names: list[str] = []

    made = 0  # accounts this process has made: a part of each name, so no two tests of one worker share one

    def add(self, role: str) -> str:
        Users.made += 1
        name = f"cl{os.getpid() % 100000}x{Users.made}{role}"[:31]
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
            procs = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
            for proc in procs:  # the account is this test's: so is every process of it
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(procs, timeout=30)  # userdel refuses an account a live process still runs as
            res = subprocess.run(["userdel", name], capture_output=True, text=True, timeout=60)
            if res.returncode != 0 and name in {p.pw_name for p in pwd.getpwall()}:
                raise RuntimeError(f"userdel {name}: {res.stderr.strip() or res.returncode}")
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
