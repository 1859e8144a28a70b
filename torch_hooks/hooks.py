"""Finding the mini-batch boundary in an unmodified script.

Each boundary is counted by its source in ``StatsBook.boundaries``:

* ``optimizer``: a global optimizer-step post hook (every ``torch.optim``
  optimizer). With several optimizers (GANs, sparse + dense) a mini-batch ends
  when every optimizer seen so far has stepped once; an optimizer stepping twice
  before that also ends it (some optimizers do not step every iteration).
* ``scaler``: AMP's GradScaler may skip ``optimizer.step()`` on inf/NaN
  gradients, so a ``GradScaler.update()`` with no optimizer step since
  ``GradScaler.step()`` also counts as a boundary.
* ``backward``: for loops with no optimizer (parameters updated by hand, e.g.
  ``p.data.add_(p.grad, alpha=-lr)``): the first module forward, with grad
  enabled, that starts after a completed ``loss.backward()`` /
  ``torch.autograd.backward()`` with no boundary of any kind in between ends
  the mini-batch of that backward. Rules:

  - only while no optimizer is known: from the moment any ``torch.optim.Optimizer``
    is constructed (or, for one built before ``install``, first steps), only
    optimizer steps (and the GradScaler rule) mark boundaries, so gradient
    accumulation never adds boundaries. A script that builds its optimizer
    after some hand-updated iterations gets ``backward`` boundaries up to then;
  - a forward under ``torch.no_grad()`` / ``inference_mode`` (evaluation) never
    makes one: the pending backward waits for the next grad-enabled forward,
    so a training batch followed by an evaluation pass is one long mini-batch;
  - no boundary is made while a backward runs (activation checkpointing runs
    module forwards, and reentrant checkpointing ``torch.autograd.backward``,
    inside the outer backward). A reentrant checkpoint runs its forward under
    no_grad: a model whose every module sits inside one has no grad-enabled
    forward to end a batch at (the no-boundary warning then says so);
  - ``torch.autograd.grad`` does not count; the last backward of a job (no
    forward after it) ends no mini-batch; a loop that hand-accumulates
    gradients over several backward/forward pairs gets one boundary per pair.

  ``torch.autograd.backward`` (which ``Tensor.backward`` calls) is replaced by a
  thin wrapper (a depth counter and a flag; ``benchmarks/overhead.py`` reports its
  cost per call, against tens of microseconds for the smallest real backward),
  and ``torch.optim.Optimizer.__init__`` by one that notes an optimizer exists;
  both are put back once one does;
* ``step``: ``torch_hooks.step()``, for loops none of these see. It works with
  every other source; a pending backward is then not counted again.

Device-phase start: a global module forward pre-hook (first module call after a
boundary). It is registered only while it has work to do (after a boundary,
until the next module call; after a backward with no optimizer, until the next
grad-enabled one), so the other module calls of a mini-batch take torch's
hook-free fast path: the forward-hook cost is one call per mini-batch, whatever
the model's size.

Cost (``benchmarks/overhead.py`` measures it): per mini-batch one boundary
(memory statistics, one busy-time read, the record) and one pre-hook call; the
``torch.autograd.backward`` and ``Optimizer.__init__`` patches are removed as
soon as an optimizer is known, so a loop with an optimizer pays nothing there.

DataLoaders: ``DataLoader.__iter__`` is wrapped to tell the runtime (``Runtime.note_loader``) which loader
starts an epoch, until the job's features are read (one attribute test per epoch after that).

``install_hooks(rt)`` is idempotent per process; ``remove_hooks()`` undoes it
(tests and the overhead benchmark use it). ``install_hooks(rt, timer=counter)``
installs the same hooks wrapped so that each adds the nanoseconds spent in its
own code to ``counter`` (a ``HookTimer``): the overhead benchmark's direct
measurement. Without a timer nothing is timed and nothing extra runs.
"""

from __future__ import annotations

import functools
import time

_handles: list = []
_patched: list = []  # (owner, attribute, original) restored by remove_hooks
_rt: list = []  # the runtime whose after_boundary the hooks set


