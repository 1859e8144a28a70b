"""torch_hooks.runtime.Runtime against a fake device and a controllable clock (no torch).

The fake clock is the real monotonic clock plus a manual offset: ``advance(dt)``
pretends ``dt`` seconds of wall time passed (host work), while the throttle's
waits still take real time, so idle amounts can be measured.
"""
import math
import threading
import time

import pytest

from colocate.base.env import JobEnv
from colocate.base.stats import FIELDS, NUMERIC
from torch_hooks.device.base import MemoryStats
from torch_hooks.records import BatchRecord
from torch_hooks.runtime import Runtime

MiB = 1 << 20


class FakeClock:
    def __init__(self):
        self.offset = 0.0

    def __call__(self):
        return time.monotonic() + self.offset

    def advance(self, dt):
        self.offset += dt


class FakeDevice:
    """Implements the JobDevice protocol with a scripted memory state and busy clock."""

    index = 0

    def __init__(self, kind="sim", mem_total=1024 * MiB, cap=None, allocated=0, reserved=0):
        self.kind = kind
        self.mem_total = mem_total
        self.cap = mem_total if cap is None else cap
        self.allocated = allocated
        self.reserved = reserved
        self.host = 0
        self.win_host_touched = 0
        self.peak = [allocated, reserved, 0]
        self.busy = 0.0
        self.calls = []
        self.on_set_cap = None  # a test's hook, run inside set_cap
        self._lock = threading.Lock()

    def _log(self, *call):
        with self._lock:
            self.calls.append(call)

    def count(self, name):
        return sum(1 for c in self.calls if c[0] == name)

    # --- JobDevice ---
    def install(self):
        self._log("install")

    def set_cap(self, cap_bytes):
        self._log("set_cap", cap_bytes)
        self.cap = min(int(cap_bytes), self.mem_total)
        if self.on_set_cap is not None:
            self.on_set_cap(cap_bytes)

    def release_cache(self):
        self._log("release_cache")
        freed = self.reserved - self.allocated
        self.reserved = self.allocated
        return freed

    def memory(self):
        self.peak = [max(self.peak[0], self.allocated), max(self.peak[1], self.reserved), max(self.peak[2], self.host)]
        return MemoryStats(
            cap=self.cap, allocated=self.allocated, reserved=self.reserved, host=self.host,
            peak_allocated=self.peak[0], peak_reserved=self.peak[1], peak_host=self.peak[2],
            win_peak_allocated=self.allocated, win_peak_reserved=self.reserved,
            win_host_touched=self.win_host_touched,
        )

    def reset_window(self):
        self._log("reset_window")

    def busy_time(self):
        return self.busy

    def phase_start(self):
        self._log("phase_start")

    def phase_end(self):
        self._log("phase_end")

    def mem_get_info(self):
        return max(0, self.cap - self.reserved) + (self.reserved - self.allocated), self.cap

    def charge(self, seconds):
        self._log("charge", seconds)
        self.busy += seconds


def make(share=1.0, kind="sim", gbps=2.0, **dev):
    clock = FakeClock()
    device = FakeDevice(kind=kind, **dev)
    env = JobEnv(job_id="test-job", device=kind, sm_share=share, sim_host_gbps=gbps)
    return Runtime(env, device, clock), device, clock


def boundary_in_thread(rt):
    box = {}

    def target():
        box["rec"] = rt.on_boundary()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


class PausedApplies:
    """The runtime's paused-apply hook: which limit seqs reached the training thread while it was paused.

    The hook runs on the paused training thread, holding the runtime's limits lock, right before it waits
    again; so once ``wait(seq)`` returns, the thread has seen ``seq`` while paused, and the next
    ``set_limits`` can only take the lock when that thread waits again (or has left the pause).
    """

    def __init__(self, rt):
        self.seqs = []
        self._cond = threading.Condition()
        rt.add_paused_apply_hook(self._hook)

    def _hook(self, seq, now):
        with self._cond:
            self.seqs.append(seq)
            self._cond.notify_all()

    def wait(self, seq, timeout=5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: seq in self.seqs, timeout)


