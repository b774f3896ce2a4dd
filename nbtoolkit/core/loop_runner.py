"""The greenlet that runs a training loop, and what it learns at the loop's optimizer steps.

:class:`LoopRun` is the machinery under :class:`~nbtoolkit.core.training_loop.LoopSteps`: it starts
the loop in a greenlet on the calling thread, listens to the loop's optimizer steps
(:mod:`nbtoolkit.core.loop_boundaries`), learns which optimizer closes a step's cycle, switches
back to the caller at the end of each step, keeps the step time limit (:mod:`~nbtoolkit.core.
loop_watchdog`), and says how each resume ended: ``("step", None)``, ``("returned", value)``,
``("stopped", None)`` (TrainingStopped), ``("time limit", None)`` or ``("raised", exception)``.
LoopSteps decides what each means for its caller.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from nbtoolkit.core import loop_boundaries
from nbtoolkit.core.errors import LoopError, NbtError, TrainingStopped
from nbtoolkit.core.loop_stop import PLAIN_LOOP, Framework, find_framework
from nbtoolkit.core.loop_watchdog import StepTimeLimit, Watchdog

__all__ = ["LoopRun", "close_abandoned"]

FIRST_STEP_ALLOWANCE = 3.0  # the first step also runs the loop's setup (data loaders, compilation)
# The time limit is kept at the loop's own hooks (its backward passes and optimizer steps), where
# raising is as safe as any exception of the loop's code. The watchdog thread's exception, raised
# into whatever Python instruction runs, is the last resort for a loop that reaches no hook: it
# waits this many times the limit. Raised from outside, it can land inside torch.profiler's own
# Python code and leave the profiler unable to start again in this process (a known hang).
LAST_RESORT_FACTOR = 2.0
STOP_GRACE_STEPS = 3  # optimizer steps a framework may take after its stop flag before we raise


class LoopRun:
    """The state of one LoopSteps: its greenlet, the optimizer cycle and the counts.

    Kept apart from :class:`LoopSteps` so that the finaliser that closes an abandoned loop holds
    this object, not the LoopSteps it closes.
    """

    def __init__(self, loop: Callable[[], Any], label: str, limit_s: float) -> None:
        self.loop = loop
        self.label = label
        self.limit_s = limit_s
        self.glet: Any = None
        self.thread: int | None = None
        self.caller: Any = None
        self.mode = "pause"  # "pause" at each step's end | "stop" (finishing) | "run" (to the end)
        self.framework: Framework | None = None
        self.known: Framework | None = None  # the framework the caller named (train_step)
        self.lead: Any = None  # the first optimizer seen
        self.closing: Any = None  # the optimizer whose end ends a step (None: being learned)
        self.cycle_known = False
        self.seen: list[Any] = []  # optimizers, in order of first step
        self.last_finished: Any = None
        self.cycle_grew = False  # the cycle changed during the step in progress
        self.backwards = 0  # backward passes in the step in progress
        self.skipped_now = False
        self.grace = 0  # optimizer steps taken since a stop flag was set
        self.scaler = False
        self.watchdog = Watchdog()
        self.deadline: float | None = None  # time.monotonic() the step in progress must end by
        self.first_step = True
        self.most_optimizers = 0  # the most optimizers one run of the loop stepped
        # other optimizers the loop can reach at its first optimizer step (its frames' variables):
        # a cycle of several may be ahead, so the warm-up runs until the cycle is learned
        self.others_in_reach = False

    # ---- events from loop_boundaries (in the loop greenlet) ----
    def optimizer_started(self, optimizer: Any) -> None:
        self.check_time()
        if self.framework is None:
            self.framework = find_framework()
        if self.lead is None and self.framework.known_optimizers() == 1:
            self.cycle_known = True
        if self.lead is None:
            self.lead = self.closing = optimizer
            if not self.cycle_known:
                self.others_in_reach = _other_optimizers_in_reach(sys._getframe(1), optimizer, self.framework)
        if all(optimizer is not known for known in self.seen):
            self.seen.append(optimizer)
        if optimizer is self.lead:
            if not self.cycle_known and self.last_finished is not None:
                # the lead steps again: the optimizer that finished just before it closes the cycle
                self.closing, self.cycle_known = self.last_finished, True
        elif not self.cycle_known and self.closing is self.lead:
            self.closing = None  # another optimizer in the cycle: its end is learned at the lead's
            self.cycle_grew = True

    def backward_started(self) -> None:
        self.backwards += 1
        self.check_time()

    def check_time(self) -> None:
        """Raise StepTimeLimit here, in the loop's own code, once the step in progress is past its limit."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.deadline = None
            raise StepTimeLimit

    def arm(self, limit_s: float) -> None:
        """Start the step's time limit: kept at the hooks, the watchdog as the last resort."""
        self.deadline = time.monotonic() + limit_s
        self.watchdog.arm(self.thread, limit_s * LAST_RESORT_FACTOR)

    def disarm(self) -> None:
        self.deadline = None
        self.watchdog.disarm(self.thread)

    def scaler_used(self) -> None:
        self.scaler = True

    def optimizer_finished(self, optimizer: Any, *, skipped: bool) -> None:
        self.last_finished = optimizer
        self.skipped_now = self.skipped_now or skipped
        if optimizer is not self.closing:
            return
        if self.mode != "pause":
            # running on unmeasured (to its end, or to the stop its framework was asked for): the
            # time limit holds for each step, not for the rest of the run
            self.arm(self.limit_s)
        if self.mode == "run":
            return
        if self.mode == "stop":
            self.grace += 1
            if self.grace > STOP_GRACE_STEPS:
                raise TrainingStopped  # the framework did not honour its flag: stop it by raising
            return
        self.disarm()
        self.caller.switch(("step", None))
        # resumed by the next step()
        self.arm(self.limit_s)

    # ---- the greenlet ----
    def body(self) -> tuple[str, Any]:
        try:
            return ("returned", self.loop())
        except TrainingStopped:
            return ("stopped", None)
        except StepTimeLimit:
            return ("time limit", None)
        except BaseException as exc:
            return ("raised", exc)
        finally:
            self.disarm()

    def launch(self) -> None:
        import greenlet

        self.glet = greenlet.greenlet(self.body)
        # the loop sees the caller's context variables (a new greenlet would start with none)
        self.glet.gr_context = contextvars.copy_context()
        self.mode, self.framework, self.first_step = "pause", self.known, True
        # a restarted trainer may make new optimizers (Lightning's configure_optimizers): learn again
        self.most_optimizers = max(self.most_optimizers, len(self.seen))
        self.lead = self.closing = self.last_finished = None
        self.cycle_known, self.seen, self.others_in_reach = False, [], False
        loop_boundaries.listen(self.glet, self)

    def resume(self, *, throw: type[BaseException] | None = None) -> tuple[str, Any]:
        """Switch into the loop until its next step ends or it ends; the message it sends back."""
        import greenlet

        if threading.get_ident() != self.thread:
            raise LoopError(
                f"{self.label} runs on another thread than the one stepping it now: call its steps from "
                "the thread (the notebook cell) that started it"
            )
        current = greenlet.getcurrent()
        if current is self.glet:
            raise LoopError(f"{self.label} asked for its own next step from inside the loop: call it outside")
        self.caller = current
        self.glet.parent = current  # when the loop ends, its result comes back to whoever resumed it
        limit = self.limit_s * (FIRST_STEP_ALLOWANCE if self.first_step else 1.0)
        self.first_step = False
        self.backwards, self.skipped_now, self.cycle_grew = 0, False, False
        self.arm(limit)
        try:
            message = self.glet.throw(throw) if throw is not None else self.glet.switch()
        except StepTimeLimit:  # delivered just as the loop handed control back
            message = ("time limit", None)
        except BaseException:
            self.disarm()
            raise
        try:
            self.disarm()
        except StepTimeLimit:  # delivered inside disarm itself: this step did pass the limit
            self.disarm()
            message = ("time limit", None) if message[0] == "step" else message
        if self.glet.dead:
            loop_boundaries.unlisten(self.glet)
        return message

    def end(self, *, throw: bool = True) -> None:
        """Make sure the greenlet is over and the hooks are gone (raising TrainingStopped into it)."""
        started = self.glet is not None and bool(self.glet) and not self.glet.dead
        if started and throw and threading.get_ident() == self.thread:
            with contextlib.suppress(LoopError, NbtError):
                self.resume(throw=TrainingStopped)
        if self.glet is not None:
            loop_boundaries.unlisten(self.glet)
        self.watchdog.close()


