"""Measure a step before and after a change to its model, the two configurations interleaved.

``nbt.optimize`` used to measure "before", apply the change, then measure "after": a change
in machine load between the two became the result. Here (the statistics are in
:mod:`nbtoolkit.core.interleaved`):

1. **Warm-up of each side.** The unchanged model's warm-up steps run first; the change is
   applied (and planned, for automatic recomputation) and the changed model's warm-up steps
   run, torch.compile compiling there. A compiled side gets at least one warm-up step, so
   compilation never lands in a timed step.
2. **Interleaved rounds.** The model's ``forward`` attributes are captured in both states
   (:class:`~nbtoolkit.recompute.handle.ForwardStates`, with the library checkpointing flags a
   plan turns off) and switched before every step, so before and after alternate step by step
   under the same load and the same warm state: the before side runs as the user runs it
   (Hugging Face's own checkpointing included), the after side as changed.
   Switching sets attributes only: the compiled forward stays the same object and nothing
   recompiles. Rounds continue while the answer is unclear, up to ``time_limit_s``.
3. **FLOPs and memory of each side**: one FLOP-counted and one memory-profiled step each
   (``nbtoolkit.recompute.measure.add_flops_and_memory``); deterministic, so not interleaved.

Graphs compiled during the timed rounds (a recompile) are counted and said in a note: those
steps include compile time. Progress is reported by stage: ``warming up``, ``compiling``,
``measuring``, ``FLOPs`` and ``memory`` (the planning stage is ``nbt.optimize``'s).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtoolkit.core.interleaved import InterleavedTiming, time_interleaved
from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.core.step_runner import step_name, timed_call
from nbtoolkit.recompute.comparison import Measurement
from nbtoolkit.recompute.framework_checkpointing import CHECKPOINTING_FLAGS
from nbtoolkit.recompute.handle import ForwardStates
from nbtoolkit.recompute.measure import (
    Progress,
    add_compile_counts,
    add_flops_and_memory,
    dynamo_counts,
    timed_measurement,
)

__all__ = ["PairedMeasure", "StageProgress"]


class StageProgress:
    """``progress(done, total, "stage: what")`` over a whole optimize call, whose total grows when
    the interleaved rounds do."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done = 0

    def tick(self, stage: str, what: str, runs: int = 1) -> None:
        self.done += runs
        self.total = max(self.total, self.done)
        if self.progress is not None:
            self.progress(self.done, self.total, f"{stage}: {what}")

    def grow(self, extra: int) -> None:
        self.total += max(0, extra)