class HookTimer:
    """Nanoseconds spent inside the runtime's hooks, by hook (benchmark use only).

    ``ns[name]`` and ``calls[name]`` for ``forward`` (module forward pre-hook,
    including any boundary it makes), ``optimizer`` (step post hook, including the
    boundary), ``backward`` (the wrapper's own work, the backward itself excluded)
    and ``scaler`` (the GradScaler patch's own work). Each timed call also pays two
    ``perf_counter_ns`` reads, which ``clock_cost_ns()`` estimates."""

    def __init__(self):
        self.ns: dict[str, int] = {"forward": 0, "optimizer": 0, "backward": 0, "scaler": 0}
        self.calls: dict[str, int] = {k: 0 for k in self.ns}
        self._inner = [0]  # ns spent in wrapped torch functions (excluded from the hooks' own time)

    def total_ns(self) -> int:
        return sum(self.ns.values())

    def total_calls(self) -> int:
        return sum(self.calls.values())

    def timed(self, fn, key: str):
        """``fn`` wrapped: its time, less the time of the wrapped originals it calls
        through ``inner``, is added to ``ns[key]``."""
        clock, ns, calls, inner = time.perf_counter_ns, self.ns, self.calls, self._inner

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0, in0 = clock(), inner[0]
            try:
                return fn(*args, **kwargs)
            finally:
                ns[key] += clock() - t0 - (inner[0] - in0)
                calls[key] += 1

        return timed

    def inner(self, orig):
        """``orig`` (the torch function a hook wraps) timed apart, so ``timed`` can leave it out."""
        clock, inner = time.perf_counter_ns, self._inner

        @functools.wraps(orig)
        def call(*args, **kwargs):
            t0 = clock()
            try:
                return orig(*args, **kwargs)
            finally:
                inner[0] += clock() - t0

        return call

    @staticmethod
    def clock_cost_ns(n: int = 200_000) -> float:
        """Mean cost of one timed empty section (two ``perf_counter_ns`` reads and the sum)."""
        clock = time.perf_counter_ns
        acc = 0
        t0 = clock()
        for _ in range(n):
            a = clock()
            acc += clock() - a
        return (clock() - t0) / n


