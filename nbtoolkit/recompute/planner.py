"""Choose which blocks to recompute (activation checkpointing) under a memory budget.

:func:`plan_recompute` is two halves with a plain table between them: the measurement
(steps 1-4, ``nbtoolkit.recompute.plan_measure``, which runs the step) produces a
:class:`~nbtoolkit.recompute.costs.RecomputeCosts`, and the pure solver (steps 5-7,
``nbtoolkit.recompute.solver``) turns it and the budget into a
:class:`~nbtoolkit.recompute.plan.RecomputePlan`; step 8 checks the plan by running it.

Algorithm of :func:`plan_recompute`, every number measured on the machine at hand:

1. **Candidates.** The blocks you name, or by default the repeated blocks of the model:
   among every module's direct children, the groups of two or more non-leaf children of
   the same class (the layers of a ``ModuleList``/``Sequential``, a transformer's blocks),
   all the non-leaf children of a ``ModuleList`` being one group whatever their classes (a
   hybrid stack); the group holding the most parameters wins (``blocks.find_repeated_blocks``).
2. **Recompute time** (``nbtoolkit.recompute.recompute_timing`` gives every reason). One
   warm-up step (so optimizer state exists), then interleaved rounds, each one plain step
   and one step with every candidate checkpointed. In the checkpointed step each block's
   forward is timed again where backward re-runs it (``r_i``, inside the real step rather
   than in isolation); the round's overhead factor ``k = (T_all - T_plain) / sum_i r_i`` is
   what the checkpoint machinery adds (saved inputs and RNG state, a hook per saved tensor)
   or gives back (freed activations), measured on the whole step where it is largest. The
   cost of block ``i`` is the median over rounds of ``k * r_i``, its spread the 25th-75th
   percentile; blocks of the same class with the same parameter and input shapes pool
   their samples (what tells them apart is noise). At least ``steps`` rounds, more while
   the medians are imprecise, up to a time limit. Times are the calling thread's processor
   time on the CPU (waiting for a core or for the GIL does not count) and CUDA events and
   synchronised wall time on a GPU.
3. **Memory over time.** One step under ``torch.profiler(profile_memory=True)``: the
   allocator's running total ``L(t)`` after every allocation and free, and markers for the
   end of each block's forward and the start of its backward (a hook on the gradient of the
   block's output). Block ``i`` is *alive* from its forward's end to its backward's start:
   that is when checkpointing it holds less memory. The step splits into *phases*, stretches
   with one alive set ``A_p``; ``P_p`` is the highest ``L(t)`` measured in phase ``p``.
   The same step is measured whole: the device's total peak ``T`` (``max_memory_allocated``
   on a GPU, the total torch's memory profiler classifies on the CPU, which matches
   MemTracker's), so ``F = T - max L`` is what the device holds that the step did not
   allocate and no recomputation changes (parameters, optimizer state, inputs).
4. **Savings.** For each candidate alone: checkpoint it, run one profiled step, and read the
   live total at the end of the last block's forward (all blocks alive there).
   ``s_i = L_baseline - L_checkpointed(i)``: the bytes of activations the block no longer
   keeps, net of the inputs the checkpoint keeps instead. Memory is deterministic, so one
   run each is enough.
5. **Model.** Checkpointing a set S gives the peak ``F + max_p (P_p - sum_{i in S ∩ A_p} s_i)``
   (without ``F`` for a budget of the step's own memory, ``step_budget_bytes``): each
   phase keeps its measured level minus the savings of the checkpointed blocks alive in it.
   During a checkpointed block's own backward its activations are rebuilt, which the model
   covers because the block is not alive there. The peak is *not* the baseline peak minus
   the sum of savings: a block saves nothing in phases where it is not alive, and the peak
   can move to another phase (the backward of the first blocks, the optimizer step).
6. **Solver: an exact integer linear program** (PuLP with the CBC solver it ships):
   binary ``x_i``; minimise ``sum t_i x_i`` (``t_i`` the cost of step 2); subject to, for
   every phase with ``F + P_p > budget``, ``sum_{i in A_p} s_i x_i >= F + P_p - budget``. An
   ILP rather than dynamic programming because the savings are byte counts (a DP over them
   needs rounding to a grid, which loses exactness or explodes the table), and because the
   alive sets need not be nested prefixes (blocks named by the user may run in any order):
   the ILP takes any phase structure as is.
   With a few dozen candidates CBC answers in milliseconds.
7. **Trade-off front.** Solving again with the budget just below the last plan's predicted
   peak walks the exact Pareto front, from no checkpointing to the lowest reachable peak.
8. **Verification** (``verify=True``). The chosen plan is applied and one profiled step
   measures its real peak (the device's total, or the step's own for a step budget). If that
   is above the budget (a block's rebuilt activations can overlap with others' in ways the
   model rounds away), the plan is re-solved with the budget lowered by the overshoot, up to
   three times, and the measured peak is recorded.

The model is left as it was (hooks removed, checkpoint wrappers undone) also on errors.

**The model's own checkpointing** (Hugging Face's ``gradient_checkpointing_enable()``, timm's
``set_grad_checkpointing()``): a plan wins while it is applied (it turns the model's flags off,
undo turns them back on; ``nbtoolkit.recompute.framework_checkpointing`` says why). So steps 2-8
run with those flags off. The warm-up step runs first, as the user runs it (a Trainer made
into the step turns its checkpointing on there); when the model's own checkpointing is on
then, one more profiled step measures the peak as the user runs it, which the plan's first
note gives next to the numbers without it.
Steps run for real: the optimizer updates the weights, as in your training loop.

**Under torch.compile** (``compile=...``) or with ``selective=True`` the plan is made by
``nbtoolkit.recompute.backend_planner`` instead: every setting measured as a whole step with the
backend applied (a compiled graph hides the phases above), each block kept, selectively
recomputed or fully recomputed, and torch's own ``activation_memory_budget`` searched as a second
route; :func:`plan_recompute_budgets` plans several budgets with peaks that never rise as the
budget falls.

Never uses ``torch.distributed._tools``' SACEstimator: it needs CUDA and aborts the
process on a CPU-only machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.device_memory import model_device, plan_budget
from nbtoolkit.core.errors import NbtUsageError, PlanError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.core.units import format_bytes
from nbtoolkit.recompute.apply_compile import compile_options
from nbtoolkit.recompute.backend_planner import ROUTES, BackendPlanner
from nbtoolkit.recompute.blocks import Candidates, candidate_blocks, check_module, model_and_step
from nbtoolkit.recompute.checkpoint import checkpoint_modules
from nbtoolkit.recompute.config import RecomputeConfig
from nbtoolkit.recompute.costs import RecomputeCosts
from nbtoolkit.recompute.framework_checkpointing import (
    describe,
    framework_checkpointing,
    suspend_framework_checkpointing,
)
from nbtoolkit.recompute.measure import Progress, check_step, profile_memory_series, run_step
from nbtoolkit.recompute.plan import RecomputePlan
from nbtoolkit.recompute.plan_measure import measure_recompute_costs, measurement_runs
from nbtoolkit.recompute.solver import cheapest_blocks, solve_recompute

if TYPE_CHECKING:
    import torch

__all__ = ["plan_recompute", "plan_recompute_budgets"]

#: Re-plans after a verified peak came out over the budget (step 8).
_VERIFY_ATTEMPTS = 3


def plan_recompute(
    model: Any,
    step: Any = None,
    budget_bytes: Any = None,
    *,
    step_budget_bytes: Any = None,
    blocks: Sequence[str] | None = None,
    steps: int | None = None,
    verify: bool = True,
    progress: Progress | None = None,
    config: RecomputeConfig | MeasureConfig | None = None,
    compile: bool | str | dict[str, Any] | None = None,
    selective: bool | None = None,
    route: str = "auto",
) -> RecomputePlan:
    """Measure the candidate blocks and choose the cheapest set to checkpoint under a memory budget.

    Args:
        model: the ``torch.nn.Module`` the step trains.
            ``nbt.train_step(trainer)`` may come alone in its place: the trainer's model and
            its step are taken from it.
        step: zero-argument callable running one training step (forward, backward, optimizer).
        budget_bytes: the device's total peak to stay under, everything allocated at the step's
            peak (parameters, gradients, optimizer state, activations, temporaries): what
            ``torch.cuda.max_memory_allocated`` reports on a GPU and torch's MemTracker's total on
            the CPU. Bytes, text like ``"70GB"``, or on a GPU a share of its memory like ``"90%"``.
            None (and no ``step_budget_bytes``): plan nothing, but measure the candidates and the
            whole trade-off front (what the panel starts from).
        step_budget_bytes: instead of ``budget_bytes``, a budget for the step's own peak: what it
            allocates above what was live before it (``Measurement.peak_bytes``).
        blocks: candidate module names (``model.named_modules()`` paths); default: the repeated blocks.
        steps: timing rounds at least (each: one plain step and one step with every candidate
            checkpointed; more follow while the costs are imprecise, for up to
            ``recompute_timing.TIME_LIMIT_S`` seconds); default ``MeasureConfig().steps``.
            With ``compile``/``selective``: timed steps per measured setting (at least 3).
        verify: apply the chosen plan and measure its real peak (step 8).
        progress: ``progress(done, total, what)`` after each run.
        compile: plan under torch.compile as ``optimize(compile=...)`` applies it (True, a mode
            name, or a dict of torch.compile options such as ``{"backend": "inductor"}``): every
            cost is measured and the plan verified with the model compiled
            (``nbtoolkit.recompute.backend_planner``). Each block is then kept, selectively
            recomputed (matmul/attention outputs saved) or fully recomputed, and torch's own
            partitioner budget is searched as a second route. None: eager, blocks only.
        selective: offer op-level selective recomputation per block; default: under ``compile``
            only. True in eager mode plans with the backend planner without compiling.
        route: under compile, ``"auto"`` (the faster of per-block choices and torch's
            partitioner), ``"blocks"`` or ``"partitioner"`` only.
        config: ``RecomputeConfig(blocks=..., steps=..., verify=...)`` instead of those three arguments;
            or a :class:`~nbtoolkit.MeasureConfig` for the timing rounds (its ``steps``; a
            ``steps=`` given as well wins).

    Raises:
        NbtUsageError: not a module, not a callable step, bad block names or budget.
        StepError: the step raised (a NbtUsageError too; the original is its ``__cause__``).
        PlanError: no repeated blocks to choose from, or no plan reaches the budget (the message
            gives the lowest reachable peak, what of it is fixed and what would lower that).

    The algorithm is written out in the module docstring.
    """
    model, step = model_and_step(model, step, "plan_recompute")
    module = check_module(model)
    check_step(step)
    device = model_device(module)
    budget, kind = plan_budget(device, budget_bytes, step_budget_bytes)
    config = _config(config, blocks=blocks, steps=steps, verify=verify)
    compile_opts = compile_options(compile)
    if compile_opts is not None or selective:
        with suspend_framework_checkpointing(module):
            return _backend_planner(
                module, step, config, compile_opts, route=route, kind=kind, progress=progress
            ).plan(budget)
    # from here on the plan works with the candidate modules themselves, never the model
    candidates = candidate_blocks(module, config.blocks)
    gpu = device if device.type == "cuda" else None  # the memory profiler's device= (None: the CPU)
    verifying = config.verify and budget is not None
    total_runs = measurement_runs(len(candidates.blocks), config.steps) + (1 if verifying else 0)
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total_runs), total_runs, what)

    # the warm-up step first (optimizer state, lazy buffers), as the user runs it: a training loop
    # as the step (nbt.train_step(trainer)) starts there, and a Trainer with gradient_checkpointing=True
    # turns the model's own checkpointing on then
    run_step(step, "warm-up step")
    tick("warm-up step")
    own = framework_checkpointing(module)
    as_run = None
    if own:
        total_runs += 1
        as_run = _peak(step, total=kind == "total", device=gpu)
        tick(f"profiled step as you run it ({describe(own)} on)")
    # a plan replaces the model's own checkpointing while applied, so it is measured without it
    with suspend_framework_checkpointing(module):
        costs = measure_recompute_costs(
            step, candidates, device=gpu, steps=config.steps, tick=tick, total=kind == "total", warm=False
        )
        plan = solve_recompute(costs, budget, budget_kind=kind)
        if verifying and plan.blocks:
            assert budget is not None
            plan = _verified(step, candidates, costs, plan, budget, device=gpu, tick=tick)
        back_on = framework_checkpointing(module)
    notes = [_replaces_note(own, as_run, plan)] if own and as_run is not None else []
    if back_on:
        notes.append(
            f"{describe(back_on)} came back on while the plan was measured (a training loop restarted "
            "and set it up again?): those steps checkpointed more than the plan says, so its numbers may "
            "be off; give the loop enough steps for planning (e.g. a larger max_steps) and plan again"
        )
    if notes:
        plan = dataclasses.replace(plan, notes=[*notes, *plan.notes])
    return plan


def plan_recompute_budgets(
    model: Any,
    step: Any,
    budgets: Sequence[Any],
    *,
    compile: bool | str | dict[str, Any] | None = None,
    route: str = "auto",
    blocks: Sequence[str] | None = None,
    steps: int | None = None,
    progress: Progress | None = None,
) -> list[RecomputePlan]:
    """One plan per budget (device totals), measured once under the backend (``compile`` as in
    :func:`plan_recompute`; None: eager with selective choices): a lower budget never gets a higher
    measured peak than a higher budget's plan (``nbtoolkit.recompute.backend_planner``)."""
    model, step = model_and_step(model, step, "plan_recompute_budgets")
    module = check_module(model)
    check_step(step)
    device = model_device(module)
    resolved = [plan_budget(device, b, None)[0] for b in budgets]
    if not resolved or any(b is None for b in resolved):
        raise NbtUsageError("budgets must be a non-empty list of budgets (bytes or text like '1.5GB')")
    config = _config(None, blocks=blocks, steps=steps, verify=True)
    with suspend_framework_checkpointing(module):
        planner = _backend_planner(
            module, step, config, compile_options(compile), route=route, kind="total", progress=progress
        )
        return planner.plans([int(b) for b in resolved if b is not None])