class PairedMeasure:
    """The two sides of one comparison of ``step``, measured as the module docstring says."""

    def __init__(
        self,
        step: Callable[[], Any],
        config: MeasureConfig,
        stages: StageProgress,
        restore_weights: Callable[[], None] = lambda: None,
    ) -> None:
        self.step = step
        self.restore_weights = restore_weights
        self.config = config
        self.stages = stages
        self.name = step_name(step)
        self.values: dict[str, list[Any]] = {"before": [], "after": []}
        self.warm_times: dict[str, list[float]] = {"before": [], "after": []}
        self.compiled = False
        self._counts_before_compile: tuple[int, dict[str, int]] = (0, {})
        self._counts_after_warmup: tuple[int, dict[str, int]] = (0, {})
        self.recompiled_graphs = 0
        self.before_state: ForwardStates | None = None
        self.after_state: ForwardStates | None = None

    def _timed_call(self, side: str, what: str) -> tuple[float, float]:
        """One step of ``side``, bracketed by device synchronisation: (wall, processor) seconds."""
        sync = self.config.synchronize
        wall, cpu, value = timed_call(self.step, what, name=self.name, synchronize_device=sync)
        self.values[side].append(value)
        return wall, cpu

    def warm_before(self, model: Any) -> None:
        """The unchanged model's warm-up steps; captures its ``forward`` state and checkpointing flags
        after them (a training loop as the step sets its model up in its first step: a Trainer with
        gradient_checkpointing=True turns the model's own checkpointing on there)."""
        for index in range(self.config.warmup):
            what = f"warm-up step {index + 1} of {self.config.warmup} (before the change)"
            self.warm_times["before"].append(self._timed_call("before", what)[0])
            self.stages.tick("warming up", what)
        self.before_state = ForwardStates(model, also=tuple(CHECKPOINTING_FLAGS))

    def warm_after(self, model: Any, *, compiled: bool) -> None:
        """The changed model's warm-up steps (at least one when ``compiled``); captures its state."""
        self.after_state = ForwardStates(model, also=tuple(CHECKPOINTING_FLAGS))
        self.compiled = compiled
        if compiled:
            self._counts_before_compile = dynamo_counts()
        count = max(self.config.warmup, 1 if compiled else 0)
        for index in range(count):
            what = f"warm-up step {index + 1} of {count} (after the change)"
            stage = "warming up"
            if compiled and index == 0:
                stage, what = "compiling", what + " (torch.compile compiles the model's forward on this call)"
            self.warm_times["after"].append(self._timed_call("after", what)[0])
            self.stages.tick(stage, what)
        if compiled:
            self._counts_after_warmup = dynamo_counts()

    def _switch(self, side: str) -> None:
        state = self.before_state if side == "before" else self.after_state
        assert state is not None, "warm_before() and warm_after() capture the states first"
        state.restore()

    def rounds(self) -> InterleavedTiming:
        """Before and after interleaved until clear (``config.steps`` rounds at least)."""
        if self.config.warmup > 0:
            # the after side ran last (and may have compiled): one untimed step brings the
            # before side's caches back, so its first timed step is not the odd one out
            self._switch("before")
            self._timed_call("before", "warm-up step (before the change) once the change was applied")
            self.values["before"].pop()
            self.stages.tick("warming up", "before, once more after the change was applied")
        planned = self.config.steps

        def run(side: str) -> Callable[[], tuple[float, float]]:
            def one() -> tuple[float, float]:
                self._switch(side)
                if not self.values[side]:
                    # no warm-up on this side: its first step starts from the weights the other
                    # side's first step did, so the two first losses show whether the change
                    # alters what the step computes
                    self.restore_weights()
                return self._timed_call(side, f"timed step {len(self.values[side]) + 1} ({side} the change)")

            return one

        def on_round(done: int, expected: int) -> None:
            nonlocal planned
            if expected > planned:
                self.stages.grow(2 * (expected - planned))
                planned = expected
            self.stages.tick("measuring", f"round {done} of {planned}, before and after interleaved", runs=2)

        timing = time_interleaved(
            run("before"), run("after"), labels=("before", "after"), min_rounds=self.config.steps,
            time_limit_s=self.config.time_limit_s, on_round=on_round,
        )
        if self.compiled:
            self.recompiled_graphs = dynamo_counts()[0] - self._counts_after_warmup[0]
        self._switch("after")
        return timing

    def measurement(self, side: str, timing: InterleavedTiming, applied: dict[str, Any]) -> Measurement:
        """One side's :class:`Measurement`: its interleaved timed steps, FLOPs and memory."""
        measurement = timed_measurement(
            side, times=timing.times_s[side], cpu_times=timing.cpu_times_s[side],
            warm_times=self.warm_times[side], values=self.values[side], applied=applied,
        )
        self.values[side].clear()
        if side == "after" and self.compiled:
            add_compile_counts(measurement, self._counts_before_compile, self._counts_after_warmup)
        self._switch(side)
        try:
            add_flops_and_memory(
                measurement, self.step, self.config, lambda what: self._extra_tick(what, side)
            )
        finally:
            self._switch("after")  # the changes' undo expects the changed model
        return measurement

    def _extra_tick(self, what: str, side: str) -> None:
        self.stages.tick("FLOPs" if what.startswith("FLOP") else "memory", f"{side}, {what}")

    def notes(self) -> list[str]:
        """What the reader should know about the timing itself."""
        if self.recompiled_graphs > 0:
            return [(
                f"torch.compile compiled {self.recompiled_graphs} more graph(s) during the timed steps "
                "(a recompile, e.g. a guard failed on a changed shape or Python value): those steps "
                "include compile time; run nbt.capture_graphs(step) to see which guard failed"
            )]
        return []
