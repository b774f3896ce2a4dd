"""Measure what checkpointing each candidate block saves and costs: steps 2-4 of ``nbt.plan_recompute``.

:func:`measure_recompute_costs` runs the step (it trains the model for real) and returns a
:class:`~nbtoolkit.recompute.costs.RecomputeCosts`; the solver
(``nbtoolkit.recompute.solver``) never runs anything. Memory is read through the memory
feature's one walker of torch's memory profiler (``nbtoolkit.memory.profile``),
with markers put in by forward hooks on the blocks; time through the timing rounds of
``nbtoolkit.recompute.recompute_timing`` (how and why costs are timed as they are). The
method is written out in ``nbtoolkit.recompute.planner``.

The model is left as it was (hooks removed, checkpoint wrappers undone), also on errors.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import CaptureError, NbtUsageError
from nbtoolkit.memory.profile import TOTAL_UNKNOWN, MemorySeries, mark
from nbtoolkit.recompute.checkpoint import checkpoint_modules
from nbtoolkit.recompute.costs import RecomputeCosts
from nbtoolkit.recompute.measure import profile_memory_series, run_step
from nbtoolkit.recompute.recompute_timing import (
    MAX_ROUNDS,
    BlockCosts,
    Rounds,
    Stopwatch,
    block_costs,
    identical_groups,
    time_recompute,
)

if TYPE_CHECKING:
    import torch

    from nbtoolkit.recompute.blocks import Candidates

__all__ = ["measure_recompute_costs", "measurement_runs"]


class _BlockProbe:
    """Forward hooks on the candidate blocks: forward times, input signatures, profiler markers.

    Markers: ``fwd_end:i`` when block i's forward returns, ``bwd_start:i`` when the gradient
    of its output is computed (its backward is about to run). Only the first call of a block
    per step counts. ``inputs[i]``: the shapes and dtypes block i was first called with (which
    blocks are alike). Module hooks only (never global ones); ``remove()`` takes them all off.
    """

    def __init__(self, blocks: Sequence[torch.nn.Module], stopwatch: Stopwatch) -> None:
        self.blocks = list(blocks)
        self.stopwatch = stopwatch
        self.handles: list[Any] = []
        self.inputs: list[Any] = [None] * len(self.blocks)
        self._marks: list[Any | None] = [None] * len(self.blocks)
        self._start: dict[int, Any] = {}
        self._seen: set[int] = set()
        self.recording_times = False
        for index, block in enumerate(self.blocks):
            self.handles.append(block.register_forward_pre_hook(self._pre(index), with_kwargs=True))
            self.handles.append(block.register_forward_hook(self._post(index)))

    def new_step(self) -> None:
        self._seen.clear()
        self._start.clear()

    def forward_marks(self, recording: bool) -> list[Any | None]:
        """Start recording forward times for the next step (True); or stop and return the
        stopwatch mark of each block's first forward in the step just run (False)."""
        marks, self._marks = self._marks, [None] * len(self.blocks)
        self.new_step()
        self.recording_times = recording
        return marks

    def _pre(self, index: int) -> Callable[..., None]:
        def hook(module: Any, args: Any, kwargs: Any) -> None:
            if self.inputs[index] is None:
                self.inputs[index] = _signature(args, kwargs)
            if index not in self._seen and self.recording_times:
                self._start[index] = self.stopwatch.start()

        return hook

    def _post(self, index: int) -> Callable[..., None]:
        import torch

        def hook(module: Any, args: Any, output: Any) -> None:
            if index in self._seen:
                return
            self._seen.add(index)
            if self.recording_times and index in self._start:
                self._marks[index] = self.stopwatch.stop(self._start[index])
            mark(f"fwd_end:{index}")
            tensors = [t for t in _flatten(output) if isinstance(t, torch.Tensor) and t.requires_grad]
            if tensors:
                fired = [False]

                def on_grad(grad: Any) -> None:
                    if not fired[0]:
                        fired[0] = True
                        mark(f"bwd_start:{index}")

                for t in tensors:
                    t.register_hook(on_grad)

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def _signature(args: Any, kwargs: Any) -> tuple[Any, ...]:
    """What a call's inputs look like, for telling alike blocks: tensors by shape, dtype and
    whether they need grad, anything else by its type."""
    import torch

    def describe(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), str(value.dtype), bool(value.requires_grad))
        if isinstance(value, (list, tuple)):
            return tuple(describe(v) for v in value)
        return type(value).__name__

    return (describe(tuple(args)), tuple(sorted((k, describe(v)) for k, v in dict(kwargs).items())))


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _flatten(item)]
    if isinstance(value, dict):
        return [x for item in value.values() for x in _flatten(item)]
    return [value]


