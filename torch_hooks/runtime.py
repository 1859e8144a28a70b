"""The in-job runtime: live limits, mini-batch boundaries, throttle and statistics.

One ``Runtime`` per job process. The training thread calls ``on_device_start``
(first module forward of a mini-batch) and ``on_boundary(source)`` (optimizer
step, backward with no optimizer, GradScaler skip or ``torch_hooks.step()``:
see ``torch_hooks.hooks``); any thread may call ``set_limits``, ``limits`` and
``summary`` at any time (all thread-safe). Listeners get every ``BatchRecord``
on the training thread, before the boundary's idle time; a node link plugs in
as a listener plus ``set_limits`` calls.

``after_boundary`` (internal, set by ``torch_hooks.hooks``): called on the training
thread at the end of every boundary, whatever found it (it re-arms the device-start
hook). Unset (None), nothing is called.

Lean boundaries: a boundary builds a ``BatchRecord`` (kept in ``book.records``, handed to
listeners, returned) only when someone needs it or something must be done: a listener is
attached (the node link), ``keep_records`` is set, the share is below 1, a cap shrink is pending,
or the device says the window was not quiet (``JobDevice.quiet(cap)``: host bytes touched, or
reserved over the cap). Otherwise (a standalone job at share 1 within its cap) it only counts the
batch, resets the device's statistics window and returns None: a boundary runs once per
mini-batch with cold caches, and the record alone cost half of it (``benchmarks/overhead.py``).
Statistics (``summary``) are the same either way: they come from counters and the device's peaks.

No-boundary warning: from the job's first device work a daemon thread watches
the current mini-batch's device start (``_device_start``, set by
``on_device_start`` anyway). When ``env.boundary_warn_s`` seconds
(``COLOCATE_BOUNDARY_WARN_S``, default 60; 0 disables) pass after a mini-batch's
first device work with no boundary, it prints one line on stderr naming
``torch_hooks.step()``, once per process, and ends. A job idling at a boundary
(throttle, pause) or in a host-only phase has no device start pending and is
never warned about. The thread wakes about once per that period: it costs
nothing per operator or per mini-batch.

Features: at the first device work a ``FeatureReader`` (``torch_hooks.features``) starts watching the
mini-batch; at the first boundary it stops and ``features`` holds what it read (a ``colocate.protocol.Features``);
the features hooks (``add_features_hook``) get it on the training thread, then it is never read again. A
reader that fails is logged and leaves ``features`` None: training goes on. Only a runtime built with
``learn=True`` reads them (``torch_hooks.install`` builds it so).

Limits contract:

* memory cap grow: takes effect at once (new segments may use it);
* memory cap shrink: new segments obey it at once; at the next boundary the
  cache is released; if live tensors still need more than the cap, the record's
  ``mem_floor`` reports the reserved bytes they hold, and allocations beyond the
  cap go to host memory (or fail with ``--on-cap error``);
* SM share: applied at the next boundary; 0 pauses there until it is raised, and a job
  that reaches its first device work at share 0 waits there (start-up is host work; a
  paused job never starts device work);
* ``seq``: an update with a seq not greater than the last applied one is
  ignored, so retried updates are idempotent.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from colocate.base.units import parse_fraction
from colocate.base.vocab import DeviceKind
from torch_hooks.features import FeatureReader
from torch_hooks.records import BatchRecord, StatsBook
from torch_hooks.throttle import host_penalty_s, idle_after

log = logging.getLogger("colocate.runtime")

Listener = Callable[[BatchRecord], None]


class Runtime:
    def __init__(self, env, device, clock: Callable[[], float] = time.monotonic, learn: bool = False):
        self.env = env
        self.device = device
        self._clock = clock
        self._cond = threading.Condition()
        self._boundary_lock = threading.Lock()
        self._share = float(env.sm_share)
        self._cap = device.memory().cap
        self._limits_seq = 0
        self._limits_changed = 0  # counter, bumps on every applied update
        self._shrink_pending = False
        self._closed = False
        self._listeners: list[Listener] = []
        self._start_hooks: list[Callable[[], None]] = []
        self._end_hooks: list[Callable[[float, float | None], None]] = []
        self._paused_apply_hooks: list[Callable[[int, float], None]] = []
        self.book = StatsBook()
        self._t0 = clock()
        self._busy0 = device.busy_time()
        self._resume_t = self._t0
        self._resume_busy = self._busy0
        self._device_start: float | None = None
        self._seen_device = False
        self.ready_at: float | None = None  # clock() when the job reached its first device work
        self._prev_boundary = self._t0  # boundary times, before idling
        self.keep_records = False  # build a record at every boundary, even a lean one (tests, debugging)
        self._quiet = getattr(device, "quiet", lambda cap: False)
        self._last_idle = 0.0
        self._watch_stop = threading.Event()
        self.no_boundary_warned = False
        self._sim = device.kind == DeviceKind.SIM
        # set by torch_hooks.hooks: called on the training thread at the end of every boundary
        self.after_boundary: Callable[[], None] | None = None
        self.reader: FeatureReader | None = FeatureReader(env, device) if learn else None  # None once read
        self.features = None  # colocate.protocol.Features, from the first boundary on
        self._features_hooks: list[Callable[[object], None]] = []

    # ---- limits (any thread) -------------------------------------------------
    def set_limits(self, mem_cap: int | None = None, sm_share: float | None = None, seq: int | None = None) -> bool:
        """Apply new limits; returns False when ``seq`` is stale (already applied)."""
        if mem_cap is not None and (isinstance(mem_cap, bool) or int(mem_cap) < 0):
            raise ValueError(f"memory cap must be a non-negative number of bytes, got {mem_cap!r}")
        if sm_share is not None:
            sm_share = parse_fraction(sm_share, "share")
        with self._cond:
            if seq is not None and seq <= self._limits_seq:
                return False
            self._limits_seq = seq if seq is not None else self._limits_seq + 1
            if mem_cap is not None:
                mem_cap = int(mem_cap)
                if mem_cap < self._cap:
                    self._shrink_pending = True
                self.device.set_cap(mem_cap)
                self._cap = self.device.memory().cap
            if sm_share is not None:
                self._share = sm_share
            self._limits_changed += 1
            self._cond.notify_all()
        log.info("limits seq=%s cap=%s share=%s", self._limits_seq, self._cap, self._share)
        return True

    def limits(self) -> dict:
        with self._cond:
            return {"mem_cap": self._cap, "sm_share": self._share, "seq": self._limits_seq}

    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def add_start_hook(self, fn: Callable[[], None]) -> None:
        """``fn`` runs on the training thread before each mini-batch's device work."""
        self._start_hooks.append(fn)

    def add_end_hook(self, fn: Callable[[float, float | None], None]) -> None:
        """``fn(now, device_start_s)`` runs on the training thread as soon as a
        mini-batch's device work ends (before memory enforcement and idling)."""
        self._end_hooks.append(fn)

    def add_features_hook(self, fn: Callable[[object], None]) -> None:
        """``fn(features)`` runs on the training thread once, at the first boundary, when the features are read."""
        self._features_hooks.append(fn)

    def add_paused_apply_hook(self, fn: Callable[[int, float], None]) -> None:
        """``fn(seq, now)`` runs on the training thread when limits take effect while
        the job is paused (no batch will carry them until it resumes). It must be
        quick and must not call back into the runtime."""
        self._paused_apply_hooks.append(fn)

    def rebase_seq(self) -> None:
        """Accept any seq again: every Welcome starts a registration whose limits the node numbers afresh (a new
        node incarnation, or a new record for a worker the node had dropped)."""
        with self._cond:
            self._limits_seq = 0

    # ---- training thread -----------------------------------------------------
    def on_device_start(self, args: tuple = ()) -> None:
        """First device work of a mini-batch (idempotent within a batch); ``args``: the positional arguments of
        the module call that starts it (the feature reader takes the batch size from the job's first)."""
        if self._device_start is not None:
            return
        first = not self._seen_device
        if first:
            self._hold_first_device_work()
            if self.reader is not None:
                self._guarded(self.reader.start, args)
        for hook in self._start_hooks:
            hook()
        self._device_start = self._clock()
        if first:
            # start-up (imports, model and optimizer construction) is host work:
            # device accounting and the throttle start with the first device work
            self._t0 = self._resume_t = self._prev_boundary = self._device_start
            self._busy0 = self._resume_busy = self.device.busy_time()
            self._start_watch()
        self.device.phase_start()

    def device_work_started(self) -> bool:
        """True once the job has reached its first device work (any thread). While False, a share
        of 0 set now is in force: the job will not start device work until it is raised."""
        with self._cond:
            return self._seen_device

    def _hold_first_device_work(self) -> None:
        """The job reaches its first device work: note when (``ready_at``); paused (share 0), wait
        here until the share is raised, so a paused job never starts device work. The paused-apply
        hooks hear that the limits are in force."""
        with self._cond:
            self._seen_device = True
            self.ready_at = self._clock()
            if self._share > 0.0 or self._closed:
                return
            t = self._clock()
            self._apply_while_paused()
            while not self._closed and self._share <= 0.0:
                seen = self._limits_changed
                self._cond.wait_for(lambda: self._closed or self._limits_changed != seen)  # noqa: B023 (called here)
                if not self._closed:
                    self._apply_while_paused()
            self.book.paused_s += self._clock() - t

    def on_boundary(self, source: str = "step") -> BatchRecord | None:
        """End of a mini-batch: charge host traffic, enforce memory, throttle, record.

        ``source`` says how it was found (``optimizer``, ``backward``, ``scaler``,
        ``step``); it is counted in ``book.boundaries``. Returns the batch's record, or None
        for a lean boundary (see the module's docstring)."""
        with self._boundary_lock:
            if self.reader is not None and self.reader.started:
                self._read_features()
            if (not self._listeners and not self.keep_records and not self._end_hooks
                    and self._share >= 1.0 and not self._shrink_pending and self._quiet(self._cap)):
                self._lean(source)
                return None
            return self._boundary(source)

    def _read_features(self) -> None:
        """The first boundary after the first device work: the reader's record, to ``features`` and the hooks."""
        reader, self.reader = self.reader, None
        assert reader is not None
        self.features = self._guarded(reader.finish)
        if self.features is not None:
            log.info("features read in %.3f ms", self.features.read_s * 1e3)
            for fn in list(self._features_hooks):
                self._guarded(fn, self.features)

    @staticmethod
    def _guarded(fn, *args):
        try:
            return fn(*args)
        except Exception:  # learning from the job must never break it
            log.exception("reading the job's features failed")
            return None

    def note_loader(self, loader) -> None:
        """A DataLoader starts an epoch (``torch_hooks.hooks``): the reader notes it until the features are read."""
        if self.reader is not None:
            self._guarded(self.reader.note_loader, loader)

    def _lean(self, source: str) -> None:
        """A boundary with nothing to charge, enforce, throttle or report: count it, start the next window."""
        self.book.count(source)
        self.device.reset_window()
        self._device_start = None
        self._prev_boundary = self._resume_t = self._clock()
        self._resume_busy = self.device.busy_time()
        self._last_idle = 0.0
        if self.after_boundary is not None:
            self.after_boundary()
        return None

    def _boundary(self, source: str) -> BatchRecord:
        # one boundary per mini-batch runs with cold caches after the batch's device work:
        # every call here costs several microseconds (benchmarks/overhead.py), so do only what
        # the limits and the record need
        device, clock = self.device, self._clock
        device.phase_end()
        dev_start = None if self._device_start is None else max(0.0, self._device_start - self._resume_t)
        if self._end_hooks:
            now = clock()
            for hook in self._end_hooks:
                hook(now, dev_start)
        mem = device.memory()
        penalty = 0.0
        if self._sim and mem.win_host_touched:
            penalty = host_penalty_s(mem.win_host_touched, self.env.sim_host_gbps)
            device.charge(penalty)
        busy_now = device.busy_time()
        busy_b = busy_now - self._resume_busy

        cap, shrink, share, seq = self._limits_now()
        after = mem  # the host-penalty charge changes no memory; within the cap nothing is over it
        if shrink or mem.reserved > cap:
            after = self._release_to(cap)
        floor = after.reserved if after.reserved > cap else 0

        end = clock()
        book = self.book
        rec = BatchRecord(
            index=book.iterations,
            t_end=end,
            duration_s=end - self._prev_boundary,
            busy_s=busy_b,
            idle_s=self._last_idle,
            host_penalty_s=penalty,
            device_start_s=dev_start,
            mem_allocated_peak=mem.win_peak_allocated,
            mem_reserved=after.reserved,
            mem_reserved_peak=mem.win_peak_reserved,
            mem_cap=cap,
            mem_floor=floor,
            host_bytes=after.host,
            host_bytes_touched=mem.win_host_touched,
            sm_share=share,
            limits_seq=seq,
        )
        book.add(rec, source)
        device.reset_window()
        self._device_start = None
        # listeners hear of the batch before the job idles, so a node learns at once
        # that a pause (share 0) has been reached
        if self._listeners:
            for fn in list(self._listeners):
                try:
                    fn(rec)
                except Exception:  # a listener must never break training
                    log.exception("statistics listener failed")
        idle = self._throttle(busy_b)
        if idle:
            book.idle_s += idle
        self._last_idle = idle
        self._prev_boundary = end
        if idle or self._listeners:
            self._resume_t, self._resume_busy = clock(), device.busy_time()
        else:  # nothing ran since `end`: the rest of this boundary counts into the next batch
            self._resume_t, self._resume_busy = end, busy_now
        if self.after_boundary is not None:
            self.after_boundary()
        return rec

    def _limits_now(self) -> tuple[int, bool, float, int]:
        """(cap, shrink pending, share, seq) as one consistent snapshot; clears the pending shrink."""
        with self._cond:
            cap, shrink, share, seq = self._cap, self._shrink_pending, self._share, self._limits_seq
            self._shrink_pending = False
        return cap, shrink, share, seq

    def _throttle(self, busy_b: float) -> float:
        """Idle as the share requires; returns seconds idled (pauses included, 0.0 at share 1)."""
        if self._share >= 1.0:  # never idles (a racing share change is seen at the next boundary)
            return 0.0
        start = self._clock()
        with self._cond:
            while not self._closed:
                share = self._share
                if share <= 0.0:
                    seen = self._limits_changed
                    t = self._clock()
                    self._cond.wait_for(lambda: self._closed or self._limits_changed != seen)  # noqa: B023 (called here)
                    self.book.paused_s += self._clock() - t
                    if not self._closed:
                        self._apply_while_paused()
                    continue
                want = idle_after(busy_b, self._clock() - self._resume_t, share)
                if want <= 0.0:
                    break
                seen = self._limits_changed
                # a limit change during the idle re-evaluates it
                if not self._cond.wait_for(lambda: self._closed or self._limits_changed != seen,  # noqa: B023 (called here)
                                           timeout=want):
                    break
        return self._clock() - start

    def _release_to(self, cap: int):
        """Release the cache, record how far reserved bytes still stand over ``cap``
        (live tensors may hold more) and return the memory after (training thread)."""
        self.device.release_cache()
        after = self.device.memory()
        self.book.max_reserved_over_cap = max(self.book.max_reserved_over_cap, after.reserved - cap)
        return after

    def _apply_while_paused(self) -> None:
        """New limits reached a paused job (caller holds ``_cond``): a lowered cap
        releases the cache now, not when the job resumes, so the memory goes back
        to the node at once; then the hooks learn that ``seq`` is in force."""
        if self._shrink_pending:
            self._shrink_pending = False
            self._release_to(self._cap)
        now = self._clock()
        for fn in list(self._paused_apply_hooks):
            try:
                fn(self._limits_seq, now)
            except Exception:  # a hook must never break training
                log.exception("paused-apply hook failed")

    # ---- any thread ------------------------------------------------------------
    def summary(self) -> dict:
        wall = self._clock() - self._t0
        busy = self.device.busy_time() - self._busy0
        env = self.env
        with self._cond:
            share = self._share
        job = {"job_id": env.job_id, "device": env.device, "gpu": env.gpu, "priority": env.klass,
               "on_cap": env.on_cap, "sm_share": share}
        return self.book.summary(job=job, wall_s=wall, busy_s=busy, mem=self.device.memory(), ready_at=self.ready_at)

    def forked(self, owners: tuple = ()) -> None:
        """In a child ``os.fork`` made of this process (multiprocessing's fork start method, a plain fork), on its
        only thread: its statistics count from the fork (iterations, wall and busy time), and the hooks of
        ``owners`` are dropped (the parent's node link and gate: their sockets and phases are the parent's).
        Limits and the device carry on as the parent had them."""
        self.book = StatsBook()
        self._t0 = self._resume_t = self._prev_boundary = self._clock()
        self._busy0 = self._resume_busy = self.device.busy_time()
        ids = {id(o) for o in owners if o is not None}
        hooks: list[list[Any]] = [self._listeners, self._start_hooks, self._end_hooks, self._features_hooks,
                                  self._paused_apply_hooks]
        for fns in hooks:
            fns[:] = [f for f in fns if id(getattr(f, "__self__", None)) not in ids]

    def close(self) -> None:
        """Release a paused training thread; later boundaries do not idle; the
        no-boundary watch ends."""
        self._watch_stop.set()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ---- no-boundary watch (its own thread) --------------------------------------
    def _start_watch(self) -> None:
        period = float(getattr(self.env, "boundary_warn_s", 0.0) or 0.0)
        if period > 0 and not self._watch_stop.is_set():
            threading.Thread(target=self._watch, args=(period,), name="colocate-boundary-watch",
                             daemon=True).start()

    def _watch(self, period: float) -> None:
        while True:
            start = self._device_start  # None while idling at a boundary or before a batch's device work
            wait = period
            if start is not None:
                waited = self._clock() - start
                if waited >= period:
                    self._warn_no_boundary(waited)
                    return
                wait = period - waited
            if self._watch_stop.wait(wait):
                return

    def _warn_no_boundary(self, waited: float) -> None:
        self.no_boundary_warned = True
        print(f"colocate: no mini-batch boundary in {waited:.3g} s of device work "
              f"({self.book.iterations} found so far): the SM share and memory-cap shrinking apply only at "
              "boundaries. They are found at optimizer.step() and, with no optimizer, at the first forward "
              "after loss.backward(); a loop with neither (or a long evaluation loop) should call "
              "torch_hooks.step() once per mini-batch (COLOCATE_BOUNDARY_WARN_S=0 silences this).",
              file=sys.stderr, flush=True)
