"""Choose which blocks to recompute (activation checkpointing) under a memory budget.

Algorithm of :func:`plan_recompute`, every number measured on the machine at hand:

1. **Candidates.** The blocks you name, or by default the repeated blocks of the model:
   among every module's direct children, the groups of two or more non-leaf children of
   the same class (the layers of a ``ModuleList``/``Sequential``, a transformer's blocks);
   the group holding the most parameters wins.
2. **Recompute time.** One warm-up step (so optimizer state exists), then ``steps`` rounds:
   each round times one plain step and one step with each candidate checkpointed alone,
   interleaved so that load from other processes hits every configuration alike. The cost
   of block ``i`` is ``t_i = max(0, fastest step with i checkpointed - fastest plain step)``
   (processor time from ``time.process_time`` when the model is on the CPU, which waiting
   for a busy machine's cores does not inflate; wall time otherwise):
   the measured price of its recomputation *and* of the checkpoint machinery, net of what
   checkpointing gives back (on the CPU, freeing activations early can make the allocator
   cheaper, so a block's forward time alone overstates its cost; it is reported as
   ``forward_time_s`` for reference). The fastest run is used because load only adds time.
3. **Memory over time.** One step under ``torch.profiler(profile_memory=True)``: the
   allocator's running total ``L(t)`` after every allocation and free, and markers for the
   end of each block's forward and the start of its backward (a hook on the gradient of the
   block's output). Block ``i`` is *alive* from its forward's end to its backward's start:
   that is when checkpointing it holds less memory. The step splits into *phases*, stretches
   with one alive set ``A_p``; ``P_p`` is the highest ``L(t)`` measured in phase ``p``.
4. **Savings.** For each candidate alone: checkpoint it, run one profiled step, and read the
   live total at the end of the last block's forward (all blocks alive there).
   ``s_i = L_baseline - L_checkpointed(i)``: the bytes of activations the block no longer
   keeps, net of the inputs the checkpoint keeps instead. Memory is deterministic, so one
   run each is enough.
5. **Model.** Checkpointing a set S gives the peak ``max_p (P_p - sum_{i in S ∩ A_p} s_i)``: each
   phase keeps its measured level minus the savings of the checkpointed blocks alive in it.
   During a checkpointed block's own backward its activations are rebuilt, which the model
   covers because the block is not alive there. The peak is *not* the baseline peak minus
   the sum of savings: a block saves nothing in phases where it is not alive, and the peak
   can move to another phase (the backward of the first blocks, the optimizer step).
6. **Solver: an exact integer linear program** (PuLP with the CBC solver it ships):
   binary ``x_i``; minimise ``sum t_i x_i``; subject to, for every phase with ``P_p > budget``,
   ``sum_{i in A_p} s_i x_i >= P_p - budget``. An ILP rather than dynamic programming because
   the savings are byte counts (a DP over them needs rounding to a grid, which loses
   exactness or explodes the table), and because the alive sets need not be nested prefixes
   (blocks named by the user may run in any order): the ILP takes any phase structure as is.
   With a few dozen candidates CBC answers in milliseconds.
7. **Trade-off front.** Solving again with the budget just below the last plan's predicted
   peak walks the exact Pareto front, from no checkpointing to the lowest reachable peak.
8. **Verification** (``verify=True``). The chosen plan is applied and one profiled step
   measures its real peak. If that is above the budget (a block's rebuilt activations can
   overlap with others' in ways the model rounds away), the plan is re-solved with the
   budget lowered by the overshoot, up to three times, and the measured peak is recorded.

The model is left as it was (hooks removed, checkpoint wrappers undone) also on errors.
Steps run for real: the optimizer updates the weights, as in your training loop.

Never uses ``torch.distributed._tools``' SACEstimator: it needs CUDA and aborts the
process on a CPU-only machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.errors import NbtUsageError, PlanError
from nbtoolkit.model.plan import RecomputePlan
from nbtoolkit.optimizations.checkpoint import check_module, checkpoint_blocks, resolve_blocks
from nbtoolkit.optimizations.measure import (
    MemorySeries,
    Progress,
    check_step,
    mark,
    profile_memory_series,
    run_step,
)
from nbtoolkit.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    import torch

__all__ = ["find_repeated_blocks", "parse_bytes", "plan_recompute", "solve_plan"]

def find_repeated_blocks(model: torch.nn.Module) -> list[str]:
    """Names of the model's repeated blocks (step 1 of the module docstring), in model order."""
    best: tuple[int, int, list[str]] | None = None
    for parent_name, parent in model.named_modules():
        groups: dict[type, list[tuple[str, Any]]] = {}
        for child_name, child in parent.named_children():
            if next(child.children(), None) is None:  # leaf modules (Linear, LayerNorm) are not blocks
                continue
            groups.setdefault(type(child), []).append((child_name, child))
        for members in groups.values():
            if len(members) < 2:
                continue
            params = sum(p.numel() for _, child in members for p in child.parameters())
            names = [f"{parent_name}.{n}" if parent_name else n for n, _ in members]
            key = (params, len(names))
            if best is None or key > best[:2]:
                best = (params, len(names), names)
    return best[2] if best else []


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


