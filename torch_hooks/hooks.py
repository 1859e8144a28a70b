"""Finding the mini-batch boundary in an unmodified script.

* boundary: a global optimizer-step post hook (every ``torch.optim`` optimizer).
  With several optimizers (GANs, sparse + dense) a mini-batch ends when every
  optimizer seen so far has stepped once; an optimizer stepping twice before
  that also ends it (some optimizers do not step every iteration);
  AMP's GradScaler may skip ``optimizer.step()`` on inf/NaN gradients, so a
  ``GradScaler.update()`` with no optimizer step since ``GradScaler.step()``
  also counts as a boundary;
* device-phase start: a global module forward pre-hook (first module call after
  a boundary).

``install_hooks(rt)`` is idempotent per process and returns handles that
``remove_hooks`` undoes (tests use it).
"""

from __future__ import annotations

_handles: list = []
_patched: list = []


def install_hooks(rt) -> None:
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if _handles:
        return

    import weakref

    known, pending = weakref.WeakSet(), weakref.WeakSet()

    def on_step(optimizer, args, kwargs):
        if optimizer in pending:  # a new cycle began before all known ones stepped
            known.clear()
            known.update(pending)
            pending.clear()
            pending.add(optimizer)
            rt.on_boundary()
            return
        known.add(optimizer)
        pending.add(optimizer)
        if all(o in pending for o in known):
            pending.clear()
            rt.on_boundary()

    def on_forward(module, args):
        rt.on_device_start()

    _handles.append(register_optimizer_step_post_hook(on_step))
    _handles.append(register_module_forward_pre_hook(on_forward))

    scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler_cls is not None:
        orig_step, orig_update = scaler_cls.step, scaler_cls.update

        def step(self, optimizer, *args, **kwargs):
            self._colocate_iters = rt.book.iterations
            return orig_step(self, optimizer, *args, **kwargs)

        def update(self, *args, **kwargs):
            out = orig_update(self, *args, **kwargs)
            before = getattr(self, "_colocate_iters", None)
            if before is not None and rt.book.iterations == before:  # step() was skipped
                rt.on_boundary()
            self._colocate_iters = None
            return out

        scaler_cls.step, scaler_cls.update = step, update
        _patched.append((scaler_cls, orig_step, orig_update))


def remove_hooks() -> None:
    while _handles:
        _handles.pop().remove()
    while _patched:
        cls, step, update = _patched.pop()
        cls.step, cls.update = step, update
