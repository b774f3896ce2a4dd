"""Where one training step ends: the process-wide hooks that see a running loop's optimizer steps.

While at least one :class:`~nbtoolkit.core.training_loop.LoopSteps` is open, this module keeps:

- torch's global optimizer step pre- and post-hooks (``register_optimizer_step_pre_hook`` /
  ``..._post_hook``): every ``Optimizer.step`` of any optimizer reports its start and its end;
- ``torch.amp.GradScaler.step`` / ``.update`` wrapped: with a scaler, ``scaler.step(opt)`` skips
  ``opt.step()`` when the gradients hold inf/NaN, so the step of a scaled optimizer *ends* at the
  scaler's ``update()`` (skipped or not) rather than at its post-hook;
- ``torch.autograd.backward`` wrapped, to count backward passes (gradient accumulation shows as
  several per optimizer step). ``Tensor.backward`` calls ``torch.autograd.backward`` through the
  module attribute, so one wrapper sees both spellings; it costs one Python call per backward.
  (The autograd engine has no global "backward started" hook; per-tensor hooks would need the
  graph's roots, which only the caller of backward knows.)

Each event goes to the listener registered for the greenlet that is running (the loop's greenlet):
an optimizer stepped by anything else (a measurement's own code, another cell) is not seen. The
last listener to leave removes the hooks and restores the wrapped functions, so a process where no
loop is open has nothing of nbtoolkit's in torch.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

__all__ = ["BoundaryListener", "active_listeners", "listen", "unlisten"]


class BoundaryListener(Protocol):
    """What a running loop is told (all called in the loop's greenlet)."""

    def optimizer_started(self, optimizer: Any) -> None: ...
    def optimizer_finished(self, optimizer: Any, *, skipped: bool) -> None: ...
    def backward_started(self) -> None: ...
    def scaler_used(self) -> None: ...


_lock = threading.Lock()
_listeners: dict[Any, BoundaryListener] = {}  # loop greenlet -> its listener
_installed: dict[str, Any] = {}  # what install() replaced, for uninstall()
_scaled_now: dict[int, list[Any]] = {}  # id(scaler) -> optimizers its step() handled since update()
_inside_scaler_step: set[int] = set()  # id(optimizer) while scaler.step(optimizer) runs


def _current() -> BoundaryListener | None:
    if not _listeners:
        return None
    from greenlet import getcurrent  # imported once listening began: a dictionary look-up here

    return _listeners.get(getcurrent())


def _pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    listener = _current()
    if listener is not None and id(optimizer) not in _inside_scaler_step:
        listener.optimizer_started(optimizer)


def _post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if id(optimizer) in _inside_scaler_step:
        _inside_scaler_step.discard(id(optimizer))  # it ran: the scaler's update() ends its step
        return
    listener = _current()
    if listener is not None:
        listener.optimizer_finished(optimizer, skipped=False)


def _install() -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    scaler_cls = torch.amp.GradScaler
    original_step, original_update = scaler_cls.step, scaler_cls.update
    original_backward = torch.autograd.backward

    def scaler_step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        listener = _current()
        if listener is None or not getattr(self, "_enabled", True):
            return original_step(self, optimizer, *args, **kwargs)
        listener.scaler_used()
        listener.optimizer_started(optimizer)
        _inside_scaler_step.add(id(optimizer))
        try:
            result = original_step(self, optimizer, *args, **kwargs)
        finally:
            # still here when the post-hook did not run: the scaler skipped optimizer.step()
            skipped = id(optimizer) in _inside_scaler_step
            _inside_scaler_step.discard(id(optimizer))
        _scaled_now.setdefault(id(self), []).append((optimizer, skipped))
        return result

    def scaler_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_update(self, *args, **kwargs)
        stepped = _scaled_now.pop(id(self), [])
        listener = _current()
        if listener is not None:
            for optimizer, skipped in stepped:
                listener.optimizer_finished(optimizer, skipped=skipped)
        return result

    def backward(*args: Any, **kwargs: Any) -> Any:
        listener = _current()
        if listener is not None:
            listener.backward_started()
        return original_backward(*args, **kwargs)

    backward.__wrapped__ = original_backward  # type: ignore[attr-defined]
    backward.__doc__ = original_backward.__doc__
    _installed.update(
        pre=register_optimizer_step_pre_hook(_pre_hook),
        post=register_optimizer_step_post_hook(_post_hook),
        step=original_step,
        update=original_update,
        backward=original_backward,
    )
    # setattr: the wrappers replace methods of torch's class for as long as a loop is open
    setattr(scaler_cls, "step", scaler_step)  # noqa: B010
    setattr(scaler_cls, "update", scaler_update)  # noqa: B010
    torch.autograd.backward = backward


def _uninstall() -> None:
    import torch

    _installed.pop("pre").remove()
    _installed.pop("post").remove()
    setattr(torch.amp.GradScaler, "step", _installed.pop("step"))  # noqa: B010
    setattr(torch.amp.GradScaler, "update", _installed.pop("update"))  # noqa: B010
    torch.autograd.backward = _installed.pop("backward")
    _scaled_now.clear()
    _inside_scaler_step.clear()


def listen(loop_greenlet: Any, listener: BoundaryListener) -> None:
    """Send the events of ``loop_greenlet`` to ``listener`` (installs the hooks for the first one)."""
    with _lock:
        if not _listeners:
            _install()
        _listeners[loop_greenlet] = listener


def unlisten(loop_greenlet: Any) -> None:
    """Stop listening to ``loop_greenlet`` (the last one removes the hooks); idempotent."""
    with _lock:
        if _listeners.pop(loop_greenlet, None) is not None and not _listeners:
            _uninstall()


def active_listeners() -> int:
    """How many loop greenlets are listened to now (0: no hook of nbtoolkit is installed)."""
    return len(_listeners)