def _timed(step: Callable[[], Any], *, cpu: bool) -> float:
    """Seconds one step takes: processor time (``time.process_time``) if ``cpu``, else wall time."""
    clock = time.process_time if cpu else time.perf_counter
    start = clock()
    run_step(step)
    return clock() - start


def _phases(series: MemorySeries, n: int) -> tuple[list[int], list[frozenset[int]]]:
    """(P_p, A_p) per phase: the max live total per distinct alive set (step 3)."""
    windows = []
    for i in range(n):
        start = series.marks.get(f"fwd_end:{i}")
        end = series.marks.get(f"bwd_start:{i}")
        windows.append((start, end))
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


def _predict(levels: list[int], alive: list[frozenset[int]], saved: list[int], chosen: set[int]) -> int:
    return max(
        (level - sum(saved[i] for i in a if i in chosen) for level, a in zip(levels, alive, strict=True)),
        default=0,
    )


def solve_plan(
    levels: Sequence[int],
    alive: Sequence[frozenset[int]],
    saved: Sequence[int],
    cost: Sequence[float],
    budget: int,
) -> set[int] | None:
    """The cheapest set of blocks whose predicted peak fits ``budget``, by ILP (step 6); None if none fits."""
    import pulp

    demands = [(level - budget, a) for level, a in zip(levels, alive, strict=True) if level > budget]
    if not demands:
        return set()
    helpful = {i for _, a in demands for i in a if saved[i] > 0}
    for need, a in demands:  # cheap infeasibility check before calling the solver
        if sum(saved[i] for i in a if saved[i] > 0) < need:
            return None
    problem = pulp.LpProblem("nbtoolkit_recompute", pulp.LpMinimize)
    x = {i: problem.add_variable(f"x{i}", cat="Binary") for i in sorted(helpful)}
    # seconds in microseconds and bytes in KiB keep CBC's coefficients well scaled;
    # the tiny per-block term prefers fewer blocks among equally fast plans.
    problem += pulp.lpSum((cost[i] * 1e6 + 1e-3) * x[i] for i in x)
    for k, (need, a) in enumerate(demands):
        problem += (pulp.lpSum(saved[i] / 1024 * x[i] for i in a if i in x) >= need / 1024, f"phase{k}")
    status = problem.solve(_cbc())
    if pulp.LpStatus[status] != "Optimal":
        return None
    chosen = {i for i, var in x.items() if (var.value() or 0) > 0.5}
    # CBC works in floating point: confirm the plan in exact integers, round up if needed.
    while _predict(list(levels), list(alive), list(saved), chosen) > budget:
        rest = list(helpful - chosen)
        if not rest:
            return None
        chosen.add(min(rest, key=lambda i: cost[i] / max(saved[i], 1)))
    return chosen


def _cbc() -> Any:
    """CBC: a system install if there is one, else the binary that ships inside PuLP.

    (PuLP 3 deprecates its PULP_CBC_CMD wrapper in favour of COIN_CMD; pointing COIN_CMD at
    the bundled binary is the same solver without the deprecation warning.)
    """
    import pulp
    from pulp.apis import coin_api

    system = pulp.COIN_CMD(msg=False)
    if system.available():
        return system
    return pulp.COIN_CMD(msg=False, path=coin_api.pulp_cbc_path)


def _front(
    levels: list[int], alive: list[frozenset[int]], saved: list[int], cost: list[float], *, limit: int = 48
) -> tuple[list[set[int]], bool]:
    """The exact Pareto front (step 7): plans from no checkpointing to the lowest peak."""
    plans: list[set[int]] = [set()]
    budget = _predict(levels, alive, saved, set()) - 1024
    truncated = False
    while budget > 0:
        if len(plans) >= limit:
            truncated = True
            break
        chosen = solve_plan(levels, alive, saved, cost, budget)
        if chosen is None:
            break
        plans.append(chosen)
        budget = _predict(levels, alive, saved, chosen) - 1024
    return plans, truncated


