"""``loop=True`` of the measuring APIs: measure steps of a whole training loop.

``nbt.profile``, ``nbt.memory_timeline``, ``nbt.capture_graphs`` and ``nbt.step_metrics`` take a
zero-argument step function; with ``loop=True`` they take the code that runs a whole training
(``lambda: trainer.train()``, ``lambda: trainer.fit(module, datamodule)``, a plain loop) instead.
:func:`measure_loop` is the one place that does it, for all four:

1. the loop runs in :class:`~nbtoolkit.core.training_loop.LoopSteps`, paused at each optimizer
   step (a step is what happens between two optimizer steps); its setup and the warm-up steps
   run unmeasured (``LoopSteps.start``);
2. the API measures ``step`` (one call = the loop run to the end of its next training step)
   exactly as it measures a step function, with no warm-up of its own;
3. the loop is finished: stopped through the framework's own mechanism (``after="stop"``), or
   left to run to its end unmeasured (``after="continue"``); the
   :class:`~nbtoolkit.core.training_loop.LoopOutcome` goes onto the result as ``result.loop``
   and its one-sentence account into ``result.notes``.

Every call of the step consumes one training step of the loop, so an API that calls its step
more than its measured steps (a FLOP-counted call, capture_graphs' profiled calls) needs a
loop with that many more: ``needs`` names them in the error of a loop that ends too soon.
An exception while measuring stops the loop (LoopSteps' context manager) and propagates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from nbtoolkit.core.errors import NbtUsageError

__all__ = ["AFTER_CHOICES", "LoopResult", "begin", "check_after", "measure_loop"]

#: what happens to the loop once its steps are measured: stopped, or run on to its end unmeasured
AFTER_CHOICES = ("stop", "continue")


class LoopResult(Protocol):
    """What the four APIs return: a result with notes and a ``loop`` attribute."""

    notes: list[str]
    loop: Any


R = TypeVar("R", bound=LoopResult)


def check_after(after: Any) -> str:
    """``after`` as given, when it is one of :data:`AFTER_CHOICES`; else one usage error."""
    if not isinstance(after, str) or after not in AFTER_CHOICES:
        raise NbtUsageError(
            f"after={after!r}: pass after='stop' (stop the training loop once its steps are measured) "
            "or after='continue' (let it run on to its end, unmeasured)"
        )
    return after


def measure_loop(
    loop: Any,
    measure: Callable[[Any], R],
    *,
    api: str,
    warmup: int,
    after: Any,
    needs: int,
    start: bool = True,
) -> R:
    """Run ``measure(steps)`` on the training steps of ``loop``; attach the loop's outcome.

    Args:
        loop: the zero-argument callable that runs the whole training.
        measure: measures ``steps.step`` (it may call ``steps.start`` itself, see ``start``) and
            returns the API's result.
        api: how errors name the caller (``"nbt.profile"``).
        warmup: the API's warm-up steps; the loop runs at least one (optimizer state and lazy
            initialisation land in the first step), unmeasured.
        after: ``"stop"`` or ``"continue"``.
        needs: training steps ``measure`` calls after the warm-up, for the error of a loop that
            ends before them.
        start: run the loop's setup and warm-up before ``measure`` (False: ``measure`` calls
            :func:`begin` where it wants them, e.g. capture_graphs' compiling first call).

    Raises:
        NbtUsageError: ``loop`` is not callable, or ``after`` is not one of the choices.
        LoopEndedError: the loop ended before the steps asked (how many were measured, and what
            to change).
        LoopError: the loop stepped no optimizer within the step time limit
            (``NBTOOLKIT_LOOP_STEP_LIMIT``); StepError: the loop raised (as LoopSteps raises them).
    """
    from nbtoolkit.core.errors import LoopEndedError
    from nbtoolkit.core.training_loop import LoopSteps

    after = check_after(after)
    if not callable(loop):
        raise NbtUsageError(
            f"{api}(loop=True) needs the training loop as a zero-argument callable, e.g. "
            f"lambda: trainer.train(), got {type(loop).__name__}"
        )
    warm = max(1, warmup)
    # a lambda or a magic's cell has no name worth showing; LoopSteps names the others
    # ("trainer.train()")
    anonymous = not str(getattr(loop, "__name__", "")).isidentifier()
    name = "the training loop" if anonymous else None
    with LoopSteps(loop, warmup=warm, after=after, name=name) as steps:
        try:
            if start:
                begin(steps, needs)
            result = measure(steps)
        except LoopEndedError as exc:
            raise LoopEndedError(
                f"{api}(loop=True) needs {warm} warm-up and {needs} more training steps, but "
                f"{steps.__name__} ended after {exc.measured} of them: give the loop more steps (the "
                "trainer's max_steps / max_epochs, or more data) or ask for fewer (steps=)",
                measured=exc.measured,
            ) from exc
        outcome = steps.finish()
    result.loop = outcome
    result.notes.append(outcome.note())
    return result


def begin(steps: Any, needs: int) -> None:
    """The loop's setup and warm-up steps, then a check that ``needs`` more steps are there: a
    trainer that knows its steps left fails now, before any step is measured."""
    steps.start()
    steps.reserve(needs)
