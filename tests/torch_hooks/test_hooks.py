"""torch_hooks.install() and the mini-batch boundary hooks, in a fresh subprocess.

The runtime (allocator, hooks, GradScaler patch) is process-global, so one child
process installs it and runs every scenario in order; the tests assert on the
numbers it reports.
"""
import pytest

MiB = 1 << 20

CHILD = r'''
import sys, traceback
out = {}

import torch_hooks
out["torch_after_import"] = "torch" in sys.modules
try:
    torch_hooks.step()
    out["step_before_install"] = "no error"
except RuntimeError as exc:
    out["step_before_install"] = str(exc)

import torch
from colocate.base.env import JobEnv

MiB = 1 << 20
env = JobEnv(enabled=True, job_id="hooks-test", device="sim", gpu_mem=64 * MiB)
rt = torch_hooks.install(env)
rt.keep_records = True  # these scenarios read every batch's record (a standalone job at share 1 keeps none)
out["idempotent"] = torch_hooks.install() is rt and torch_hooks._rt is rt
out["runtime_accessor"] = callable(torch_hooks.runtime) and torch_hooks.runtime() is rt
out["threads"] = torch.get_num_threads()


def iters():
    return rt.book.iterations


def scenario(fn):
    try:
        out[fn.__name__] = fn()
    except Exception:
        out[fn.__name__] = {"_error": traceback.format_exc()}
    return fn


@scenario
def optimizer_loop():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    makers = {"sgd": lambda: torch.optim.SGD(model.parameters(), lr=0.01),
              "adam": lambda: torch.optim.Adam(model.parameters())}
    res = {}
    for name, make in makers.items():  # a script that replaces its optimizer drops the old one
        import gc
        gc.collect()
        opt = make()
        n0 = iters()
        for _ in range(4):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        res[name] = iters() - n0
        del opt
    recs = list(rt.book.records)[-8:]
    res["device_start_seen"] = all(r.device_start_s is not None for r in recs)
    res["indices"] = [r.index for r in recs]
    return res


@scenario
def manual_step():
    w = torch.zeros(4, requires_grad=True)
    n0 = iters()
    for _ in range(3):
        loss = (w - 1).pow(2).sum()
        loss.backward()
        with torch.no_grad():
            w -= 0.1 * w.grad
        w.grad = None
        torch_hooks.step()
    counted = iters() - n0
    n0 = iters()
    for _ in range(3):  # no optimizer and no step(): nothing marks a boundary
        loss = (w - 1).pow(2).sum()
        loss.backward()
    return {"with_step": counted, "without_step": iters() - n0}


@scenario
def grad_scaler_skips():
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    real_steps = []
    opt.register_step_post_hook(lambda *a: real_steps.append(1))
    n0 = iters()
    per_iter = []
    for i in range(6):
        before = iters()
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        scaler.scale(loss).backward()
        if i in (1, 2, 4):  # force a skip: an inf gradient
            model.weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        per_iter.append(iters() - before)
    return {"boundaries": iters() - n0, "real_steps": len(real_steps), "per_iter": per_iter,
            "scale": scaler.get_scale()}


@scenario
def api():
    free, total = torch_hooks.mem_get_info()
    torch_hooks.set_limits(sm_share=0.75)
    lim = torch_hooks.limits()
    torch_hooks.set_limits(sm_share=1.0)
    s = torch_hooks.stats()
    return {"free": free, "total": total, "limits": lim, "stats_keys": sorted(s), "iterations": s["iterations"],
            "device": s["device"], "job_id": s["job_id"]}


@scenario
def cap_lowered_mid_run():
    res = {}
    torch_hooks.step()
    x = torch.empty(30 * MiB, dtype=torch.uint8)
    y = torch.empty(20 * MiB, dtype=torch.uint8)
    del y  # 20 MiB segment now cached
    torch_hooks.set_limits(mem_cap=40 * MiB)
    res["reserved_before_boundary"] = rt.device.memory().reserved
    torch_hooks.step()
    r = rt.book.records[-1]
    res["fit"] = {"cap": r.mem_cap, "reserved": r.mem_reserved, "floor": r.mem_floor}
    res["fit_now"] = rt.device.memory().reserved
    # below what the live 30 MiB tensor needs: the floor is reported, new bytes go to host
    torch_hooks.set_limits(mem_cap=16 * MiB)
    torch_hooks.step()
    r = rt.book.records[-1]
    res["floor"] = {"cap": r.mem_cap, "reserved": r.mem_reserved, "floor": r.mem_floor}
    z = torch.empty(4 * MiB, dtype=torch.uint8)
    res["host_after_floor"] = rt.device.memory().host
    torch_hooks.step()
    r = rt.book.records[-1]
    res["touched"] = r.host_bytes_touched
    res["penalty"] = r.host_penalty_s
    del z
    # grow: takes effect at once
    torch_hooks.set_limits(mem_cap=128 * MiB)
    w = torch.empty(40 * MiB, dtype=torch.uint8)
    m = rt.device.memory()
    res["grow"] = {"host": m.host, "reserved": m.reserved, "cap": m.cap}
    del w, x
    s = torch_hooks.stats()
    res["summary_floor"] = s["mem_floor_peak_bytes"]
    res["summary_over_cap"] = s["boundary_reserved_over_cap_max_bytes"]
    return res


@scenario
def two_optimizers():
    gen, disc = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    og, od = torch.optim.SGD(gen.parameters(), lr=0.01), torch.optim.SGD(disc.parameters(), lr=0.01)
    n0 = iters()
    for _ in range(3):  # one GAN-style iteration: two optimizers step
        disc(gen(torch.randn(2, 4)).detach()).sum().backward()
        od.step(); od.zero_grad()
        disc(gen(torch.randn(2, 4))).sum().backward()
        og.step(); og.zero_grad()
    return {"boundaries": iters() - n0}


@scenario
def lean_boundaries():
    """The real sim device's ``quiet``: within the cap a standalone share-1 job keeps no record;
    host-served bytes (cap below the need) bring the full boundary back, penalty charged."""
    rt.keep_records = False
    torch_hooks.set_limits(mem_cap=64 * MiB, sm_share=1.0)
    x = torch.empty(1 * MiB, dtype=torch.uint8)
    torch_hooks.step()  # the cap change above may leave a shrink pending: this boundary is full
    n_rec, n0 = len(rt.book.records), iters()
    for _ in range(3):
        y = torch.empty(2 * MiB, dtype=torch.uint8)
        del y
        torch_hooks.step()
    res = {"quiet_records": len(rt.book.records) - n_rec, "quiet_iters": iters() - n0}
    torch_hooks.set_limits(mem_cap=4 * MiB)
    torch_hooks.step()  # shrink: full
    n_rec, pen0 = len(rt.book.records), rt.book.host_penalty_s
    h = torch.empty(8 * MiB, dtype=torch.uint8)  # over the cap: host-served
    torch_hooks.step()
    res["host_records"] = len(rt.book.records) - n_rec
    res["host_penalty"] = rt.book.host_penalty_s - pen0
    del h, x
    torch_hooks.set_limits(mem_cap=128 * MiB)
    rt.keep_records = True
    return res


@scenario
def remove_hooks():
    from torch_hooks.hooks import remove_hooks
    scaler_step = torch.amp.GradScaler.step
    remove_hooks()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n0 = iters()
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    return {"counted": iters() - n0, "scaler_restored": torch.amp.GradScaler.step is not scaler_step}


emit(out)
'''