def plan_recompute(
    model: Any,
    step: Any,
    budget_bytes: Any = None,
    *,
    blocks: Sequence[str] | None = None,
    steps: int = 5,
    verify: bool = True,
    progress: Progress | None = None,
) -> RecomputePlan:
    """Measure the candidate blocks and choose the cheapest set to checkpoint under ``budget_bytes``.

    Args:
        model: the ``torch.nn.Module`` the step trains.
        step: zero-argument callable running one training step (forward, backward, optimizer).
        budget_bytes: the peak step memory to stay under: bytes, or text like ``"1.5GB"``.
            It counts what the step allocates above what is live before it (see
            ``Measurement.peak_bytes``). None: plan nothing, but measure the candidates and the
            whole trade-off front (what the panel starts from).
        blocks: candidate module names (``model.named_modules()`` paths); default: the repeated blocks.
        steps: timing rounds (each: one plain step and one step per candidate checkpointed).
        verify: apply the chosen plan and measure its real peak (step 8).
        progress: ``progress(done, total, what)`` after each run.

    Raises:
        NbtUsageError: not a module, not a callable step, the step raised, bad block names or budget.
        PlanError: no repeated blocks to choose from, or no plan reaches the budget (the message
            gives the lowest reachable peak).

    The algorithm is written out in the module docstring.
    """
    module = check_module(model)
    check_step(step)
    budget = None if budget_bytes is None else parse_bytes(budget_bytes)
    if steps < 1:
        raise NbtUsageError(f"steps must be >= 1, got {steps}")
    if blocks is None:
        names = find_repeated_blocks(module)
        if not names:
            raise PlanError(
                f"{type(module).__name__} has no repeated blocks (no two non-leaf children of the same class "
                "under one parent) to choose from: name the modules to consider with blocks=['layer1', ...]"
            )
    else:
        names = [blocks] if isinstance(blocks, str) else list(blocks)
        if not names:
            raise NbtUsageError("blocks is empty: name at least one module, or leave it out")
    modules = resolve_blocks(module, names)
    n = len(names)
    total_runs = 1 + steps * (n + 1) + 1 + n + (1 if verify and budget is not None else 0)
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total_runs), total_runs, what)

    probe = _BlockProbe(modules)
    notes: list[str] = []
    try:
        probe.recording_times = False
        run_step(step)  # warm-up: optimizer state, lazy buffers
        tick("warm-up step")
        # on the CPU the step's cost is its processor time, which a busy machine does not inflate
        # (wall time there is mostly waiting for a core); on a GPU it is wall time
        cpu_clock = all(p.device.type == "cpu" for p in module.parameters())
        step_times: list[float] = []
        with_block: list[list[float]] = [[] for _ in range(n)]
        for _ in range(steps):
            # one round: a plain step, then one step with each block checkpointed alone;
            # interleaving lets load from other processes hit every configuration alike
            probe.recording_times = True
            probe.new_step()
            step_times.append(_timed(step, cpu=cpu_clock))
            probe.recording_times = False
            tick("timed step")
            for i in range(n):
                applied = checkpoint_blocks(module, [names[i]])
                try:
                    probe.new_step()
                    with_block[i].append(_timed(step, cpu=cpu_clock))
                finally:
                    applied.undo()
                tick(f"timed step with {names[i]} checkpointed")
        # fastest of the rounds: load from other processes only ever adds time, so the
        # minimum is each configuration's own cost (timeit's reasoning)
        fastest = min(step_times)
        cost = [max(0.0, min(times) - fastest) for times in with_block]
        forward = [min(t) if t else 0.0 for t in probe.forward_times]
        probe.new_step()
        baseline, _, _ = profile_memory_series(step)
        tick("profiled baseline step")
        levels, alive = _phases(baseline, n)
        never = [names[i] for i in range(n) if f"fwd_end:{i}" not in baseline.marks]
        if never:
            raise NbtUsageError(
                f"block(s) {', '.join(never)} did not run during the step: name blocks the step uses"
            )
        last = max(range(n), key=lambda i: baseline.marks[f"fwd_end:{i}"])
        reference = baseline.level_at(baseline.marks[f"fwd_end:{last}"])
        saved = []
        for i in range(n):
            applied = checkpoint_blocks(module, [names[i]])
            try:
                probe.new_step()
                series, _, _ = profile_memory_series(step)
            finally:
                applied.undo()
            tick(f"profiled step with {names[i]} checkpointed")
            end_mark = series.marks.get(f"fwd_end:{last}")
            saved.append(max(0, reference - series.level_at(end_mark)) if end_mark is not None else 0)
        no_grad = [names[i] for i in range(n) if f"bwd_start:{i}" not in baseline.marks]
        if no_grad:
            notes.append(f"no gradient flows through {', '.join(no_grad)}: checkpointing them saves nothing")
            saved = [0 if names[i] in no_grad else s for i, s in enumerate(saved)]
        useless = [names[i] for i in range(n) if saved[i] == 0 and names[i] not in no_grad]
        if useless:
            notes.append(f"checkpointing {', '.join(useless)} measured no saving")

        front, truncated = _front(levels, alive, saved, cost)
        if truncated:
            notes.append(f"trade-off front cut at {len(front)} plans")
        baseline_peak = baseline.peak_bytes
        target = baseline_peak if budget is None else budget
        chosen = solve_plan(levels, alive, saved, cost, target)
        if chosen is None:
            lowest = _predict(levels, alive, saved, {i for i in range(n) if saved[i] > 0})
            raise PlanError(
                f"no recomputation plan fits a budget of {format_bytes(target)} ({target:,} bytes): "
                f"the baseline peak is {format_bytes(baseline_peak)} and checkpointing every candidate "
                f"still peaks at {format_bytes(lowest)} ({lowest:,} bytes). Raise the budget to at least "
                "that, or name more/smaller blocks with blocks=[...]"
            )
        measured: int | None = None
        if verify and budget is not None and chosen:
            for _attempt in range(3):
                applied = checkpoint_blocks(module, [names[i] for i in sorted(chosen)])
                try:
                    probe.new_step()
                    series, _, _ = profile_memory_series(step)
                finally:
                    applied.undo()
                measured = series.peak_bytes
                if measured <= budget:
                    break
                overshoot = measured - _predict(levels, alive, saved, chosen)
                notes.append(
                    f"measured peak {format_bytes(measured)} was over the budget: re-planned with the budget "
                    f"lowered by {format_bytes(overshoot)}"
                )
                tighter = solve_plan(levels, alive, saved, cost, budget - max(overshoot, 1024))
                if tighter is None or tighter == chosen:
                    break
                chosen = tighter
            tick("profiled step with the plan applied")
            if measured is not None and measured > budget:
                lowest_measured = measured
                raise PlanError(
                    f"no recomputation plan measured under a budget of {format_bytes(budget)}: the best "
                    f"measured {format_bytes(lowest_measured)}. Raise the budget or name smaller blocks"
                )
    finally:
        probe.remove()

    return _build_plan(
        names, modules, saved, cost, forward, levels, alive, front, chosen,
        budget=target, baseline_peak=baseline_peak, step_time=statistics.median(step_times),
        measured=measured, notes=notes,
    )