def wait_paused(rt, applies, timeout=5.0) -> int:
    """Handshake: returns once the boundary thread is known to be paused (share 0), with the seq it saw.

    A neutral update (share 0 again) reaches a paused thread through the paused-apply hook; one sent before
    the thread got to its pause is absorbed silently, so it is repeated until one is heard (bounded).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rt.set_limits(sm_share=0.0)
        seq = rt.limits()["seq"]
        if applies.wait(seq, timeout=0.05):
            return seq
    raise AssertionError("the boundary thread never paused")


# ---------------------------------------------------------------- limits -----

def test_initial_limits_come_from_env_and_device():
    rt, dev, _ = make(share=0.4, cap=256 * MiB)
    assert rt.limits() == {"mem_cap": 256 * MiB, "sm_share": 0.4, "seq": 0}


def test_seq_makes_updates_idempotent():
    rt, dev, _ = make()
    assert rt.set_limits(sm_share=0.5, seq=3) is True
    assert rt.limits() == {"mem_cap": dev.mem_total, "sm_share": 0.5, "seq": 3}
    # a retried or reordered update is ignored
    assert rt.set_limits(sm_share=0.9, seq=3) is False
    assert rt.set_limits(sm_share=0.9, seq=2) is False
    assert rt.limits()["sm_share"] == 0.5 and rt.limits()["seq"] == 3
    assert rt.set_limits(sm_share=0.9, seq=10) is True
    assert rt.limits() == {"mem_cap": dev.mem_total, "sm_share": 0.9, "seq": 10}
    # an update without seq takes the next one
    assert rt.set_limits(sm_share=0.7) is True
    assert rt.limits()["seq"] == 11


def test_stale_seq_does_not_touch_the_device():
    rt, dev, _ = make()
    assert rt.set_limits(mem_cap=100 * MiB, seq=1)
    assert not rt.set_limits(mem_cap=10 * MiB, seq=1)
    assert dev.cap == 100 * MiB
    assert [c for c in dev.calls if c[0] == "set_cap"] == [("set_cap", 100 * MiB)]
    rec = rt.on_boundary()
    assert rec.mem_cap == 100 * MiB
    assert dev.count("release_cache") == 1  # the applied shrink only


@pytest.mark.parametrize(
    "kwargs", [{"sm_share": 1.5}, {"sm_share": -0.1}, {"sm_share": float("nan")}, {"sm_share": "x"},
               {"mem_cap": -1}, {"mem_cap": True}],
)
def test_bad_limits_raise_and_change_nothing(kwargs):
    rt, dev, _ = make(share=0.5)
    before = rt.limits()
    with pytest.raises(ValueError):
        rt.set_limits(**kwargs)
    assert rt.limits() == before
    assert dev.count("set_cap") == 0


def test_cap_is_clamped_to_device_total():
    rt, dev, _ = make(mem_total=512 * MiB)
    rt.set_limits(mem_cap=4096 * MiB)
    assert rt.limits()["mem_cap"] == 512 * MiB


def test_cap_grow_takes_effect_at_once_without_release():
    rt, dev, _ = make(cap=128 * MiB, allocated=40 * MiB, reserved=100 * MiB)
    rt.set_limits(mem_cap=300 * MiB)
    assert dev.cap == 300 * MiB  # the device sees it immediately
    assert rt.limits()["mem_cap"] == 300 * MiB
    rec = rt.on_boundary()
    assert dev.count("release_cache") == 0
    assert rec.mem_cap == 300 * MiB and rec.mem_floor == 0 and rec.mem_reserved == 100 * MiB


def test_cap_shrink_releases_cache_at_next_boundary():
    rt, dev, _ = make(cap=128 * MiB, allocated=50 * MiB, reserved=100 * MiB)
    rt.set_limits(mem_cap=64 * MiB)
    # new segments obey the new cap at once; cached memory is released only at the boundary
    assert dev.cap == 64 * MiB
    assert dev.count("release_cache") == 0
    assert dev.reserved == 100 * MiB
    rec = rt.on_boundary()
    assert dev.count("release_cache") == 1
    assert rec.mem_cap == 64 * MiB
    assert rec.mem_reserved == 50 * MiB <= rec.mem_cap
    assert rec.mem_floor == 0
    assert rt.book.max_reserved_over_cap <= 0
    s = rt.summary()
    assert s["boundary_reserved_over_cap_max_bytes"] == 0
    assert s["mem_floor_peak_bytes"] == 0


def test_cap_shrink_below_live_tensors_reports_floor():
    rt, dev, _ = make(cap=128 * MiB, allocated=80 * MiB, reserved=100 * MiB)
    rt.set_limits(mem_cap=64 * MiB)
    rec = rt.on_boundary()
    assert dev.count("release_cache") == 1
    assert rec.mem_reserved == 80 * MiB
    assert rec.mem_floor == 80 * MiB  # what the live tensors hold
    s = rt.summary()
    assert s["mem_floor_peak_bytes"] == 80 * MiB
    assert s["boundary_reserved_over_cap_max_bytes"] == 16 * MiB
    # while live tensors stay, later boundaries keep trying and keep reporting the floor
    rec = rt.on_boundary()
    assert rec.mem_floor == 80 * MiB
    # once they are freed the cap is honoured and the floor clears
    dev.allocated = 20 * MiB
    rec = rt.on_boundary()
    assert rec.mem_floor == 0 and rec.mem_reserved == 20 * MiB <= 64 * MiB


def test_no_release_without_shrink_when_under_cap():
    rt, dev, _ = make(cap=128 * MiB, allocated=10 * MiB, reserved=100 * MiB)
    for _ in range(3):
        rt.on_boundary()
    assert dev.count("release_cache") == 0  # the cache is kept while it fits


def test_mem_cap_only_update_keeps_share():
    rt, dev, _ = make(share=0.3)
    rt.set_limits(mem_cap=10 * MiB)
    assert rt.limits()["sm_share"] == 0.3
    rt.set_limits(sm_share=0.6)
    assert rt.limits()["mem_cap"] == 10 * MiB


# ---------------------------------------------------------------- throttle ----

def test_share_one_never_idles():
    rt, dev, _ = make(share=1.0)
    for _ in range(3):
        dev.busy += 0.5
        t0 = time.monotonic()
        rec = rt.on_boundary()
        assert time.monotonic() - t0 < 0.3
        assert rec.idle_s < 0.1
        assert rec.busy_s == pytest.approx(0.5)


def test_share_half_inserts_busy_times_one_idle():
    rt, dev, _ = make(share=0.5)
    dev.busy += 0.1  # 0.1 s of device work in (almost) no wall time
    rec = rt.on_boundary()
    assert rec.busy_s == pytest.approx(0.1)
    assert 0.15 <= rt.book.idle_s <= 1.5  # idled after the boundary (the record went out before)
    nxt = rt.on_boundary()
    assert nxt.idle_s == pytest.approx(rt.book.idle_s, abs=1e-3)  # the next record carries the idle before it
    assert rec.busy_s / (rec.duration_s + nxt.duration_s) <= 0.5 + 0.05


def test_host_time_counts_as_idle():
    rt, dev, clock = make(share=0.5)
    dev.busy += 0.1
    clock.advance(0.5)  # the batch spent 0.4 s on the host: already below the share
    rec = rt.on_boundary()
    assert rt.book.idle_s < 0.1
    assert rec.duration_s >= 0.5


def test_busy_is_measured_per_batch():
    rt, dev, clock = make(share=0.5)
    dev.busy += 1.0
    clock.advance(10.0)
    first = rt.on_boundary()
    dev.busy += 0.05
    second = rt.on_boundary()
    assert first.busy_s == pytest.approx(1.0) and second.idle_s < 0.5  # idle after the first batch
    assert second.busy_s == pytest.approx(0.05)
    assert 0.06 <= rt.book.idle_s - second.idle_s <= 1.5  # idle after the second


def test_share_zero_pauses_until_raised():
    rt, dev, clock = make(share=1.0)
    applies = PausedApplies(rt)
    rt.set_limits(sm_share=0.0)
    dev.busy += 0.01
    t, box = boundary_in_thread(rt)
    wait_paused(rt, applies)
    assert t.is_alive(), "share 0 must pause at the boundary"
    # a memory-only update reaches the paused thread and does not resume it: the next one reaches it paused too
    for cap in (256 * MiB, 128 * MiB):
        rt.set_limits(mem_cap=cap)
        assert applies.wait(rt.limits()["seq"]), "a memory-only update must leave the job paused"
        assert t.is_alive()
    # 0.5 s pass while the thread waits (set_cap runs under the lock the paused thread released)
    dev.on_set_cap = lambda cap: clock.advance(0.5)
    rt.set_limits(mem_cap=256 * MiB, sm_share=0.5)
    t.join(5)
    assert not t.is_alive(), "raising the share must resume the job"
    rec = box["rec"]
    assert rec.sm_share == 0.0  # the share in force when the batch ended; the pause followed
    assert rt.book.paused_s >= 0.5
    assert rt.book.idle_s >= rt.book.paused_s
    assert rt.summary()["paused_s"] == rt.book.paused_s


def test_paused_job_releases_its_cache_at_once_when_its_cap_drops():
    rt, dev, _ = make(share=1.0, cap=512 * MiB, allocated=50 * MiB, reserved=300 * MiB)
    applies = PausedApplies(rt)
    rt.set_limits(sm_share=0.0)
    t, _ = boundary_in_thread(rt)
    seq = wait_paused(rt, applies)
    assert dev.count("release_cache") == 0  # the boundary itself: under its cap, the cache is kept
    rt.set_limits(mem_cap=100 * MiB, seq=seq + 1)  # the node shrinks the paused job
    assert applies.wait(seq + 1), "the hook hears that the new seq is in force without a batch"
    assert t.is_alive(), "still paused"
    assert dev.count("release_cache") == 1 and dev.reserved == 50 * MiB
    rt.set_limits(sm_share=0.7, seq=seq + 2)  # a share-only change: no release, the hook still hears of it
    t.join(5)
    assert not t.is_alive()
    assert applies.seqs[-1] == seq + 2
    assert dev.count("release_cache") == 1


def test_share_zero_from_env_pauses_first_boundary():
    rt, dev, _ = make(share=0.0)
    applies = PausedApplies(rt)
    t, box = boundary_in_thread(rt)
    wait_paused(rt, applies)
    assert t.is_alive()
    rt.set_limits(sm_share=1.0)
    t.join(5)
    assert not t.is_alive()
    assert box["rec"].index == 0


def test_share_zero_holds_the_first_device_work_until_raised():
    """A job paused before it reaches device work (the node profiles the guaranteed job's baseline while
    this one starts) waits there: no device work starts, and the hook hears that the pause is in force."""
    rt, dev, _ = make(share=1.0)
    applies = PausedApplies(rt)
    rt.set_limits(sm_share=0.0)
    assert not rt.device_work_started()  # a pause set now is in force: the link acknowledges it at once
    t = threading.Thread(target=rt.on_device_start, daemon=True)
    t.start()
    wait_paused(rt, applies)
    assert t.is_alive() and dev.count("phase_start") == 0, "no device work while paused"
    assert rt.device_work_started() and rt.ready_at is not None
    rt.set_limits(sm_share=1.0)
    t.join(5)
    assert not t.is_alive() and dev.count("phase_start") == 1
    rt.on_device_start()  # the same batch: nothing more
    assert dev.count("phase_start") == 1


def test_first_device_work_at_a_share_goes_straight_on():
    rt, dev, _ = make(share=0.5)
    rt.on_device_start()
    assert dev.count("phase_start") == 1 and rt.device_work_started()


def test_close_releases_a_paused_job_and_stops_idling():
    rt, dev, _ = make(share=0.0)
    applies = PausedApplies(rt)
    t, box = boundary_in_thread(rt)
    wait_paused(rt, applies)
    assert t.is_alive()
    rt.close()
    t.join(5)
    assert not t.is_alive()
    rt.set_limits(sm_share=0.1)
    dev.busy += 1.0
    t0 = time.monotonic()
    rt.on_boundary()
    assert time.monotonic() - t0 < 1.0  # closed: no idle inserted


def test_share_change_during_idle_is_re_evaluated():
    rt, dev, _ = make(share=0.0)
    applies = PausedApplies(rt)
    dev.busy += 1.0
    t, box = boundary_in_thread(rt)
    seq = wait_paused(rt, applies)
    # share 0.05 resumes into an idle of ~19 s; the hook hears it while the thread holds the lock, so the
    # next update can only land once that idle's wait has begun
    rt.set_limits(sm_share=0.05, seq=seq + 1)
    assert applies.wait(seq + 1)
    t0 = time.monotonic()
    rt.set_limits(sm_share=1.0, seq=seq + 2)
    t.join(5)
    assert not t.is_alive()
    assert time.monotonic() - t0 < 2.0
    assert rt.book.idle_s < 3.0


def test_concurrent_limit_updates_keep_the_highest_seq():
    rt, dev, _ = make()
    errors = []

    def worker(k):
        try:
            for i in range(50):
                seq = k + 8 * i + 1  # distinct seqs 1..400 over all threads
                rt.set_limits(sm_share=seq / 1000.0, seq=seq)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert rt.limits()["seq"] == 400
    assert rt.limits()["sm_share"] == pytest.approx(0.4)


# ---------------------------------------------------------------- host penalty ---

def test_host_bytes_are_charged_as_device_time_on_sim():
    rt, dev, _ = make(share=1.0, gbps=2.0)
    dev.win_host_touched = 1_000_000_000  # 1 GB at 2 GB/s
    rec = rt.on_boundary()
    assert ("charge", pytest.approx(0.5)) in dev.calls
    assert rec.host_penalty_s == pytest.approx(0.5)
    assert rec.host_bytes_touched == 1_000_000_000
    assert rec.busy_s == pytest.approx(0.5)  # the charge is device time
    assert rt.summary()["host_penalty_s"] == pytest.approx(0.5)


def test_host_penalty_is_throttled_like_device_work():
    rt, dev, _ = make(share=0.5, gbps=1.0)
    dev.win_host_touched = 100_000_000  # 0.1 s at 1 GB/s
    rec = rt.on_boundary()
    assert rec.host_penalty_s == pytest.approx(0.1)
    assert 0.15 <= rt.book.idle_s <= 1.5


def test_no_host_penalty_on_cuda():
    rt, dev, _ = make(kind="cuda")
    dev.win_host_touched = 1_000_000_000
    rec = rt.on_boundary()
    assert dev.count("charge") == 0
    assert rec.host_penalty_s == 0.0


def test_no_charge_without_host_traffic():
    rt, dev, _ = make()
    rt.on_boundary()
    assert all(c[1] == 0.0 for c in dev.calls if c[0] == "charge")


# ---------------------------------------------------------------- phases, records ---

def test_device_start_is_idempotent_within_a_batch():
    rt, dev, clock = make()
    started = []
    rt.add_start_hook(lambda: started.append(1))
    clock.advance(0.25)  # start-up before the first forward: host work, not part of batch 0
    rt.on_device_start()
    rt.on_device_start()
    assert dev.count("phase_start") == 1 and started == [1]
    rec = rt.on_boundary()
    assert rec.device_start_s == pytest.approx(0.0, abs=0.01)
    assert dev.count("phase_end") == 1
    assert dev.count("reset_window") == 1
    clock.advance(0.25)  # host phase of batch 1
    rt.on_device_start()
    assert dev.count("phase_start") == 2 and started == [1, 1]
    rec = rt.on_boundary()
    assert rec.device_start_s == pytest.approx(0.25, abs=0.05)
    rec = rt.on_boundary()  # a batch with no forward
    assert rec.device_start_s is None


def test_startup_before_the_first_forward_is_not_device_time():
    rt, dev, clock = make()
    clock.advance(2.0)
    dev.busy += 1.5  # building the model and optimizer
    t0 = time.monotonic()
    rt.on_device_start()
    clock.advance(0.1)
    dev.busy += 0.1
    rec = rt.on_boundary()
    assert rec.busy_s == pytest.approx(0.1, abs=1e-6)
    s = rt.summary()
    real = time.monotonic() - t0  # the clock also moves with real time: as long as this test was descheduled
    assert s["device_busy_s"] == pytest.approx(0.1, abs=1e-6)
    assert 0.1 <= s["wall_s"] <= 0.1 + real


def test_records_and_listeners():
    rt, dev, _ = make(cap=64 * MiB, allocated=3 * MiB, reserved=8 * MiB)
    seen = []

    def bad(rec):
        raise RuntimeError("listener bug")

    rt.add_listener(bad)  # a failing listener never breaks training
    rt.add_listener(seen.append)
    rt.set_limits(sm_share=1.0, seq=7)
    recs = [rt.on_boundary() for _ in range(3)]
    assert [r.index for r in recs] == [0, 1, 2]
    assert seen == recs
    assert all(isinstance(r, BatchRecord) for r in recs)
    r = recs[-1]
    assert r.limits_seq == 7 and r.sm_share == 1.0
    assert r.mem_cap == 64 * MiB and r.mem_reserved == 8 * MiB and r.mem_allocated_peak == 3 * MiB
    assert r.mem_floor == 0 and r.host_bytes == 0
    assert r.t_end >= recs[0].t_end
    assert rt.book.iterations == 3
    assert list(rt.book.records) == recs


def test_summary_has_required_keys_and_consistent_values():
    rt, dev, clock = make(share=1.0, cap=32 * MiB, allocated=2 * MiB, reserved=4 * MiB)
    for _ in range(4):
        dev.busy += 0.25
        clock.advance(0.5)
        rt.on_boundary()
    s = rt.summary()
    assert set(s) == set(FIELDS)  # the one definition of the summary's fields
    for key in NUMERIC:
        assert isinstance(s[key], (int, float)) and math.isfinite(s[key]), key
    assert s["iterations"] == 4
    assert s["device_busy_s"] == pytest.approx(1.0)
    assert s["wall_s"] >= 2.0
    assert s["busy_fraction"] == pytest.approx(s["device_busy_s"] / s["wall_s"])
    assert 0.0 < s["busy_fraction"] <= 0.5 + 1e-6
    assert s["mem_cap_bytes"] == 32 * MiB
    assert s["mem_reserved_peak_bytes"] == 4 * MiB
    assert s["mem_allocated_peak_bytes"] == 2 * MiB
    assert s["host_bytes_peak"] == 0
    assert s["job_id"] == "test-job" and s["sm_share"] == 1.0


def test_summary_is_safe_from_another_thread_during_boundaries():
    rt, dev, _ = make(share=1.0)
    stop = threading.Event()
    errors = []

    def reader():
        while not stop.is_set():
            try:
                rt.summary()
                rt.limits()
            except Exception as exc:  # pragma: no cover
                errors.append(exc)
                return

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(200):
        dev.busy += 0.0001
        rt.on_boundary()
    stop.set()
    t.join()
    assert not errors
    assert rt.summary()["iterations"] == 200


class QuietDevice(FakeDevice):
    """A FakeDevice that answers ``quiet(cap)`` as the sim device does (host bytes, reserved vs cap)."""

    def quiet(self, cap):
        self._log("quiet", cap)
        return not self.win_host_touched and self.reserved <= cap


def make_quiet(share=1.0, **dev):
    device = QuietDevice(kind="sim", **dev)
    env = JobEnv(job_id="test-job", device="sim", sm_share=share)
    return Runtime(env, device, FakeClock()), device


def _listen(rt):
    rt.add_listener(lambda rec: None)


def _keep(rt):
    rt.keep_records = True


def _half_share(rt):
    rt.set_limits(sm_share=0.5, seq=1)


def _shrink(rt):
    rt.set_limits(mem_cap=32 * MiB, seq=1)


def _over_cap(rt):
    rt.device.reserved = 100 * MiB
    rt.set_limits(mem_cap=64 * MiB, seq=1)
    rt._shrink_pending = False  # as if the shrink had been seen: the window itself is over the cap


def _host_touched(rt):
    rt.device.win_host_touched = 1 * MiB


def _end_hook(rt):
    rt.add_end_hook(lambda now, dev_start: None)


@pytest.mark.parametrize("setup, lean", [
    (None, True),            # standalone, share 1, within the cap: nothing to do
    (_listen, False),        # the node link hears every record
    (_keep, False),          # asked for records
    (_half_share, False),    # the throttle needs the batch's busy time
    (_shrink, False),        # a pending shrink releases cache
    (_over_cap, False),      # reserved over the cap: enforce
    (_host_touched, False),  # host bytes: charge the penalty
    (_end_hook, False),      # an end hook wants every boundary
], ids=["standalone", "listener", "keep_records", "share_half", "shrink", "over_cap", "host_touched", "end_hook"])
def test_lean_boundary_only_when_nothing_needs_the_record(setup, lean):
    rt, dev = make_quiet(cap=64 * MiB, allocated=2 * MiB, reserved=8 * MiB)
    if setup is not None:
        setup(rt)
    rec = rt.on_boundary()
    assert (rec is None) == lean
    assert rt.book.iterations == 1 and rt.book.boundaries["step"] == 1
    assert dev.count("reset_window") == 1  # either way the device's window starts again
    assert len(rt.book.records) == (0 if lean else 1)


def test_lean_boundaries_keep_the_summary_right():
    rt, dev = make_quiet(cap=32 * MiB, allocated=2 * MiB, reserved=4 * MiB)
    clock = rt._clock
    for _ in range(4):
        dev.busy += 0.25
        clock.advance(0.5)
        assert rt.on_boundary(source="backward") is None
    s = rt.summary()
    assert s["iterations"] == 4 and s["boundaries"] == {"backward": 4}
    assert s["device_busy_s"] == pytest.approx(1.0)
    assert s["busy_fraction"] == pytest.approx(s["device_busy_s"] / s["wall_s"])
    assert s["mem_cap_bytes"] == 32 * MiB and s["mem_reserved_peak_bytes"] == 4 * MiB
    assert s["throttle_idle_s"] == 0.0 and s["host_penalty_s"] == 0.0 and s["mem_floor_peak_bytes"] == 0
    # a listener attached later (a node link) gets full records from then on, indices continuing
    seen = []
    rt.add_listener(seen.append)
    rec = rt.on_boundary()
    assert seen == [rec] and rec.index == 4