def phases(series: MemorySeries, n: int) -> tuple[list[int], list[frozenset[int]]]:
    """(P_p, A_p) per phase: the max live total per distinct set of alive blocks (step 3).

    Block i is alive from its ``fwd_end:i`` marker to its ``bwd_start:i`` marker; phases are
    ordered by falling level.
    """
    windows = [(series.marks.get(f"fwd_end:{i}"), series.marks.get(f"bwd_start:{i}")) for i in range(n)]
    levels: dict[frozenset[int], int] = {}
    for t, level in zip(series.times_ns, series.levels, strict=True):
        alive = frozenset(
            i for i, (start, end) in enumerate(windows)
            if start is not None and end is not None and start <= t < end
        )
        if level > levels.get(alive, -1):
            levels[alive] = level
    order = sorted(levels, key=lambda a: (-levels[a], sorted(a)))
    return [levels[a] for a in order], order


def measurement_runs(n_blocks: int, steps: int) -> int:
    """How many step runs :func:`measure_recompute_costs` counts in its ticks (for progress bars):
    timing rounds beyond the first ``steps`` (while the spread is large) are not counted."""
    return 1 + 2 * steps + 1 + n_blocks


def measure_recompute_costs(
    step: Callable[[], Any],
    candidates: Candidates,
    *,
    device: torch.device | None,
    steps: int,
    tick: Callable[[str], None],
    total: bool = True,
    time_limit_s: float | None = None,
    pool: bool = True,
    warm: bool = True,
) -> RecomputeCosts:
    """Steps 2-4 for the candidate blocks; ``tick(what)`` after each counted run. ``device``: the
    GPU the model is on, None on the CPU (the memory profiler's ``device=``; on the CPU times
    are the calling thread's processor time, see ``nbtoolkit.recompute.recompute_timing``).

    ``total``: the device's total peak is needed (a budget of it); a CaptureError says so when
    it cannot be measured. ``steps``: timing rounds at least; more while the estimates are
    imprecise, for up to ``time_limit_s`` seconds more (None: ``recompute_timing.TIME_LIMIT_S``).
    ``pool``: identical blocks share one pooled cost (``recompute_timing``'s docstring says
    why); False costs each block on its own. ``warm``: run (and tick) the warm-up step here; False
    when the caller ran it already (the planner does, to see the model as the user's loop sets it up).
    """
    names = candidates.names
    blocks = list(candidates.blocks.values())
    n = len(names)
    stopwatch = Stopwatch(device)
    probe = _BlockProbe(blocks, stopwatch)
    try:
        if warm:
            run_step(step, "warm-up step")  # optimizer state, lazy buffers
            tick("warm-up step")
        rounds = time_recompute(
            candidates, step, stopwatch, forward_marks=probe.forward_marks, steps=steps,
            time_limit_s=time_limit_s, tick=tick,
        )
        probe.new_step()
        # the baseline is also measured whole (categories and the device's total), for budgets
        # of the device's total peak and for saying what of it no recomputation changes
        baseline, by_category, _ = profile_memory_series(step, categories=True, total=True, device=device)
        tick("profiled baseline step")
        if total and baseline.total_peak_bytes is None:
            raise CaptureError(
                f"{TOTAL_UNKNOWN}: budget the step's own memory instead (step_budget_bytes=...)"
            )
        never = [names[i] for i in range(n) if f"fwd_end:{i}" not in baseline.marks]
        if never:
            raise NbtUsageError(
                f"block(s) {', '.join(never)} did not run during the step: name blocks the step uses"
            )
        saved = _savings(candidates, step, probe, baseline, device=device, tick=tick)
    finally:
        probe.remove()
    groups = identical_groups(blocks, probe.inputs)
    costs = block_costs(rounds, groups, pool=pool)
    levels, alive = phases(baseline, n)
    notes = _timing_notes(rounds, costs, candidates, stopwatch)
    no_grad = [names[i] for i in range(n) if f"bwd_start:{i}" not in baseline.marks]
    if no_grad:
        notes.append(f"no gradient flows through {', '.join(no_grad)}: checkpointing them saves nothing")
        saved = [0 if names[i] in no_grad else s for i, s in enumerate(saved)]
    useless = [names[i] for i in range(n) if saved[i] == 0 and names[i] not in no_grad]
    if useless:
        notes.append(f"checkpointing {', '.join(useless)} measured no saving")
    return RecomputeCosts(
        blocks=tuple(names),
        modules=tuple(type(b).__name__ for b in blocks),
        saved_bytes=tuple(saved),
        recompute_time_s=tuple(costs.cost_s),
        recompute_time_p25_s=tuple(costs.p25_s),
        recompute_time_p75_s=tuple(costs.p75_s),
        forward_time_s=tuple(statistics.median(t) if t else 0.0 for t in rounds.forward_s),
        phase_bytes=tuple(levels),
        phase_alive=tuple(frozenset(names[i] for i in a) for a in alive),
        baseline_peak_bytes=baseline.peak_bytes,
        baseline_step_time_s=statistics.median(rounds.plain_s),
        notes=tuple(notes),
        fixed_bytes=baseline.outside_bytes or 0,
        # what no recomputation changes: parameters, optimizer state and inputs at the peak, gradients
        fixed_by_category={
            **{ours: int(by_category[torch_name]) for torch_name, ours in _FIXED_CATEGORIES.items()
               if by_category.get(torch_name)},
            "gradient": candidates.gradient_bytes,
        },
        timing=_timing_numbers(rounds, costs),
    )


