"""The scheduler core's outputs are closed unions: its decisions (``cluster.events.Decision``) and a cycle's
actions (``cluster.points.Action``). The edges dispatch on them exhaustively (``match`` ending in
``assert_never``, which mypy checks statically): an object outside the union is an error, never silently
dropped."""

from __future__ import annotations

import random
import typing

import pytest

from cluster import events as ev
from cluster.config_file import resolve
from cluster.core import SchedulerCore
from cluster.framework import Cycle
from cluster.points import Action, Preempt, Upgrade
from tests.cluster.server.helpers import FakeNode, Harness, one_running_job


def test_the_unions_name_every_decision_and_action():
    assert set(typing.get_args(ev.Decision)) == {ev.JobChanged, ev.StartWorkers, ev.StopWorkers, ev.Promote}
    assert set(typing.get_args(Action)) == {Preempt, Upgrade}


def test_every_decision_of_a_job_s_life_is_in_the_union_and_the_service_refuses_another(tmp_path):
    h = Harness(tmp_path / "sched.db")
    n = FakeNode(h, "n1")
    one_running_job(h, n)
    assert set(h.svc.decided) and set(h.svc.decided) <= {c.__name__ for c in typing.get_args(ev.Decision)}
    with pytest.raises(AssertionError):
        h.svc._commit([object()], h.now)


def test_the_core_refuses_an_action_outside_the_union():
    core = SchedulerCore(resolve("gang-binpack"), random.Random(0))
    core.skip_idle = False
    core.fw.run_cycle = lambda now: Cycle(actions=[object()])
    with pytest.raises(AssertionError):
        core.schedule(0.0)