def _build_plan(  # noqa: PLR0917 - private helper taking the planner's measured arrays
    names: list[str],
    modules: list[Any],
    saved: list[int],
    cost: list[float],
    forward: list[float],
    levels: list[int],
    alive: list[frozenset[int]],
    front: list[set[int]],
    chosen: set[int],
    *,
    budget: int,
    baseline_peak: int,
    step_time: float,
    measured: int | None,
    notes: list[str],
) -> RecomputePlan:
    import pandas as pd

    candidates = pd.DataFrame(
        {
            "block": names,
            "module": [type(m).__name__ for m in modules],
            "saved_bytes": [int(s) for s in saved],
            "recompute_time_s": [float(c) for c in cost],
            "forward_time_s": [float(f) for f in forward],
            "chosen": [i in chosen for i in range(len(names))],
        }
    )
    rows = [
        {
            "predicted_peak_bytes": _predict(levels, alive, saved, plan),
            "predicted_overhead_s": float(sum(cost[i] for i in plan)),
            "n_blocks": len(plan),
            "blocks": ",".join(names[i] for i in sorted(plan)),
        }
        for plan in front
    ]
    tradeoff = pd.DataFrame(
        rows, columns=["predicted_peak_bytes", "predicted_overhead_s", "n_blocks", "blocks"]
    )
    phases = pd.DataFrame(
        {
            "phase": list(range(len(levels))),
            "baseline_bytes": [int(v) for v in levels],
            "alive": [tuple(names[i] for i in sorted(a)) for a in alive],
        }
    )
    return RecomputePlan(
        blocks=[names[i] for i in sorted(chosen)],
        budget_bytes=int(budget),
        predicted_peak_bytes=_predict(levels, alive, saved, chosen),
        predicted_overhead_s=float(sum(cost[i] for i in chosen)),
        baseline_peak_bytes=int(baseline_peak),
        baseline_step_time_s=float(step_time),
        candidates=candidates,
        tradeoff=tradeoff,
        phases=phases,
        measured_peak_bytes=measured,
        notes=notes,
    )
