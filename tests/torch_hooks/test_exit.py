"""torch_hooks/__init__.py at exit: a job ending on an uncaught out-of-memory error (its cap) says so in its
Goodbye to its node (which tells the scheduler: the run's exit state); any other end says "exit"."""

from __future__ import annotations

import sys

import pytest

import torch_hooks
from colocate import protocol as P


class Link:
    def __init__(self):
        self.reason = None

    def stop(self, reason="exit", timeout=1.0):
        self.reason = reason


class Env:
    stats_dir = ""


class Rt:
    def __init__(self):
        self.link, self.env = Link(), Env()

    def close(self):
        pass


@pytest.mark.parametrize("exc, reason", [
    (RuntimeError("CUDA error\ncolocate: device memory cap of 64.0 MiB exceeded (asked 8.0 MiB)"), P.GOODBYE_OOM),
    (ValueError("a bug in the script"), "exit"),
])
def test_the_goodbye_says_whether_the_job_ran_out_of_memory(monkeypatch, capsys, exc, reason):
    monkeypatch.setattr(sys, "excepthook", lambda *a: None)
    monkeypatch.setattr(torch_hooks, "_died_of_oom", False)
    torch_hooks._install_excepthook("sim")
    sys.excepthook(type(exc), exc, None)
    rt = Rt()
    torch_hooks._at_exit(rt)
    assert rt.link.reason == reason
    if reason == P.GOODBYE_OOM:
        assert capsys.readouterr().err.strip() == "colocate: device memory cap of 64.0 MiB exceeded (asked 8.0 MiB)"
