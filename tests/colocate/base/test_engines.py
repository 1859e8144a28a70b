"""colocate.base.engines: an engine's resolver turns what the engine set into the worker's COLOCATE_* values.

In-process: the table of engines, the resolver's errors as one line, the values written, the token drawn.
One child process proves the runtime's hook end to end, as an engine starts a worker (no launcher: only
COLOCATE_ENABLED, COLOCATE_ENGINE and the injected sitecustomize on PYTHONPATH): the resolver runs at
``import torch`` before the runtime reads a variable, and a resolver's refusal stops the worker with one line.
"""
from __future__ import annotations

import os

import pytest

from colocate.base import engines
from colocate.launcher import INJECT_DIR
from tests.support import REPO, result_of, run_py

FAKE = {"fake": "tests.colocate.fake_engine:resolve"}


def test_every_engine_has_a_lazy_resolver_named_after_it():
    assert engines.ENGINES == {"ray": "colocate.ray.worker:resolve", "slurm": "colocate.slurm.worker:resolve"}


def test_no_engine_changes_nothing():
    env = {"COLOCATE_SM_SHARE": "0.5"}
    assert engines.resolve(env) == {} and env == {"COLOCATE_SM_SHARE": "0.5"}
    env = {"COLOCATE_ENGINE": ""}
    assert engines.resolve(env, FAKE) == {}


def test_the_resolver_values_replace_the_environment():
    env = {"COLOCATE_ENGINE": "fake", "FAKE_FRACTION": "0.25", "COLOCATE_SM_SHARE": "0.9"}
    values = engines.resolve(env, FAKE)
    assert values["COLOCATE_SM_SHARE"] == "0.25" and env["COLOCATE_SM_SHARE"] == "0.25"
    assert env["COLOCATE_JOB_ID"] == "fake-job" and env["COLOCATE_RANK"] == "1"


@pytest.mark.parametrize("env, engines_table, words", [
    ({"COLOCATE_ENGINE": "nope"}, FAKE, "COLOCATE_ENGINE='nope': must be one of fake"),
    ({"COLOCATE_ENGINE": "fake"}, FAKE, "fake engine: FAKE_FRACTION is not set"),  # the resolver's own line
    ({"COLOCATE_ENGINE": "fake", "FAKE_FRACTION": "bad-key"}, FAKE, "set 'PATH', which is not a COLOCATE_*"),
    ({"COLOCATE_ENGINE": "gone"}, {"gone": "tests.colocate.no_such_module:resolve"}, "cannot import"),
    ({"COLOCATE_ENGINE": "odd"}, {"odd": "tests.colocate.fake_engine:nothing"}, "has no nothing()"),
])
def test_a_refusal_is_one_line(env, engines_table, words):
    with pytest.raises(ValueError) as info:
        engines.resolve(dict(env), engines_table)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_prepare_draws_a_token_only_when_none_is_set():
    env: dict[str, str] = {}
    engines.prepare(env)
    token = env["COLOCATE_TOKEN"]
    assert len(token) == 32
    engines.prepare(env)
    assert env["COLOCATE_TOKEN"] == token
    other: dict[str, str] = {}
    engines.prepare(other)
    assert other["COLOCATE_TOKEN"] != token
    kept = {"COLOCATE_TOKEN": "from-the-launcher"}
    engines.prepare(kept)
    assert kept["COLOCATE_TOKEN"] == "from-the-launcher"


WORKER = r'''
import os
import colocate.base.engines as E
E.ENGINES["fake"] = "tests.colocate.fake_engine:resolve"
import torch  # the injected sitecustomize installs the runtime here
import torch_hooks
rt = torch_hooks.runtime()
emit({"installed": rt is not None, "job": rt.env.job_id, "worker": rt.env.worker_id, "share": rt.limits()["sm_share"],
      "cap": rt.limits()["mem_cap"], "token": os.environ.get("COLOCATE_TOKEN", ""), "env_token": rt.env.token})
'''


def _engine_worker(extra: dict):
    prelude = "import json\ndef emit(o):\n    print('@@RESULT@@' + json.dumps(o), flush=True)\n"
    env = {"COLOCATE_ENABLED": "1", "COLOCATE_ENGINE": "fake", "COLOCATE_SM_SHARE": "0.9",
           "PYTHONPATH": os.pathsep.join([INJECT_DIR, str(REPO)]), **extra}
    return run_py(prelude + WORKER, env=env, timeout=120)


def test_an_engine_worker_runs_with_what_its_resolver_decided():
    proc = _engine_worker({"FAKE_FRACTION": "0.25"})
    assert proc.returncode == 0, proc.stderr
    out = result_of(proc.stdout, proc.stderr)
    assert out["installed"] and out["job"] == "fake-job" and out["worker"] == "fake-job/1"
    assert out["share"] == 0.25 and out["cap"] == (1 << 30) // 4  # not the 0.9 the environment had
    assert len(out["token"]) == 32 and out["env_token"] == out["token"]  # drawn by the worker itself


def test_an_engine_worker_refused_by_its_resolver_stops_with_one_line():
    proc = _engine_worker({})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "colocate: fake engine: FAKE_FRACTION is not set"
    assert "@@RESULT@@" not in proc.stdout


DEFERRED = r'''
import os
import colocate.base.engines as E
E.ENGINES["fake"] = "tests.colocate.fake_engine:resolve"
import torch  # the resolver defers here
import torch_hooks
from tests.colocate import fake_engine
deferred = torch_hooks.runtime() is None and len(fake_engine.CALLBACKS) == 1
if os.environ.pop("REFUSE_LATER", ""):
    del os.environ["FAKE_FRACTION"]
else:
    os.environ["FAKE_FRACTION"] = "0.25"
fake_engine.CALLBACKS.pop()()  # the engine's worker is set up: what Ray Train's set_train_context does
rt = torch_hooks.runtime()
emit({"deferred": deferred, "job": rt.env.job_id, "share": rt.limits()["sm_share"]})
'''


@pytest.mark.parametrize("refuse", [False, True], ids=["installs", "refused"])
def test_a_deferred_engine_worker_installs_when_the_engine_calls_back(refuse):
    """A resolver that raises ``Deferred`` gets the runtime's install step to call back (it never imports the
    runtime): nothing is installed at ``import torch``, the runtime is once called back; a refusal then still
    ends the worker with one line, exit 2."""
    prelude = "import json\ndef emit(o):\n    print('@@RESULT@@' + json.dumps(o), flush=True)\n"
    env = {"COLOCATE_ENABLED": "1", "COLOCATE_ENGINE": "fake", "FAKE_FRACTION": "defer",
           "PYTHONPATH": os.pathsep.join([INJECT_DIR, str(REPO)]), **({"REFUSE_LATER": "1"} if refuse else {})}
    proc = run_py(prelude + DEFERRED, env=env, timeout=120)
    if refuse:
        assert (proc.returncode, proc.stderr.strip()) == (2, "colocate: fake engine: FAKE_FRACTION is not set")
        return
    assert proc.returncode == 0, proc.stderr
    assert result_of(proc.stdout, proc.stderr) == {"deferred": True, "job": "fake-job", "share": 0.25}
