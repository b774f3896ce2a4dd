"""Measure what checkpointing each candidate block saves and costs: steps 2-4 of ``nbt.plan_recompute``.

:func:`measure_recompute_costs` runs the step (it trains the model for real) and returns a
:class:`~nbtoolkit.recompute.costs.RecomputeCosts`; the solver
(``nbtoolkit.recompute.solver``) never runs anything. Memory is read through the memory
feature's one walker of torch's memory profiler (``nbtoolkit.memory.profile``),
with markers put in by forward hooks on the blocks. The method is written out in
``nbtoolkit.recompute.planner``.

The model is left as it was (hooks removed, checkpoint wrappers undone), also on errors.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import CaptureError, NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.core.step_runner import run_steps
from nbtoolkit.memory.profile import TOTAL_UNKNOWN, MemorySeries, mark
from nbtoolkit.recompute.checkpoint import checkpoint_modules
from nbtoolkit.recompute.costs import RecomputeCosts
from nbtoolkit.recompute.measure import profile_memory_series, run_step

if TYPE_CHECKING:
    import torch

    from nbtoolkit.recompute.blocks import Candidates

__all__ = ["measure_recompute_costs", "measurement_runs"]


class _BlockProbe:
    """Forward hooks on the candidate blocks: forward times and profiler markers.

    Markers: ``fwd_end:i`` when block i's forward returns, ``bwd_start:i`` when the gradient
    of its output is computed (its backward is about to run). Only the first call of a block
    per step counts. Module hooks only (never global ones); ``remove()`` takes them all off.
    """

    def __init__(self, blocks: Sequence[torch.nn.Module]) -> None:
        self.blocks = list(blocks)
        self.handles: list[Any] = []
        self.forward_times: list[list[float]] = [[] for _ in self.blocks]
        self._start: dict[int, float] = {}
        self._seen: set[int] = set()
        self.recording_times = True
        for index, block in enumerate(self.blocks):
            self.handles.append(block.register_forward_pre_hook(self._pre(index)))
            self.handles.append(block.register_forward_hook(self._post(index)))

    def new_step(self) -> None:
        self._seen.clear()
        self._start.clear()

    def _pre(self, index: int) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            if index not in self._seen:
                self._start[index] = time.perf_counter()

        return hook

    def _post(self, index: int) -> Callable[..., None]:
        import torch

        def hook(module: Any, args: Any, output: Any) -> None:
            if index in self._seen:
                return
            self._seen.add(index)
            if self.recording_times and index in self._start:
                self.forward_times[index].append(time.perf_counter() - self._start[index])
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


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _flatten(item)]
    if isinstance(value, dict):
        return [x for item in value.values() for x in _flatten(item)]
    return [value]


#: One timed call, no warm-up: the rounds interleave configurations, so each is timed alone.
_ONE_STEP = MeasureConfig(steps=1, warmup=0)


def _timed(step: Callable[[], Any], *, cpu: bool) -> float:
    """Seconds one step takes: processor time (``time.process_time``) if ``cpu``, else wall time."""
    run = run_steps(step, _ONE_STEP)
    return run.cpu_times_s[0] if cpu else run.times_s[0]


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
    """How many step runs :func:`measure_recompute_costs` makes (for progress bars)."""
    return 1 + steps * (n_blocks + 1) + 1 + n_blocks


def measure_recompute_costs(
    step: Callable[[], Any],
    candidates: Candidates,
    *,
    device: torch.device | None,
    steps: int,
    tick: Callable[[str], None],
    total: bool = True,
) -> RecomputeCosts:
    """Steps 2-4 for the candidate blocks; ``tick(what)`` after each run. ``device``: the GPU the
    model is on, None on the CPU (the memory profiler's ``device=``; on the CPU a step's cost is
    its processor time).

    ``total``: the device's total peak is needed (a budget of it); a CaptureError says so when
    it cannot be measured.
    """
    names = candidates.names
    blocks = list(candidates.blocks.values())
    n = len(names)
    probe = _BlockProbe(blocks)
    try:
        probe.recording_times = False
        run_step(step, "warm-up step")  # optimizer state, lazy buffers
        tick("warm-up step")
        step_times, cost = _recompute_times(
            candidates, step, probe, steps=steps, cpu=device is None, tick=tick
        )
        forward = [min(t) if t else 0.0 for t in probe.forward_times]
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
    levels, alive = phases(baseline, n)
    notes: list[str] = []
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
        recompute_time_s=tuple(cost),
        forward_time_s=tuple(forward),
        phase_bytes=tuple(levels),
        phase_alive=tuple(frozenset(names[i] for i in a) for a in alive),
        baseline_peak_bytes=baseline.peak_bytes,
        baseline_step_time_s=statistics.median(step_times),
        notes=tuple(notes),
        fixed_bytes=baseline.outside_bytes or 0,
        # what no recomputation changes: parameters, optimizer state and inputs at the peak, gradients
        fixed_by_category={
            **{ours: int(by_category[torch_name]) for torch_name, ours in _FIXED_CATEGORIES.items()
               if by_category.get(torch_name)},
            "gradient": candidates.gradient_bytes,
        },
    )


#: torch's memory categories (at the baseline's peak) that are held whatever is recomputed.
_FIXED_CATEGORIES = {"PARAMETER": "parameter", "OPTIMIZER_STATE": "optimizer_state", "INPUT": "input"}


def _recompute_times(
    candidates: Candidates,
    step: Callable[[], Any],
    probe: _BlockProbe,
    *,
    steps: int,
    cpu: bool,
    tick: Callable[[str], None],
) -> tuple[list[float], list[float]]:
    """(plain step times, per block the step-time increase when only it is checkpointed) (step 2)."""
    # on the CPU the step's cost is its processor time, which a busy machine does not inflate
    # (wall time there is mostly waiting for a core); on a GPU it is wall time
    cpu_clock = cpu
    names = candidates.names
    step_times: list[float] = []
    with_block: list[list[float]] = [[] for _ in names]
    for _ in range(steps):
        # one round: a plain step, then one step with each block checkpointed alone;
        # interleaving lets load from other processes hit every configuration alike
        probe.recording_times = True
        probe.new_step()
        step_times.append(_timed(step, cpu=cpu_clock))
        probe.recording_times = False
        tick("timed step")
        for i, name in enumerate(names):
            applied = checkpoint_modules({name: candidates.blocks[name]})
            try:
                probe.new_step()
                with_block[i].append(_timed(step, cpu=cpu_clock))
            finally:
                applied.undo()
            tick(f"timed step with {name} checkpointed")
    # fastest of the rounds: load from other processes only ever adds time, so the
    # minimum is each configuration's own cost (timeit's reasoning)
    fastest = min(step_times)
    return step_times, [max(0.0, min(times) - fastest) for times in with_block]


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
