"""Any training loop as a zero-argument step: ``LoopSteps(trainer.train).step()`` runs one step.

Every measuring API takes a ``step`` it can call. People train through loops they do not write
(``trainer.train()``, ``trainer.fit(...)``, an accelerate loop): :class:`LoopSteps` turns such a
loop into steps, where a step is what happens between two optimizer steps.

How: the loop runs in a **greenlet** (a second stack on the same OS thread;
:mod:`nbtoolkit.core.loop_runner`). Process-wide optimizer hooks
(:mod:`nbtoolkit.core.loop_boundaries`, installed only while a LoopSteps is open) switch back to
the caller when the loop's optimizer step ends; ``step()`` switches into the loop, which runs
until the end of its next optimizer step. Because it is the same thread, all of torch's
thread-local state the caller sets up (the dispatch modes a memory capture pushes, the profiler,
dynamo's frame hook, grad mode) applies to the loop's work, which a second thread would not give.

A step ends after the optimizer that closes the loop's optimizer cycle: with one optimizer, its
step; with several (a GAN), the lead optimizer is the first one seen and the closing one is the one
that stepped just before the lead steps again. A framework that fixes one optimizer (HF Trainer,
Lightning automatic optimization) is not learned. Otherwise the first step assumes one optimizer,
and a second one seen before the lead steps again extends the cycle (the step in progress then
runs to the end of the next whole cycle). So that no measured step is the one that learns it, a
loop that can reach other optimizers at its first optimizer step (its frames' variables, the
globals its code names, its Lightning trainer's ``optimizers``) warms up one step more; a measured
step that still learned the cycle (``warmup=0``) is counted in ``LoopOutcome.irregular_steps``.
With an AMP GradScaler, a scaled optimizer's step ends at ``scaler.update()``, so a step whose
``opt.step()`` the scaler skipped (inf/NaN gradients) still ends there and is counted in ``skipped_steps``.

A step that takes longer than ``step_time_limit_s`` (a loop that never steps an optimizer) is
interrupted by a watchdog thread (:mod:`nbtoolkit.core.loop_watchdog`).

:meth:`LoopSteps.finish` ends the loop: ``after="stop"`` asks the framework to stop after the step
in progress (:mod:`nbtoolkit.core.loop_stop`) or raises
:class:`~nbtoolkit.core.errors.TrainingStopped` inside a plain loop; ``after="continue"`` runs it
to its own end, unmeasured.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nbtoolkit.core.errors import LoopEndedError, LoopError, NbtError, StepError, TrainingStopped
from nbtoolkit.core.loop_runner import LoopRun, close_abandoned
from nbtoolkit.core.loop_stop import PLAIN_LOOP, Framework, framework_of

__all__ = ["LoopOutcome", "LoopSteps", "default_step_time_limit"]

DEFAULT_STEP_LIMIT_S = 120.0


def default_step_time_limit() -> float:
    """The step time limit: ``NBTOOLKIT_LOOP_STEP_LIMIT`` seconds, else 120."""
    raw = os.environ.get("NBTOOLKIT_LOOP_STEP_LIMIT", "")
    try:
        value = float(raw) if raw.strip() else DEFAULT_STEP_LIMIT_S
    except ValueError:
        raise LoopError(
            f"NBTOOLKIT_LOOP_STEP_LIMIT={raw!r} is not a number of seconds: set it to e.g. 300, or unset it"
        ) from None
    return value if value > 0 else DEFAULT_STEP_LIMIT_S


@dataclass
class LoopOutcome:
    """How a loop run as steps went.

    Attributes:
        framework: ``"transformers.Trainer"``, ``"lightning Trainer"`` or ``"plain loop"``.
        warmup_steps: unmeasured steps before the measured ones (restarts' warm-ups included).
        measured_steps: ``step()`` calls completed after the warm-up.
        stopped_by: how the loop ended (``"HF control.should_training_stop"``, ``"Lightning
            trainer.should_stop"``, ``"nbtoolkit.TrainingStopped raised at the optimizer step"``,
            ``"ran to its end"``), or ``"still running"``.
        optimizers: how many optimizers stepped.
        backward_passes_per_step: backward passes in each measured step (gradient accumulation
            shows as more than one).
        grad_scaler: an AMP GradScaler stepped the optimizers.
        skipped_steps: measured steps whose optimizer step the GradScaler skipped (inf/NaN grads).
        loop_value: what the loop returned (an HF ``TrainOutput``), None when stopped by raising.
        restarts: how many times the loop was started again after it ended (``restart=True``).
        irregular_steps: measured steps that covered more than one optimizer cycle because the
            cycle was still being learned.
        label: how the loop is named (``"trainer.train()"``).
    """

    framework: str = PLAIN_LOOP
    warmup_steps: int = 0
    measured_steps: int = 0
    stopped_by: str = "still running"
    optimizers: int = 0
    backward_passes_per_step: list[int] = field(default_factory=list)
    grad_scaler: bool = False
    skipped_steps: int = 0
    loop_value: Any = None
    restarts: int = 0
    irregular_steps: int = 0
    label: str = "the loop"

    @property
    def median_backward_passes(self) -> float | None:
        """The median backward passes per measured step, or None when none was measured."""
        passes = self.backward_passes_per_step
        return float(statistics.median(passes)) if passes else None

    def note(self) -> str:
        """One plain sentence for a result's notes on what was measured and how the loop ended."""
        first = self.warmup_steps + 1
        last = first + self.measured_steps - 1
        span = f"step {first}" if self.measured_steps == 1 else f"steps {first}-{last}"
        text = f"{span} of {self.label} measured ({self.warmup_steps} warm-up step"
        text += ("" if self.warmup_steps == 1 else "s") + " skipped)"
        if self.stopped_by == "ran to its end":
            text += "; the loop then ran to its end unmeasured"
        elif self.stopped_by.startswith(("HF", "Lightning")):
            flag = self.stopped_by.split(" ", 1)[1]
            text += f"; the trainer was stopped after them through {flag}"
        elif self.stopped_by != "still running":
            text += "; the loop was stopped after them (nbtoolkit.TrainingStopped at its optimizer step)"
        passes = self.median_backward_passes
        if passes is not None and passes > 1:
            text += f"; {passes:g} backward passes per step (gradient accumulation)"
        if self.skipped_steps:
            text += f"; the GradScaler skipped {self.skipped_steps} optimizer step(s) (inf/NaN gradients)"
        if self.irregular_steps:
            text += (
                f"; {self.irregular_steps} measured step(s) spanned more than one optimizer cycle while "
                "the cycle was learned (ask warmup >= 2)"
            )
        return text + "."


def _label_of(loop: Callable[[], Any]) -> str:
    owner = getattr(loop, "__self__", None)
    name = getattr(loop, "__name__", None) or type(loop).__name__
    if name == "<lambda>":
        return "the training loop"
    if owner is not None:
        return f"{type(owner).__name__.lower()}.{name}()"
    return f"{name}()"


class LoopSteps:
    """A training loop as a zero-argument step: each ``step()`` runs the loop to the end of its next
    optimizer step.

    Args:
        loop: a zero-argument callable that runs the whole loop (``trainer.train``,
            ``lambda: trainer.fit(module)``, a function with a ``for`` loop over the data).
        warmup: steps run unmeasured by :meth:`start` (after the loop's setup).
        after: what :meth:`finish` does: ``"stop"`` the loop cleanly through its framework, or
            ``"continue"`` it to its own end, unmeasured.
        restart: when the loop ends, start it again (a fresh ``trainer.train()``) for the next step;
            its first ``max(warmup, 1)`` steps are warm-up again (call :meth:`reserve` before
            measuring so that no measured step pays for a restart).
        step_time_limit_s: the longest a step may take before it is interrupted (default
            ``NBTOOLKIT_LOOP_STEP_LIMIT`` or 120 s; the first, which runs the loop's setup, gets three
            times as long).
        name: how messages name the loop (default from the callable: ``"trainer.train()"``).
        trainer: the HF / Lightning trainer that runs the loop, when the caller knows it
            (``nbt.train_step`` passes it); otherwise it is found in the loop's frames at its first
            optimizer step.

    Attributes:
        steps_done: ``step()`` calls completed after the warm-up.
        outcome: the :class:`LoopOutcome`, once finished (None before).
        model: the model the loop trains when known (``nbt.train_step`` sets it), else None.
        optimizer / framework / trainer: the lead optimizer, the framework's name and its trainer,
            known once the loop stepped an optimizer.

    Measuring code that calls ``step()`` N times in a row calls :meth:`reserve` (N) first, outside
    its timers. Use as a context manager, or call :meth:`close` (closed on garbage collection too)::

        with LoopSteps(trainer.train, warmup=2) as step:
            nbt.profile(step, steps=3)
        print(step.outcome.note())
    """

    def __init__(
        self,
        loop: Callable[[], Any],
        *,
        warmup: int = 1,
        after: str = "stop",
        restart: bool = False,
        step_time_limit_s: float | None = None,
        name: str | None = None,
        trainer: Any = None,
    ) -> None:
        if not callable(loop):
            raise LoopError(
                f"LoopSteps needs a zero-argument callable that runs the training loop, got "
                f"{type(loop).__name__}: pass e.g. trainer.train or lambda: trainer.fit(module)"
            )
        if after not in ("stop", "continue"):
            raise LoopError(f"after={after!r} is not one of 'stop' or 'continue'")
        if not isinstance(warmup, int) or warmup < 0:
            raise LoopError(f"warmup={warmup!r} must be a whole number >= 0")
        limit = default_step_time_limit() if step_time_limit_s is None else float(step_time_limit_s)
        if limit <= 0:
            raise LoopError(f"step_time_limit_s={step_time_limit_s!r} must be a positive number of seconds")
        label = name or _label_of(loop)
        self.__name__ = label
        self.warmup = warmup
        self.after = after
        self.restart = restart
        self.steps_done = 0
        self.outcome: LoopOutcome | None = None
        self.model: Any = None  # the model the loop trains when known (nbt.train_step sets it)
        self._run = LoopRun(loop, label, limit)
        kind = framework_of(trainer) if trainer is not None else None
        self._run.known = Framework(kind, trainer) if kind is not None else None
        self._record = LoopOutcome(label=label)
        self._started = False
        self._closed = False
        self._asked: int | None = None
        self._finalizer = weakref.finalize(self, close_abandoned, self._run)
        self._finalizer.atexit = False  # at interpreter exit a paused loop is left, not resumed

    # ---- public ----
    @property
    def framework(self) -> str:
        """``"transformers.Trainer"``, ``"lightning Trainer"`` or ``"plain loop"`` (known once started)."""
        found = self._run.framework
        return found.kind if found is not None else PLAIN_LOOP

    @property
    def trainer(self) -> Any:
        """The framework's trainer object running the loop (None for a plain loop or before start)."""
        found = self._run.framework
        return found.trainer if found is not None else None

    @property
    def optimizer(self) -> Any:
        """The lead optimizer (the first one that stepped), None before the loop stepped one."""
        return self._run.lead

    def start(self) -> None:
        """Run the loop's setup and its ``warmup`` steps, unmeasured. Idempotent (``step()`` calls it)."""
        self._check_open()
        if self._started:
            return
        self._run.thread = threading.get_ident()
        self._run.launch()
        self._started = True
        self._warm_up()

    def step(self) -> Any:
        """Run the loop to the end of its next optimizer step (the loop's setup and warm-up first).

        Returns None (a loop gives nothing back per step).

        Raises:
            LoopEndedError: the loop ended before this step (and ``restart`` is off, or a
                restarted loop gave no step).
            LoopError: no optimizer step within the step time limit.
            StepError: the loop raised; the original exception is its ``__cause__``.
        """
        self.start()
        if self._run.glet.dead:
            self._restart_or_fail()
        self._advance(measured=True)
        self.steps_done += 1
        self._record.measured_steps = self.steps_done
        return None

    __call__ = step

    def reserve(self, steps: int) -> None:
        """Make sure the next ``steps`` calls of :meth:`step` run in one run of the loop.

        When the framework says fewer steps are left (``max_steps``) and ``restart`` is on, the loop
        is restarted now, so that no measured step pays for a restart; without ``restart`` a loop that
        cannot give them raises :class:`LoopEndedError` now instead of after some were measured.
        Measuring APIs call it before timing; it does nothing for a loop that cannot tell.
        """
        self.start()
        self._asked = self.steps_done + steps
        found = self._run.framework
        left = found.steps_left() if found is not None and not self._run.glet.dead else None
        if left is None or left >= steps:
            return
        self._stop_loop()  # through the trainer's own flag, as finish() does
        if not self.restart:
            self._fail_ended(f"the trainer has only {left} step(s) left")
        self._restart_or_fail()

    def finish(self) -> LoopOutcome:
        """End the loop (``after="stop"``: stop it cleanly; ``"continue"``: run it to its end,
        unmeasured) and return how it went. Idempotent."""
        if self.outcome is not None:
            return self.outcome
        if self._started and self._run.glet is not None and not self._run.glet.dead:
            if self.after == "continue":
                self._run.mode = "run"
                self._settle(*self._run.resume(), ended_by="ran to its end")
            else:
                self._stop_loop()
        return self._close_record()

    def close(self) -> None:
        """Finish the loop (stopping it) if it still runs; idempotent."""
        if self._closed:
            return
        try:
            if self.outcome is None and self._started and not self._run.glet.dead:
                self.after = "stop"
                self.finish()
        finally:
            self._close_record()

    def __enter__(self) -> LoopSteps:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is None:
            self.finish()
            self.close()
            return
        # an exception in the caller: stop the loop (never continue it) and let the exception go on
        self.after = "stop"
        with contextlib.suppress(NbtError):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._started else "not started")
        return f"<LoopSteps {self.__name__} {state}: {self.steps_done} steps measured>"

    # ---- internals ----
    def _check_open(self) -> None:
        if self._closed:
            raise LoopError(
                f"{self.__name__} was finished; make a new LoopSteps (or nbt.train_step) for more steps"
            )

    def _warm_up(self) -> None:
        for _ in range(self.warmup):
            self._advance(measured=False)
            self._record.warmup_steps += 1
        run = self._run
        if self.warmup and not run.cycle_known and run.others_in_reach:
            # The loop holds other optimizers: one more unmeasured step sees whether they step in
            # its cycle (the lead steps again at its end), so that no measured step learns it.
            self._advance(measured=False)
            self._record.warmup_steps += 1

    def _advance(self, *, measured: bool) -> None:
        """Run to the end of the next step; what the loop sends back decides what happens."""
        kind, value = self._run.resume()
        if kind == "step":
            if measured:
                self._record.backward_passes_per_step.append(self._run.backwards)
                self._record.skipped_steps += int(self._run.skipped_now)
                self._record.irregular_steps += int(self._run.cycle_grew)
            return
        self._settle(kind, value, ended_by="ran to its end")
        if kind in {"returned", "stopped"}:
            if self._run.lead is None:
                self._fail_ended(f"{self.__name__} ended without stepping any optimizer", plain=False)
            if self.restart:
                self._restart_or_fail()
                self._advance(measured=measured)
                return
            self._fail_ended(f"{self.__name__} ended")

    def _settle(self, kind: str, value: Any, *, ended_by: str) -> None:
        """Record how the loop ended; raise what its failure means (and close this LoopSteps)."""
        if kind == "step":  # run mode never pauses; a stop that did not end it is handled by the caller
            return
        if kind == "returned":
            self._record.loop_value = value
            self._record.stopped_by = ended_by
            return
        if kind == "stopped":
            self._record.stopped_by = "nbtoolkit.TrainingStopped raised at the optimizer step"
            return
        self._close_record()
        if kind == "time limit":
            waited = self._run.limit_s
            raise LoopError(
                f"{self.__name__} stepped no optimizer within {waited:g} s, so nbtoolkit stopped it: a "
                "step ends at optimizer.step() (or a GradScaler's update()), so the loop must call it; if "
                "its steps are that slow, raise step_time_limit_s (or NBTOOLKIT_LOOP_STEP_LIMIT)"
            )
        exc = value
        if isinstance(exc, KeyboardInterrupt | NbtError):
            raise exc
        detail = str(exc).rstrip()
        end = "" if detail.endswith((".", "!", "?")) else "."
        raise StepError(
            f"the training loop {self.__name__} raised {type(exc).__name__}: {detail}{end} Run it once on "
            "its own to see the full traceback, fix it and measure again",
            step=self.__name__,
            call=f"step {self._record.warmup_steps + self.steps_done + 1} of the loop",
        ) from exc

    def _restart_or_fail(self) -> None:
        if not self.restart:
            self._fail_ended(f"{self.__name__} ended")
        self._record.restarts += 1
        self._run.launch()
        kind, value = self._run.resume()
        if kind != "step":
            self._settle(kind, value, ended_by="ran to its end")
            self._fail_ended(
                f"{self.__name__} was started again and gave no step: the trainer has no steps left",
                plain=False,
            )
        self._record.warmup_steps += 1
        for _ in range(self.warmup - 1):
            self._advance(measured=False)
            self._record.warmup_steps += 1

    def _stop_loop(self) -> None:
        """Stop the paused loop: through its framework's flag, else by raising TrainingStopped in it."""
        run = self._run
        found = run.framework
        if found is not None and found.request_stop():
            run.mode, run.grace = "stop", 0
            kind, value = run.resume()
            self._settle(kind, value, ended_by=found.stop_flag or "ran to its end")
        else:
            kind, value = run.resume(throw=TrainingStopped)
            self._settle(kind, value, ended_by="ran to its end")

    def _fail_ended(self, what: str, *, plain: bool = True) -> None:
        self._close_record()
        asked = f" of the {self._asked} asked" if self._asked is not None else ""
        found = self._run.framework or Framework(PLAIN_LOOP)
        advice = (
            " Give the loop more steps (the trainer's max_steps / max_epochs, or more data), or ask fewer "
            "steps or warm-up steps"
            if plain
            else " " + found.no_steps_advice()
        )
        raise LoopEndedError(
            f"{what} after {self._record.warmup_steps} warm-up and {self.steps_done} measured step(s)"
            f"{asked}.{advice}",
            measured=self.steps_done,
        )

    def _close_record(self) -> LoopOutcome:
        if self.outcome is None:
            run = self._run
            record = self._record
            record.framework = self.framework
            record.optimizers = max(run.most_optimizers, len(run.seen))
            record.grad_scaler = run.scaler
            if record.stopped_by == "still running" and (run.glet is None or run.glet.dead):
                record.stopped_by = "ran to its end"
            self.outcome = record
        self._closed = True
        self._run.end(throw=True)
        self._finalizer.detach()
        return self.outcome
