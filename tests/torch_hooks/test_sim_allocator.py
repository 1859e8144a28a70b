"""torch_hooks/csrc/sim_allocator.cpp: the caching-allocator model behind the simulated GPU.

Installing the allocator is process-global and irreversible, so every scenario
runs in ONE fresh subprocess (module fixture ``alloc``); each scenario starts
from an empty cache with no cap, returns plain numbers, and the tests below
assert on them. Sizes are exact: ``torch.empty(n, dtype=uint8)`` asks the
allocator for exactly ``n`` bytes.
"""
import pytest

KiB, MiB = 1 << 10, 1 << 20

CHILD = r'''
import gc, threading, traceback, random
import torch
from torch_hooks import _ext

KiB, MiB = 1 << 10, 1 << 20
NO_CAP = 1 << 62
m = _ext.load()
out = {"install": [m.install(), m.install(), m.installed()]}


def t(n):
    return torch.empty(n, dtype=torch.uint8)


def st():
    return dict(m.stats())


def keys(s, *names):
    return {k: s[k] for k in names}


def consistent(s):
    return s["reserved"] == s["allocated"] + s["cached"] and s["peak_reserved"] >= s["reserved"] \
        and s["peak_allocated"] >= s["allocated"] and s["peak_host"] >= s["host"]


SCENARIOS = []


def scenario(fn):
    SCENARIOS.append(fn)
    return fn


@scenario
def small_rounding_and_segments():
    r = {}
    a = t(1); r["a"] = st()
    b = t(1000); r["b"] = st()
    c = t(MiB); r["c"] = st()          # largest small request: still fits the first 2 MiB segment
    d = t(MiB); r["d"] = st()          # no room left: a second small segment
    r["consistent"] = consistent(st())
    del a, b, c, d
    r["freed"] = st()
    return r


@scenario
def large_segments():
    r = {}
    a = t(3 * MiB); r["a"] = st()      # 1..10 MiB -> one 20 MiB segment
    b = t(5 * MiB); r["b"] = st()      # split from the same segment
    c = t(MiB + 1); r["c"] = st()      # > 1 MiB is a large request too
    r["consistent"] = consistent(st())
    del a, b, c
    r["freed"] = st()
    r["released"] = m.empty_cache()
    r["after"] = st()
    return r


@scenario
def huge_rounding():
    r = {}
    a = t(10 * MiB); r["a"] = st()      # >= 10 MiB: rounded to 2 MiB -> exactly 10 MiB
    b = t(11 * MiB + 1); r["b"] = st()  # -> 12 MiB segment; the 1 MiB - 512 B rest is not split off
    r["consistent"] = consistent(st())
    return r


@scenario
def free_merges_and_empty_cache_releases():
    r = {}
    a, b, c = t(1000), t(1000), t(1000)
    del b
    r["hole"] = st()
    del a
    del c
    r["merged"] = st()
    r["released"] = m.empty_cache()
    r["after"] = st()
    return r


@scenario
def partially_used_segment_is_kept():
    r = {}
    a, b = t(1000), t(3 * MiB)
    c, d = t(1000), t(3 * MiB)
    del a, b                       # both segments still hold a live block
    r["released_busy"] = m.empty_cache()
    r["busy"] = st()
    del c, d
    r["released_free"] = m.empty_cache()
    r["after"] = st()
    return r


@scenario
def cached_block_is_reused():
    r = {}
    a = t(3 * MiB)
    del a
    r["cached"] = st()
    b = t(3 * MiB)
    r["reused"] = st()
    return r


@scenario
def best_fit():
    r = {}
    x = t(12 * MiB)                # 12 MiB segment
    y = t(2 * MiB)                 # 20 MiB segment
    del x, y
    r["two_free"] = st()
    z = t(11 * MiB)                # fits both; best fit takes the 12 MiB block (no split)
    r["z"] = st()
    r["released"] = m.empty_cache()  # the untouched 20 MiB segment goes
    r["after"] = st()
    return r


@scenario
def over_cap_goes_to_host():
    r = {}
    m.set_cap(4 * MiB)
    m.reset_window()
    a = t(3 * MiB)                 # needs a 20 MiB segment > cap: host
    r["a"] = st()
    b = t(MiB); c = t(MiB)         # one small segment, exactly full
    d = t(MiB); d2 = t(MiB)        # a second small segment: 4 MiB == cap, allowed
    r["d"] = st()
    e = t(1000)                    # a third segment would exceed the cap: host
    r["e"] = st()
    a.fill_(7); e.fill_(1)         # host-served tensors are real memory
    r["sums"] = [int(a.sum()), int(e.sum())]
    r["consistent"] = consistent(st())
    del a
    r["freed_a"] = st()
    del b, c, d, d2, e
    r["freed_all"] = st()
    return r


@scenario
def cap_releases_cache_before_host():
    r = {}
    a = t(1000)
    del a                          # one wholly free 2 MiB segment in the cache
    flushes = st()["num_cache_flushes"]
    m.set_cap(20 * MiB)
    r["before"] = st()
    b = t(3 * MiB)                 # 2 + 20 > 20: the cache is flushed, then it fits
    r["b"] = st()
    r["flushed"] = st()["num_cache_flushes"] - flushes
    return r


@scenario
def lowering_cap_frees_nothing_until_empty_cache():
    r = {}
    a = t(3 * MiB)
    del a
    m.set_cap(4 * MiB)
    r["lowered"] = st()
    b = t(3 * MiB)                 # a cached segment is reused even above the new cap (as on CUDA)
    r["reuse"] = st()
    del b
    r["released"] = m.empty_cache()
    r["after"] = st()
    return r


@scenario
def cap_grow_is_immediate():
    r = {}
    m.set_cap(4 * MiB)
    a = t(3 * MiB)
    r["capped"] = st()
    m.set_cap(64 * MiB)
    b = t(3 * MiB)
    r["grown"] = st()
    return r


@scenario
def error_on_cap():
    r = {}
    m.set_cap(4 * MiB)
    m.set_error_on_cap(True)
    keep = t(1000)
    before = st()
    try:
        t(3 * MiB)
        r["raised"] = None
    except Exception as exc:
        r["raised"] = type(exc).__name__
        r["is_oom"] = isinstance(exc, torch.OutOfMemoryError)
        r["is_runtime_error"] = isinstance(exc, RuntimeError)
        r["first_line"] = str(exc).splitlines()[0]
    after = st()
    r["before"], r["after"] = before, after
    small = t(1000)                # what fits under the cap still works
    r["small_ok"] = st()["allocated"] == before["allocated"] + 1024
    return r


@scenario
def window_statistics():
    r = {}
    m.reset_window()
    a = t(3 * MiB)
    del a
    r["win"] = st()
    m.reset_window()
    r["reset"] = st()
    m.set_cap(4 * MiB)
    m.empty_cache()
    h = t(3 * MiB)                 # a 20 MiB segment never fits under 4 MiB: host
    r["host"] = st()
    m.reset_window()
    r["host_reset"] = st()
    del h
    r["host_freed"] = st()
    return r


@scenario
def zero_size():
    before = st()
    z = torch.empty(0)
    z2 = torch.empty(0, 4)
    after = st()
    return {"before": before, "after": after}


@scenario
def tensors_work():
    x = torch.arange(100000, dtype=torch.float64)
    y = (x * 2).sum().item()
    a = torch.randn(64, 64)
    b = a @ a.t()
    return {"sum": y, "symmetric": bool(torch.allclose(b, b.t())), "consistent": consistent(st())}


@scenario
def threads():
    m.set_cap(48 * MiB)            # exercise the host path concurrently too
    base = st()
    errors = []

    def work(seed):
        rng = random.Random(seed)
        held = []
        try:
            for _ in range(300):
                if held and rng.random() < 0.5:
                    held.pop(rng.randrange(len(held)))
                else:
                    n = rng.choice([rng.randint(1, 4096), rng.randint(4096, MiB), rng.randint(MiB, 6 * MiB)])
                    held.append(t(n))
                if len(held) > 8:
                    held.pop(0)
        except Exception:
            errors.append(traceback.format_exc())

    ths = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    end = st()
    return {"errors": errors, "base": base, "end": end, "consistent": consistent(end),
            "peak_reserved": end["peak_reserved"]}


for fn in SCENARIOS:
    gc.collect()
    m.set_error_on_cap(False)
    m.set_cap(NO_CAP)
    m.empty_cache()
    m.reset_window()
    start = st()
    try:
        res = fn()
        res["_start"] = start
    except Exception:
        res = {"_error": traceback.format_exc()}
    gc.collect()
    m.set_cap(NO_CAP)
    m.empty_cache()
    res["_end"] = st()
    out[fn.__name__] = res
emit(out)
'''


