"""The suite's own set-up (``tests/conftest.py``): on xdist workers, tests run in the groups it assigns."""
from __future__ import annotations

import os

import pytest


def test_on_a_worker_each_test_runs_in_its_group(request):
    """xdist (``--dist loadgroup``) sends a group's tests to one worker only when the group is in the test's id
    (``ID@GROUP``), which xdist's collection hook writes from the ``xdist_group`` marker. The conftest's hook
    must mark the tests before that one runs, or every test is a group of its own (module-scoped fixtures set up
    on every worker, and the SIM_CORE tests at once)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("runs on an xdist worker under --dist loadgroup (the suite's addopts)")
    assert request.node.nodeid.endswith("@tests/test_conftest.py"), request.node.nodeid