#: torch's memory categories (at the baseline's peak) that are held whatever is recomputed.
_FIXED_CATEGORIES = {"PARAMETER": "parameter", "OPTIMIZER_STATE": "optimizer_state", "INPUT": "input"}


def _timing_numbers(rounds: Rounds, costs: BlockCosts) -> dict[str, float]:
    numbers = {
        "rounds": float(len(rounds.plain_s)), "seconds": rounds.seconds, "precise": float(rounds.precise),
    }
    if costs.factor is not None:
        names = ("overhead_factor_p25", "overhead_factor", "overhead_factor_p75")
        numbers |= dict(zip(names, costs.factor, strict=True))
    return numbers


def _timing_notes(rounds: Rounds, costs: BlockCosts, blocks: Candidates, stopwatch: Stopwatch) -> list[str]:
    """What the reader of the plan should know about how its time costs were measured."""
    names = blocks.names
    modules = [type(b).__name__ for b in blocks.blocks.values()]
    count = len(rounds.plain_s)
    if costs.factor is None:
        return [
            (f"no candidate was re-run during backward in {count} timing rounds (no gradient flows "
             "through them?): their time costs are 0"),
        ]
    low, factor, high = costs.factor
    notes = [
        (f"time costs: each block's forward as re-run during backward, times the overhead factor "
         f"{factor:.2f} (p25-p75 {low:.2f}-{high:.2f}): the step-time increase with all {len(names)} "
         f"candidates checkpointed over their re-run time; median of {count} interleaved rounds, "
         f"timed by {stopwatch.clock}"),
    ]
    notes.extend(
        f"{len(group)} identical {modules[group[0]]} blocks ({names[group[0]]} ... {names[group[-1]]}: "
        "same class, parameter and input shapes) share one cost, pooled from all their timings"
        for group in costs.groups
    )
    if rounds.precise or count >= MAX_ROUNDS:
        return notes
    if rounds.lockstep:
        notes.append(
            f"timing ran {count} rounds, as every rank must run the same steps, and the spread is "
            "still large: the time costs are uncertain (more steps=... would narrow it)"
        )
    else:
        notes.append(
            f"timing stopped at its {rounds.limit_s:g} s limit with the spread still large (a busy "
            "machine?): the time costs are uncertain"
        )
    return notes


def _savings(
    candidates: Candidates,
    step: Callable[[], Any],
    probe: _BlockProbe,
    baseline: MemorySeries,
    *,
    device: torch.device | None,
    tick: Callable[[str], None],
) -> list[int]:
    """Per block, the live bytes at the last block's forward end that checkpointing it removes (step 4)."""
    names = candidates.names
    last = max(range(len(names)), key=lambda i: baseline.marks[f"fwd_end:{i}"])
    reference = baseline.level_at(baseline.marks[f"fwd_end:{last}"])
    saved = []
    for name in names:
        applied = checkpoint_modules({name: candidates.blocks[name]})
        try:
            probe.new_step()
            series, _, _ = profile_memory_series(step, device=device)
        finally:
            applied.undo()
        tick(f"profiled step with {name} checkpointed")
        end_mark = series.marks.get(f"fwd_end:{last}")
        saved.append(max(0, reference - series.level_at(end_mark)) if end_mark is not None else 0)
    return saved
