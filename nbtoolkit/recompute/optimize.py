"""``nbt.optimize``: measure a step, apply compile / recomputation / AMP, measure again, compare.

Order of application (and the reverse order of undo): checkpoint wrappers on the chosen
blocks (the model's own checkpointing, Hugging Face's or timm's, turned off meanwhile:
``nbtoolkit.recompute.framework_checkpointing``), then autocast around the model's forward,
then torch.compile of that forward, so that the compiled graph contains the autocast region
and the checkpointed blocks.

**The model is restored afterwards by default** (``undo=True``): the comparison is a
measurement, not a change you did not ask to keep. With ``undo=False`` the changes stay
applied and ``comparison.applied`` is the handle whose ``undo()`` removes them later.
Either way the steps ran for real, so the weights have trained for those steps.

Settings: the keyword arguments, or one ``config=OptimizeConfig(...)``
(``nbtoolkit.recompute.config``). Without ``config``, ``OptimizeConfig.from_env`` fills
what the arguments leave unset from the environment: ``NBTOOLKIT_RECOMPUTE=auto`` turns
``recompute`` to ``"auto"``, ``NBTOOLKIT_MEMORY_BUDGET`` supplies ``budget_bytes`` (bytes, or
text like ``1.5GB`` / ``1400MiB``), ``NBTOOLKIT_MEASURE_STEPS``/``NBTOOLKIT_MEASURE_WARMUP``
the step counts. Arguments given in code win over the environment; a ``config`` is taken
as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.core.units import format_bytes
from nbtoolkit.recompute.amp import autocast_model
from nbtoolkit.recompute.apply_compile import compile_model
from nbtoolkit.recompute.backend_plan import apply_backend_plan
from nbtoolkit.recompute.blocks import check_module, model_and_step, resolve_blocks
from nbtoolkit.recompute.checkpoint import checkpoint_blocks
from nbtoolkit.recompute.comparison import Comparison
from nbtoolkit.recompute.config import OptimizeConfig
from nbtoolkit.recompute.framework_checkpointing import describe, framework_checkpointing
from nbtoolkit.recompute.handle import Applied
from nbtoolkit.recompute.measure import Progress, check_step
from nbtoolkit.recompute.paired_measure import PairedMeasure, StageProgress
from nbtoolkit.recompute.planner import plan_recompute

if TYPE_CHECKING:
    from nbtoolkit.recompute.plan import RecomputePlan

__all__ = ["config_from_arguments", "optimize"]

#: Step runs the progress bar counts for planning with recompute="auto" (an estimate).
_PLAN_RUNS = 10

#: optimize()'s keyword arguments that a config= replaces, with their defaults.
_SETTING_DEFAULTS: dict[str, Any] = {
    "compile": False,
    "recompute": None,
    "budget_bytes": None,
    "amp": None,
    "steps": None,
    "undo": True,
}


def config_from_arguments(**arguments: Any) -> OptimizeConfig:
    """The :class:`OptimizeConfig` that :func:`optimize`'s keyword arguments (its defaults for
    any left out) stand for, the environment filling what they leave unset."""
    unknown = sorted(set(arguments) - set(_SETTING_DEFAULTS))
    if unknown:
        raise NbtUsageError(f"unknown optimize() setting(s) {unknown}: use {sorted(_SETTING_DEFAULTS)}")
    given = {**_SETTING_DEFAULTS, **arguments}
    measure = measure_config(steps=given["steps"])
    return OptimizeConfig.from_env(
        compile=given["compile"], recompute=given["recompute"], budget_bytes=given["budget_bytes"],
        amp=given["amp"], undo=given["undo"], measure=measure,
    )


def optimize(
    model: Any,
    step: Any = None,
    *,
    compile: bool | str | dict[str, Any] = False,
    recompute: str | Sequence[str] | RecomputePlan | None = None,
    budget_bytes: int | float | str | None = None,
    amp: str | None = None,
    steps: int | None = None,
    undo: bool = True,
    progress: Progress | None = None,
    config: OptimizeConfig | MeasureConfig | None = None,
) -> Comparison:
    """Measure ``step``, apply the requested changes to ``model``, measure again; a :class:`Comparison`.

    Args:
        model: the ``torch.nn.Module`` that ``step`` trains.
            ``nbt.train_step(trainer)`` may come alone in its place: the trainer's model and
            its step are taken from it.
        step: zero-argument callable running one training step; returns the loss or None.
        compile: False; True (torch.compile defaults); a mode name; or a dict of torch.compile
            options (``mode``, ``fullgraph``, ``dynamic``, ``backend``, ``options``).
        recompute: None (no checkpointing); ``"auto"`` (plan under ``budget_bytes`` with
            :func:`~nbtoolkit.recompute.planner.plan_recompute`); a list of module names
            to checkpoint; or a plan ``plan_recompute`` returned, applied as it is (no planning
            again: "auto" plans afresh from newly timed costs, and may pick another set within noise).
        budget_bytes: the device's total peak for ``recompute="auto"`` (bytes, ``"1.5GB"``, or on a
            GPU a share such as ``"90%"``): parameters, gradients and optimizer state count.
        amp: None, ``"bf16"`` or ``"fp16"`` (autocast around the forward).
        steps: timed steps of each measurement (default: ``MeasureConfig()``'s).
        undo: restore the model at the end (default); False keeps the changes (``.applied``).
        progress: ``progress(done, total, what)`` while measuring.
        config: how each side is measured, as a :class:`~nbtoolkit.MeasureConfig`: its
            ``warmup``; ``categories`` (the peak by torch memory category, one more profiled step
            each; on by default); ``metrics`` (each configuration's FLOPs, one more step each: model
            and hardware FLOPs, achieved FLOP/s, MFU and HFU in the table; on by default);
            ``tokens_per_step`` (for tokens/s). A ``steps=`` given as well wins. Or all of the
            above but ``progress`` as one :class:`~nbtoolkit.recompute.config.OptimizeConfig`;
            then leave them out.

    Both measurements start from the same weights: the model's parameters and buffers are
    copied (to the CPU) before the baseline and put back before the second measurement and
    again at the end. So the first loss of each measurement is computed
    from identical weights and shows whether the changes alter what the step computes, and the
    model's weights are as they were afterwards. Optimizer state (e.g. Adam's moments) lives in
    the step and is not restored: it has advanced by the measured steps.
    The environment variables and the order of changes are described in the module docstring.
    Bad input raises NbtUsageError (PlanError when no plan fits) and leaves the model as it was.
    """
    model, step = model_and_step(model, step, "optimize")
    module = check_module(model)
    check_step(step)
    arguments = {
        "compile": compile, "recompute": recompute, "budget_bytes": budget_bytes, "amp": amp,
        "steps": steps, "undo": undo,
    }
    if config is None:
        config = config_from_arguments(**arguments)
    elif isinstance(config, MeasureConfig):
        measure = measure_config(config, steps=steps)
        config = OptimizeConfig.from_env(compile=compile, recompute=recompute, budget_bytes=budget_bytes,
                                         amp=amp, undo=undo, measure=measure)
    else:
        if not isinstance(config, OptimizeConfig):
            raise NbtUsageError(
                f"config must be an OptimizeConfig or a MeasureConfig, got {type(config).__name__}"
            )
        given = [name for name, value in arguments.items() if value != _SETTING_DEFAULTS[name]]
        if given:
            raise NbtUsageError(
                f"{', '.join(given)} given both as argument(s) and in config=: "
                "set them in OptimizeConfig(...) only"
            )
    return _optimize(module, step, config, progress)


def _optimize(module: Any, step: Any, config: OptimizeConfig, progress: Progress | None) -> Comparison:
    """optimize() once its settings are checked: warm up, plan, apply, warm up, time interleaved,
    measure memory and FLOPs of each side, restore (``nbtoolkit.recompute.paired_measure``)."""
    names = config.blocks
    if names is not None:
        resolve_blocks(module, names)  # fail before measuring anything
    given = config.given_plan
    if given is not None and (given.choices or given.blocks):
        resolve_blocks(module, list(given.choices) or list(given.blocks))  # a plan of this model?
    auto = isinstance(config.recompute, str) and config.recompute == "auto"
    budget: Any = config.budget_bytes  # bytes, or a share of the device until the plan resolves it
    compile_opts = config.compile_options
    measure = config.measure
    plan_runs = _PLAN_RUNS if auto else 0
    extra_runs = (1 if measure.memory else 0) + (1 if measure.metrics else 0)
    after_warmup = max(measure.warmup, 1 if compile_opts is not None else 0)
    stages = StageProgress(
        progress,
        total=measure.warmup + plan_runs + after_warmup + (1 if measure.warmup else 0)
        + 2 * (measure.steps + extra_runs),
    )
    initial_state = _copy_state(module)
    pair = PairedMeasure(step, measure, stages, restore_weights=lambda: _restore_state(module, initial_state))
    plan = given
    applied = Applied()
    notes: list[str] = []
    if given is not None:
        names = _applied_blocks(given)
        if (given.backend == "eager") != (compile_opts is None):
            # the compiler's partitioner decides again what to save: the plan's peak may not hold
            notes.append(
                f"the plan was measured under {given.backend} and is applied "
                f"{'under torch.compile' if compile_opts is not None else 'in eager mode'}: its predicted "
                "peak may not hold; plan with the same compile setting (plan_recompute(..., compile=...))"
            )
    try:
        pair.warm_before(module)
        # the model's own checkpointing as the user runs it: read after the warm-up, where a training
        # loop as the step (a Trainer with gradient_checkpointing=True) has turned it on
        own = framework_checkpointing(module)
        if auto:
            assert budget is not None
            done_at_start = stages.done

            def plan_progress(done: int, of: int, what: str) -> None:
                stages.done = done_at_start + round(plan_runs * done / max(of, 1))
                stages.tick("planning", what, runs=0)

            # planned and verified under the compiler that will run it (a plan measured in eager
            # mode does not carry over: the partitioner decides again what to save)
            plan = plan_recompute(
                module, step, budget, config=config.plan, progress=plan_progress, compile=compile_opts
            )
            stages.done = done_at_start + plan_runs
            budget = plan.budget_bytes  # a share of the device ("90%") is now bytes of it
            names = _applied_blocks(plan)
            if not names and plan.route == "blocks":
                notes.append(
                    f"the baseline peak {format_bytes(plan.baseline_peak_bytes)} already fits the budget "
                    f"{format_bytes(budget)}: nothing to recompute"
                )
        if plan is not None and (plan.choices or plan.route != "blocks"):
            # per-block choices, or torch's partitioner budget
            applied.extend(apply_backend_plan(plan, module))
        elif names:
            applied.extend(checkpoint_blocks(module, names))
        if config.amp is not None:
            applied.extend(autocast_model(module, config.amp))
        if compile_opts is not None:
            applied.extend(compile_model(module, **compile_opts))
        _restore_state(module, initial_state)  # the after side starts from the weights the before side did
        pair.warm_after(module, compiled=compile_opts is not None)
        timing = pair.rounds()
        before = pair.measurement("before", timing, {"compile": None, "recompute": [], "amp": None})
        after = pair.measurement(
            "after", timing, {"compile": compile_opts, "recompute": names or [], "amp": config.amp}
        )
    except BaseException:
        applied.undo()
        _restore_state(module, initial_state)
        raise
    _restore_state(module, initial_state)  # measuring must not train the user's model
    notes.extend(pair.notes())
    notes.extend(_use_cache_note(module, after, names))
    if names and own:
        notes.append(
            f"your model has its own {describe(own)} on: 'before' runs with it, as you run it; 'after' "
            "has it off and checkpoints exactly the chosen blocks instead (nbtoolkit's checkpointing "
            "wins while applied; undo turns the model's own back on)"
        )
    after_total = after.total_peak_bytes if after.total_peak_bytes is not None else after.peak_bytes
    if budget is not None and (auto or given is not None) and after_total > budget:
        notes.append(
            f"measured total peak {format_bytes(after_total)} is over the budget {format_bytes(budget)} "
            "with all changes applied (compile/AMP change memory too)"
        )
    changes = list(applied.changes)
    if names and plan is not None and plan.choices:
        changes = [c for c in changes if c.split(" ", 1)[0] not in ("selective", "full", "offload")]
        shown = ", ".join(f"{b} ({plan.choices[b]})" for b in names)
        changes.insert(0, f"recompute {len(names)} block(s) under {plan.backend}: {shown}")
    elif names:
        # one line for the whole set of checkpointed blocks reads better than one per block
        changes = [c for c in changes if not c.startswith("checkpoint ")]
        changes.insert(0, f"checkpoint {len(names)} block(s): {', '.join(names)}")
    if config.undo:
        applied.undo()
        handle = None
    else:
        handle = applied
    return Comparison(
        before=before, after=after, changes=changes, plan=plan, notes=notes, applied=handle,
        nothing_applied=None if changes else _why_nothing_applied(module, config, plan),
        timing=timing, budget_bytes=int(budget) if isinstance(budget, (int, float)) else None,
    )


def _use_cache_note(module: Any, after: Any, names: Any) -> list[str]:
    """A Hugging Face model whose checkpointed layers write the KV cache breaks torch.compile's graph
    at each layer ("HOP: Unsafe side effect"); training needs no cache: say how to turn it off."""
    model_config = getattr(module, "config", None)
    if not names or not getattr(model_config, "use_cache", False):
        return []
    side_effects = sum(n for reason, n in after.break_reasons.items() if "side effect" in reason.lower())
    if not side_effects:
        return []
    return [(
        f"{side_effects} graph break(s) come from checkpointed layers writing the model's KV cache "
        "(use_cache=True; 'HOP: Unsafe side effect'): training needs no cache, set "
        "model.config.use_cache = False (or pass use_cache=False to the forward) and measure again"
    )]


def _why_nothing_applied(module: Any, config: OptimizeConfig, plan: Any) -> str:
    """Why optimize() changed nothing, in words (the Comparison then claims no speed-up)."""
    reasons = []
    if not any(True for _ in module.parameters()):
        reasons.append("the model has no parameters")
    if plan is not None and not plan.blocks:
        reasons.append("the recompute plan chose no block (the step already fits the budget)")
    elif config.recompute is None and config.compile_options is None and config.amp is None:
        reasons.append("no change was asked for: pass compile=True, recompute=... or amp=...")
    return "; ".join(reasons) or "no change applied"


def _copy_state(module: Any) -> dict[str, Any]:
    """A CPU copy of the module's parameters and buffers (not on the device: no extra device memory)."""
    return {name: value.detach().to("cpu", copy=True) for name, value in module.state_dict().items()}


def _restore_state(module: Any, state: dict[str, Any]) -> None:
    """Put the copied values back in place, so the tensors (and optimizers holding them) stay the same."""
    import torch

    with torch.no_grad():
        for name, value in module.state_dict().items():
            value.copy_(state[name])


def _applied_blocks(plan: RecomputePlan) -> list[str]:
    """The blocks a plan changes: its per-block choices other than "keep", or its checkpointed set
    (none for torch's partitioner budget)."""
    if plan.choices or plan.route != "blocks":
        return [b for b, c in plan.choices.items() if c != "keep"]
    return list(plan.blocks)