@pytest.fixture(scope="module")
def out(run_py_json):
    return run_py_json(CHILD)


@pytest.fixture
def sc(out):
    def get(name):
        res = out[name]
        assert not (isinstance(res, dict) and "_error" in res), res.get("_error")
        return res

    return get


def test_importing_torch_hooks_does_nothing(out):
    assert out["torch_after_import"] is False
    assert "not installed" in out["step_before_install"]


def test_install_is_idempotent_and_uses_one_thread(out):
    assert out["idempotent"] is True
    assert out["threads"] == 1


def test_runtime_accessor_survives_install(out):
    assert out["runtime_accessor"] is True


def test_optimizer_step_marks_each_iteration(sc):
    r = sc("optimizer_loop")
    assert r["sgd"] == 4 and r["adam"] == 4
    assert r["device_start_seen"]  # the first forward of every batch was seen
    assert r["indices"] == sorted(r["indices"]) and len(set(r["indices"])) == 8


def test_explicit_step_for_loops_without_optimizer(sc):
    r = sc("manual_step")
    assert r["with_step"] == 3
    assert r["without_step"] == 0


def test_grad_scaler_skipped_steps_count_once(sc):
    r = sc("grad_scaler_skips")
    assert r["real_steps"] == 3, "the inf gradients must have made GradScaler skip optimizer.step()"
    assert r["per_iter"] == [1, 1, 1, 1, 1, 1]
    assert r["boundaries"] == 6
    assert r["scale"] < 1024.0


def test_public_api(sc):
    r = sc("api")
    assert r["total"] == 64 * MiB  # the job sees its cap as the device total
    assert 0 <= r["free"] <= r["total"]
    assert r["limits"]["sm_share"] == 0.75 and r["limits"]["mem_cap"] == 64 * MiB
    for key in ("iterations", "wall_s", "device_busy_s", "busy_fraction", "mem_cap_bytes",
                "mem_reserved_peak_bytes", "mem_allocated_peak_bytes", "host_bytes_peak"):
        assert key in r["stats_keys"]
    assert r["iterations"] == 17  # 8 optimizer steps + 3 step() calls + 6 scaler iterations
    assert r["device"] == "sim" and r["job_id"] == "hooks-test"


def test_cap_lowered_mid_run_is_honoured_within_one_batch(sc):
    r = sc("cap_lowered_mid_run")
    assert r["reserved_before_boundary"] > 40 * MiB  # shrinking frees nothing before the boundary
    assert r["fit"]["cap"] == 40 * MiB
    assert r["fit"]["reserved"] <= 40 * MiB and r["fit"]["floor"] == 0
    assert r["fit_now"] <= 40 * MiB


def test_cap_below_live_tensors_reports_floor_and_uses_host(sc):
    r = sc("cap_lowered_mid_run")
    f = r["floor"]
    assert f["cap"] == 16 * MiB
    assert f["reserved"] >= 30 * MiB and f["floor"] == f["reserved"]
    assert r["host_after_floor"] >= 4 * MiB
    assert r["touched"] >= 4 * MiB and r["penalty"] > 0
    assert r["summary_floor"] >= 30 * MiB
    assert r["summary_over_cap"] >= 14 * MiB


def test_cap_grow_is_immediate(sc):
    r = sc("cap_lowered_mid_run")["grow"]
    assert r["cap"] == 128 * MiB
    assert r["host"] == 0 and r["reserved"] >= 70 * MiB


def test_two_optimizers_count_one_iteration(sc):
    assert sc("two_optimizers")["boundaries"] == 3


def test_remove_hooks(sc):
    r = sc("remove_hooks")
    assert r["counted"] == 0
    assert r["scaler_restored"]


def test_lean_boundaries_on_the_sim_device(sc):
    r = sc("lean_boundaries")
    assert r["quiet_iters"] == 3 and r["quiet_records"] == 0
    assert r["host_records"] == 1 and r["host_penalty"] > 0