@pytest.fixture(scope="module")
def alloc(run_py_json):
    return run_py_json(CHILD)


@pytest.fixture
def sc(alloc):
    """``sc(name)``: the checked result of one scenario of the child script."""

    def get(name):
        res = alloc[name]
        assert "_error" not in res, res.get("_error")
        # every scenario starts from an empty device and leaves nothing behind
        assert res["_start"]["allocated"] == 0 and res["_start"]["reserved"] == 0, res["_start"]
        assert res["_end"]["allocated"] == 0 and res["_end"]["reserved"] == 0 and res["_end"]["host"] == 0, res["_end"]
        assert res["_end"]["live_blocks"] == 0 and res["_end"]["segments"] == 0
        return res

    return get


@pytest.mark.slow
def test_install_once(alloc):
    assert alloc["install"] == [True, False, True]


def test_small_requests_round_to_512_and_share_2mib_segments(sc):
    r = sc("small_rounding_and_segments")
    assert (r["a"]["allocated"], r["a"]["reserved"], r["a"]["segments"]) == (512, 2 * MiB, 1)
    assert (r["b"]["allocated"], r["b"]["reserved"], r["b"]["segments"]) == (512 + 1024, 2 * MiB, 1)
    assert (r["c"]["allocated"], r["c"]["reserved"], r["c"]["segments"]) == (1536 + MiB, 2 * MiB, 1)
    assert (r["d"]["allocated"], r["d"]["reserved"], r["d"]["segments"]) == (1536 + 2 * MiB, 4 * MiB, 2)
    assert r["d"]["live_blocks"] == 4
    assert r["consistent"]
    # freeing keeps the segments cached
    assert (r["freed"]["allocated"], r["freed"]["reserved"], r["freed"]["cached"]) == (0, 4 * MiB, 4 * MiB)
    assert r["freed"]["host"] == 0


