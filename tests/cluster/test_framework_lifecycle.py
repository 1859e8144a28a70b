"""``cluster.framework_lifecycle``: each notice reaches its point's plugins in order after the framework's own
bookkeeping (nominations, reserved nodes, the claims of preempting jobs). Driven on a bare ``Lifecycle`` with
recording plugins, so each rule is seen alone; the whole framework's preemption is in test_framework.py."""

from __future__ import annotations

import pytest

from cluster.framework_lifecycle import Lifecycle

POINTS = ("on_placed", "on_running", "on_released", "on_ended", "on_promoted", "on_history", "on_progress")


class Bare(Lifecycle):
    def __init__(self, moved=(False, False)) -> None:
        self.calls: list[tuple] = []
        self.unreserved: list[str] = []
        self.nominated = {"big": {"v1", "v2"}, "other": {"v3"}}
        self.victim_of = {"v1": "big", "v2": "big", "v3": "other"}
        self._claims: list[str] = []

        def plugin(name, point, result=None):
            def f(*args):
                self.calls.append((name, point, args))
                return result
            return f

        self.pt = {p: [plugin("a", p, moved[0]), plugin("b", p, moved[1])] for p in POINTS}

    def _unreserve(self, job_id: str) -> None:
        self.unreserved.append(job_id)


class J:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id


class P:
    def __init__(self, pid: str) -> None:
        self.placement_id = pid


@pytest.mark.parametrize("notice, args, point", [
    ("placed", (J("big"), P("big.1"), 5.0), "on_placed"),
    ("running", (J("x"), 5.0), "on_running"),
    ("released", (J("x"), P("x.1"), 5.0), "on_released"),
    ("ended", (J("big"), 5.0), "on_ended"),
    ("promoted", (J("x"), P("x.1"), 5.0), "on_promoted"),
    ("learned", ([1, 2],), "on_history"),
    ("progressed", (J("x"), object(), 5.0), "on_progress"),
])
def test_each_notice_reaches_its_plugins_in_config_order(notice, args, point):
    fw = Bare()
    getattr(fw, notice)(*args)
    assert fw.calls == [("a", point, args), ("b", point, args)]


@pytest.mark.parametrize("notice", ["placed", "ended"])
def test_a_placed_or_ended_job_is_no_longer_nominated_and_holds_no_reserved_nodes(notice):
    fw = Bare()
    getattr(fw, notice)(J("big"), *((P("big.1"),) if notice == "placed" else ()), 5.0)
    assert "big" not in fw.nominated and fw.unreserved == ["big"] and fw.nominated["other"] == {"v3"}


def test_the_last_victim_released_makes_the_preempting_job_a_claim():
    fw = Bare()
    fw.released(J("v"), P("v1"), 1.0)
    assert fw._claims == [] and fw.nominated["big"] == {"v2"}  # one victim still stopping
    fw.released(J("v"), P("v2"), 2.0)
    assert fw._claims == ["big"] and "big" not in fw.nominated
    fw.released(J("v"), P("v2"), 3.0)  # a second release of the same placement: no second claim
    fw.released(J("n"), P("not-a-victim"), 3.0)
    assert fw._claims == ["big"] and fw.victim_of == {"v3": "other"}


@pytest.mark.parametrize("moved, want", [((False, False), False), ((True, False), True), ((False, True), True),
                                         ((None, True), True)])
def test_progress_moved_an_estimate_when_any_plugin_says_so_and_every_plugin_hears_it(moved, want):
    fw = Bare(moved)
    assert fw.progressed(J("x"), object(), 1.0) is want
    assert [c[0] for c in fw.calls] == ["a", "b"]