def _is_optimizer(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.optim.Optimizer)


def _other_optimizers_in_reach(frame: Any, lead: Any, framework: Framework) -> bool:
    """Whether the loop holds optimizers besides ``lead`` (a wrapper of it, such as accelerate's
    AcceleratedOptimizer, does not count): in its frames' variables, one container deep, or in its
    Lightning trainer's ``optimizers``. Read once, at the loop's first optimizer step."""
    if framework.kind != PLAIN_LOOP:
        return len(getattr(framework.trainer, "optimizers", None) or []) > 1

    def other(obj: Any) -> bool:
        return _is_optimizer(obj) and obj is not lead and getattr(obj, "optimizer", None) is not lead

    root = LoopRun.body.__code__
    while frame is not None and frame.f_code is not root:  # the loop's own frames, not the caller's
        # its variables, and the globals its code names (a loop written at a notebook's top level)
        names = frame.f_code.co_names
        found = [frame.f_globals[name] for name in names if name in frame.f_globals]
        for value in [*frame.f_locals.values(), *found]:
            if other(value):
                return True
            if isinstance(value, list | tuple):
                items: Any = value
            elif isinstance(value, dict):
                items = value.values()
            else:
                continue
            if any(other(item) for item in list(items)[:64]):
                return True
        frame = frame.f_back
    return False


def close_abandoned(run: LoopRun) -> None:
    """The finaliser of a LoopSteps nobody closed: stop its loop if this thread can, drop the hooks."""
    import greenlet

    if run.glet is not None and greenlet.getcurrent() is not run.glet:
        run.end(throw=True)
    elif run.glet is not None:
        loop_boundaries.unlisten(run.glet)