def test_mid_size_requests_get_20mib_segments_and_split(sc):
    r = sc("large_segments")
    assert (r["a"]["allocated"], r["a"]["reserved"], r["a"]["segments"]) == (3 * MiB, 20 * MiB, 1)
    assert (r["b"]["allocated"], r["b"]["reserved"], r["b"]["segments"]) == (8 * MiB, 20 * MiB, 1)
    assert (r["c"]["allocated"], r["c"]["reserved"], r["c"]["segments"]) == (9 * MiB + 512, 20 * MiB, 1)
    assert r["consistent"]
    assert r["freed"]["cached"] == 20 * MiB  # the three blocks merged back into one
    assert r["released"] == 20 * MiB
    assert r["after"]["reserved"] == 0 and r["after"]["segments"] == 0


def test_large_requests_round_to_2mib(sc):
    r = sc("huge_rounding")
    assert (r["a"]["allocated"], r["a"]["reserved"], r["a"]["segments"]) == (10 * MiB, 10 * MiB, 1)
    # like the CUDA allocator, a remainder <= 1 MiB of a large block stays with the block
    assert (r["b"]["allocated"], r["b"]["reserved"], r["b"]["segments"]) == (22 * MiB, 22 * MiB, 2)
    assert r["consistent"]


def test_free_blocks_merge_and_empty_cache_releases_whole_segments(sc):
    r = sc("free_merges_and_empty_cache_releases")
    assert r["hole"]["allocated"] == 2048 and r["hole"]["reserved"] == 2 * MiB
    assert r["merged"]["allocated"] == 0 and r["merged"]["cached"] == 2 * MiB and r["merged"]["segments"] == 1
    assert r["released"] == 2 * MiB
    assert r["after"]["reserved"] == 0 and r["after"]["cached"] == 0 and r["after"]["segments"] == 0


def test_empty_cache_keeps_segments_with_live_blocks(sc):
    r = sc("partially_used_segment_is_kept")
    assert r["released_busy"] == 0
    assert r["busy"]["reserved"] == 22 * MiB and r["busy"]["segments"] == 2
    assert r["released_free"] == 22 * MiB
    assert r["after"]["reserved"] == 0


def test_cached_block_is_reused_without_new_segment(sc):
    r = sc("cached_block_is_reused")
    assert r["cached"]["reserved"] == 20 * MiB and r["cached"]["allocated"] == 0
    assert r["reused"]["reserved"] == 20 * MiB and r["reused"]["segments"] == 1
    assert r["reused"]["allocated"] == 3 * MiB


def test_best_fit_picks_the_smallest_cached_block(sc):
    r = sc("best_fit")
    assert r["two_free"]["reserved"] == 32 * MiB and r["two_free"]["segments"] == 2
    assert r["z"]["reserved"] == 32 * MiB  # served from the cache
    assert r["z"]["allocated"] == 12 * MiB  # the whole 12 MiB block, not a split of the 20 MiB one
    assert r["released"] == 20 * MiB
    assert r["after"]["reserved"] == 12 * MiB and r["after"]["segments"] == 1