def install_hooks(rt, timer: HookTimer | None = None) -> None:  # noqa: C901, PLR0915 (one closure per hook: every allocation runs them, so nothing is looked up through another call)
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if _handles:
        return

    import weakref

    known: weakref.WeakSet = weakref.WeakSet()
    pending: weakref.WeakSet = weakref.WeakSet()
    solo = None  # weakref to the only known optimizer while one steps alone (the fast path)
    book = rt.book
    grad_enabled = torch.is_grad_enabled
    # backward-boundary state (one training thread; see the module docstring)
    backward_on = True  # no optimizer known yet
    backward_done = False  # an outermost backward completed ...
    backward_at = 0  # ... when book.iterations was this
    depth = 0  # backward calls in progress
    # The device-start pre-hook is registered only while it has work: from a boundary (or
    # install) to the next module forward, and from a backward to the next grad-enabled
    # forward. In between, module calls take torch's hook-free fast path. Arming is one
    # insertion into torch's dict of global pre-hooks under the id of a handle registered
    # once (so `RemovableHandle` bookkeeping is not paid per mini-batch).
    handle = register_module_forward_pre_hook(_placeholder)
    hooks_dict, hook_id = handle.hooks_dict_ref(), handle.id

    def arm() -> None:
        hooks_dict[hook_id] = on_forward

    def disarm() -> None:
        hooks_dict.pop(hook_id, None)

    def no_backward_boundaries() -> None:
        nonlocal backward_on, backward_done
        backward_on = backward_done = False
        _unpatch(torch.autograd, "backward")  # nothing left to do there: cost nothing from now on
        _unpatch(torch.optim.Optimizer, "__init__")

    def on_step(optimizer, args, kwargs):
        nonlocal solo
        if solo is not None and solo() is optimizer:  # one optimizer, stepping once per mini-batch
            rt.on_boundary("optimizer")
            return
        if backward_on:
            no_backward_boundaries()
        if optimizer in pending:  # a new cycle began before all known ones stepped
            known.clear()
            known.update(pending)
            pending.clear()
            pending.add(optimizer)
            solo = None
            rt.on_boundary("optimizer")
            return
        known.add(optimizer)
        pending.add(optimizer)
        if all(o in pending for o in known):
            pending.clear()
            solo = weakref.ref(optimizer) if len(known) == 1 else None
            rt.on_boundary("optimizer")
        else:
            solo = None

    def on_forward(module, args):
        nonlocal backward_done
        if backward_done:
            if book.iterations != backward_at:  # another boundary already ended that batch
                backward_done = False
            elif not depth and grad_enabled():
                backward_done = False
                rt.on_boundary("backward")
        if rt._device_start is None:
            rt.on_device_start(args)
        if not backward_done:
            disarm()

    orig_backward = torch.autograd.backward
    call_backward = orig_backward if timer is None else timer.inner(orig_backward)

    @functools.wraps(orig_backward)
    def backward(*args, **kwargs):
        nonlocal depth, backward_done, backward_at
        depth += 1
        try:
            out = call_backward(*args, **kwargs)
        finally:
            depth -= 1
        if backward_on:
            backward_done, backward_at = True, book.iterations
            arm()
        return out

    orig_opt_init = torch.optim.Optimizer.__init__

    @functools.wraps(orig_opt_init)
    def optimizer_init(self, *args, **kwargs):
        if backward_on:
            no_backward_boundaries()
        return orig_opt_init(self, *args, **kwargs)

    if timer is not None:
        on_step, on_forward = timer.timed(on_step, "optimizer"), timer.timed(on_forward, "forward")
        backward = timer.timed(backward, "backward")

    _handles.append(register_optimizer_step_post_hook(on_step))
    _handles.append(handle)
    _rt.append(rt)
    rt.after_boundary = arm  # every boundary, whatever found it, re-arms the device-start hook
    arm()
    _patch(torch.autograd, "backward", backward)
    _patch(torch.optim.Optimizer, "__init__", optimizer_init)

    loader_cls = torch.utils.data.DataLoader
    orig_loader_iter = loader_cls.__iter__

    @functools.wraps(orig_loader_iter)
    def loader_iter(self):
        if rt.reader is not None:  # the features' training loader: the last one to start before they are read
            rt.note_loader(self)
        return orig_loader_iter(self)

    _patch(loader_cls, "__iter__", loader_iter)

    scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_cls is not None:
        orig_step, orig_update = scaler_cls.step, scaler_cls.update
        call_step = orig_step if timer is None else timer.inner(orig_step)
        call_update = orig_update if timer is None else timer.inner(orig_update)

        def step(self, optimizer, *args, **kwargs):
            self._colocate_iters = rt.book.iterations
            reader = rt.reader
            if reader is not None and reader.started:  # the features' optimizer, even if this step is skipped
                reader.note_optimizer(optimizer)
            return call_step(self, optimizer, *args, **kwargs)

        def update(self, *args, **kwargs):
            out = call_update(self, *args, **kwargs)
            before = getattr(self, "_colocate_iters", None)
            if before is not None and rt.book.iterations == before:  # step() was skipped
                rt.on_boundary("scaler")
            self._colocate_iters = None
            return out

        if timer is not None:
            step, update = timer.timed(step, "scaler"), timer.timed(update, "scaler")
        _patch(scaler_cls, "step", step)
        _patch(scaler_cls, "update", update)


def _placeholder(module, args) -> None:
    """Stands in for the device-start hook until ``install_hooks`` arms it."""


def _patch(owner, name: str, value) -> None:
    _patched.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def _unpatch(owner, name: str) -> None:
    for i, (o, n, original) in enumerate(_patched):
        if o is owner and n == name:
            setattr(owner, name, original)
            del _patched[i]
            return


def remove_hooks() -> None:
    while _handles:
        _handles.pop().remove()
    if _rt:
        _rt.pop().after_boundary = None
    while _patched:
        owner, name, original = _patched.pop()
        setattr(owner, name, original)