def _backend_planner(
    module: Any, step: Any, config: RecomputeConfig, compile_opts: dict[str, Any] | None, *, route: str,
    kind: str, progress: Progress | None,
) -> BackendPlanner:
    """The planner that measures every setting under the backend that will run it."""
    if route not in ROUTES:
        raise NbtUsageError(f"route must be one of {list(ROUTES)}, got {route!r}")
    candidates = candidate_blocks(module, config.blocks)
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, max(done, 3 + 2 * len(candidates.blocks)), what)

    run_step(step, "warm-up step")  # optimizer state exists before anything is measured
    return BackendPlanner(
        module, step, candidates, compile_options=compile_opts, total=kind == "total", steps=config.steps,
        route=route, tick=tick,
    )


def _peak(step: Any, *, total: bool, device: torch.device | None) -> int:
    """One profiled step's peak: the device's total (``total``) or the step's own."""
    series, _, _ = profile_memory_series(step, total=total, device=device)
    whole = series.total_peak_bytes
    return whole if total and whole is not None else series.peak_bytes


def _replaces_note(own: dict[str, list[str]], as_run: int, plan: RecomputePlan) -> str:
    """The plan's note when the model checkpoints itself: which wins, and both peaks."""
    return (
        f"your model has its own {describe(own)} on. Applying this plan turns it off and checkpoints "
        "exactly the plan's blocks (undo turns it back on), so every number here is measured with it off: "
        f"{format_bytes(plan.baseline_peak_bytes)} with no checkpointing at all. As you run it, with "
        f"its own checkpointing, the step peaked at {format_bytes(as_run)} (measured)"
    )


