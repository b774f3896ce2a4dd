"""Interrupt a training loop whose step takes longer than its time limit.

A loop run step by step (:mod:`nbtoolkit.core.training_loop`) hands control back only at its
optimizer steps; one that never steps an optimizer (or hangs) would never come back to the cell.
A watchdog thread, armed while a step runs, raises :class:`StepTimeLimit` in the stepping thread
when the limit passes: ``PyThreadState_SetAsyncExc``, CPython's way to raise in another thread
(the same call debuggers use), so the exception arrives in whatever runs on that thread, the loop's
greenlet, and is caught where the loop was started. It arrives at the next Python instruction
the thread runs: a loop stuck inside one long native call is interrupted when the call returns.

Disarming also withdraws an exception fired but not yet delivered, so a step that ended just as
the limit passed is not interrupted later in the caller's code.
"""

from __future__ import annotations

import ctypes
import threading
import time

__all__ = ["StepTimeLimit", "Watchdog"]


class StepTimeLimit(BaseException):
    """Raised in a loop's thread when its step ran past the time limit (a BaseException, so that the
    loop's ``except Exception`` does not swallow it)."""


def _raise_in(thread_id: int, exception: type[BaseException] | None) -> None:
    # None withdraws an exception set before and not yet raised
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception) if exception is not None else None
    )


class Watchdog:
    """One thread per loop, started on first arm, sleeping while nothing is armed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._target: int | None = None
        self._fired = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def arm(self, thread_id: int | None, seconds: float) -> None:
        """Raise StepTimeLimit in ``thread_id`` unless disarmed within ``seconds``."""
        if thread_id is None:
            return
        with self._cond:
            if self._closed:
                return
            deadline = time.monotonic() + seconds
            # Wake the watching thread only when it must wait less than it does: a later deadline
            # it finds when its wait ends (arming at every optimizer step must not cost a thread
            # switch each time).
            wake = self._deadline is None or deadline < self._deadline
            self._deadline, self._target, self._fired = deadline, thread_id, False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="nbtoolkit-loop-watchdog", daemon=True
                )
                self._thread.start()
            if wake:
                self._cond.notify()

    def disarm(self, thread_id: int | None) -> None:
        """Stop watching; an exception fired and not yet delivered is withdrawn."""
        with self._cond:
            self._deadline = None  # the watching thread finds it so when its wait ends: no wake-up
            if self._fired and thread_id is not None:
                _raise_in(thread_id, None)
            self._fired = False

    def close(self) -> None:
        """End the watchdog thread (idempotent); an exception fired and not yet delivered is withdrawn,
        so that no StepTimeLimit reaches code that runs after the loop (a profiler starting in the
        next cell, caught half-way, never started again)."""
        with self._cond:
            if self._fired and self._target is not None:
                _raise_in(self._target, None)
            self._closed, self._deadline, self._fired = True, None, False
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                if self._target is not None and not self._closed:
                    _raise_in(self._target, StepTimeLimit)
                    self._fired = True
                self._deadline = None