def test_over_cap_allocations_are_served_from_host(sc):
    r = sc("over_cap_goes_to_host")
    a = r["a"]
    assert a["host"] == 3 * MiB and a["peak_host"] >= 3 * MiB
    assert a["reserved"] == 0 and a["allocated"] == 0
    assert a["num_host_allocs"] >= 1
    assert r["d"]["reserved"] == 4 * MiB and r["d"]["host"] == 3 * MiB
    e = r["e"]
    assert e["reserved"] == 4 * MiB  # never above the cap
    assert e["allocated"] == 4 * MiB and e["segments"] == 2
    assert e["host"] == 3 * MiB + 1000  # host bytes are the bytes asked for (no rounding)
    assert e["win_peak_reserved"] <= 4 * MiB
    assert e["win_host_alloc_bytes"] == 3 * MiB + 1000
    assert e["num_host_allocs"] - a["num_host_allocs"] == 1
    assert r["sums"] == [7 * 3 * MiB, 1000]
    assert r["consistent"]
    assert r["freed_a"]["host"] == 1000
    assert r["freed_all"]["host"] == 0 and r["freed_all"]["allocated"] == 0
    assert r["freed_all"]["peak_host"] >= 3 * MiB + 1000


def test_cap_flushes_cache_before_falling_back_to_host(sc):
    r = sc("cap_releases_cache_before_host")
    assert r["before"]["reserved"] == 2 * MiB
    assert r["b"]["reserved"] == 20 * MiB and r["b"]["host"] == 0 and r["b"]["segments"] == 1
    assert r["flushed"] >= 1


def test_lowering_the_cap_frees_nothing_until_empty_cache(sc):
    r = sc("lowering_cap_frees_nothing_until_empty_cache")
    assert r["lowered"]["reserved"] == 20 * MiB and r["lowered"]["cap"] == 4 * MiB
    assert r["reuse"]["reserved"] == 20 * MiB and r["reuse"]["allocated"] == 3 * MiB and r["reuse"]["host"] == 0
    assert r["released"] == 20 * MiB
    assert r["after"]["reserved"] == 0


def test_raising_the_cap_takes_effect_at_once(sc):
    r = sc("cap_grow_is_immediate")
    assert r["capped"]["host"] == 3 * MiB and r["capped"]["reserved"] == 0
    assert r["grown"]["reserved"] == 20 * MiB and r["grown"]["allocated"] == 3 * MiB
    assert r["grown"]["host"] == 3 * MiB  # the old host tensor stays where it is


def test_error_on_cap_raises_out_of_memory_with_one_clear_line(sc):
    r = sc("error_on_cap")
    assert r["raised"] == "OutOfMemoryError"
    assert r["is_oom"] and r["is_runtime_error"]
    line = r["first_line"]
    assert line.startswith("colocate: device memory cap of 4.00 MiB exceeded: tried to allocate 3.00 MiB"), line
    assert "--on-cap error" in line
    after, before = r["after"], r["before"]
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["allocated"] == before["allocated"] and after["host"] == before["host"] == 0
    assert after["num_host_allocs"] == before["num_host_allocs"]
    assert after["live_blocks"] == before["live_blocks"]
    assert r["small_ok"]


def test_window_statistics(sc):
    r = sc("window_statistics")
    assert r["win"]["win_peak_allocated"] == 3 * MiB and r["win"]["win_peak_reserved"] == 20 * MiB
    assert r["reset"]["win_peak_allocated"] == 0  # reset to the current values
    assert r["reset"]["win_peak_reserved"] == 20 * MiB
    assert r["reset"]["win_host_alloc_bytes"] == 0 and r["reset"]["win_host_at_start"] == 0
    h = r["host"]
    assert h["reserved"] == 0
    assert h["host"] == 3 * MiB and h["win_host_alloc_bytes"] == 3 * MiB and h["win_peak_host"] == 3 * MiB
    hr = r["host_reset"]
    assert hr["win_host_alloc_bytes"] == 0 and hr["win_host_at_start"] == 3 * MiB
    assert r["host_freed"]["host"] == 0


def test_zero_size_tensors_cost_nothing(sc):
    r = sc("zero_size")
    for k in ("allocated", "reserved", "host", "live_blocks"):
        assert r["after"][k] == r["before"][k], k


def test_tensors_compute_correctly(sc):
    r = sc("tensors_work")
    assert r["sum"] == 2 * sum(range(100000))
    assert r["symmetric"] and r["consistent"]


def test_concurrent_allocations_keep_the_books_straight(sc):
    r = sc("threads")
    assert r["errors"] == []
    end, base = r["end"], r["base"]
    assert end["allocated"] == base["allocated"] and end["host"] == base["host"] == 0
    assert end["live_blocks"] == base["live_blocks"]
    assert r["consistent"]
    assert r["peak_reserved"] >= 20 * MiB