def _config(config: Any, *, blocks: Any, steps: int | None, verify: bool) -> RecomputeConfig:
    """The settings: a RecomputeConfig when given (then the separate arguments must be left
    alone); else the arguments, the timing rounds merged with a MeasureConfig's steps."""
    if config is None or isinstance(config, MeasureConfig):
        measure = measure_config(config, steps=steps)
        return RecomputeConfig(blocks=blocks, steps=measure.steps, verify=verify)
    if not isinstance(config, RecomputeConfig):
        raise NbtUsageError(
            f"config must be a RecomputeConfig or a MeasureConfig, got {type(config).__name__}"
        )
    arguments = (("blocks", blocks, None), ("steps", steps, None), ("verify", verify, True))
    given = [name for name, value, default in arguments if value != default]
    if given:
        raise NbtUsageError(
            f"{', '.join(given)} given both as argument(s) and in config=: "
            "set them in RecomputeConfig(...) only"
        )
    return config


def _verified(
    step: Any,
    candidates: Candidates,
    costs: RecomputeCosts,
    plan: RecomputePlan,
    budget: int,
    *,
    device: torch.device | None,
    tick: Callable[[str], None],
) -> RecomputePlan:
    """Step 8: apply the plan, measure its peak; re-plan under a lowered budget while it is over."""
    notes = list(plan.notes)
    measured = 0
    total = plan.budget_kind == "total"
    for _attempt in range(_VERIFY_ATTEMPTS):
        applied = checkpoint_modules({name: candidates.blocks[name] for name in plan.blocks})
        try:
            measured = _peak(step, total=total, device=device)
        finally:
            applied.undo()
        if measured <= budget:
            break
        overshoot = measured - plan.predicted_peak_bytes
        notes.append(
            f"measured peak {format_bytes(measured)} was over the budget: re-planned with the budget "
            f"lowered by {format_bytes(overshoot)}"
        )
        tighter = cheapest_blocks(costs, budget - max(overshoot, 1024), fixed_bytes=plan.fixed_bytes)
        if tighter is None or set(tighter) == set(plan.blocks):
            break
        plan = plan.with_blocks(tighter)
    tick("profiled step with the plan applied")
    if measured > budget:
        raise PlanError(
            f"no recomputation plan measured under a budget of {format_bytes(budget)}: the best "
            f"measured {format_bytes(measured)} ({'the device total' if total else 'the step'}). "
            "Raise the budget or name smaller blocks"
        )
    return dataclasses.replace(plan, measured_peak_bytes=measured, notes=notes)
