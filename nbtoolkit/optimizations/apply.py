"""``nbt.optimize``: measure a step, apply compile / recomputation / AMP, measure again, compare.

Order of application (and the reverse order of undo): checkpoint wrappers on the chosen
blocks, then autocast around the model's forward, then torch.compile of that forward, so
that the compiled graph contains the autocast region and the checkpointed blocks.

**The model is restored afterwards by default** (``undo=True``): the comparison is a
measurement, not a change you did not ask to keep. With ``undo=False`` the changes stay
applied and ``comparison.applied`` is the handle whose ``undo()`` removes them later.
Either way the steps ran for real, so the weights have trained for those steps.

Script-level switch: when ``recompute`` is not given, ``NBTOOLKIT_RECOMPUTE=auto`` in the
environment turns it to ``"auto"``; when ``budget_bytes`` is not given,
``NBTOOLKIT_MEMORY_BUDGET`` supplies it (bytes, or text like ``1.5GB`` / ``1400MiB``).
Arguments given in code win over the environment.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from nbtoolkit.errors import NbtUsageError
from nbtoolkit.model.comparison import Comparison
from nbtoolkit.optimizations._handle import Applied
from nbtoolkit.optimizations.amp import AMP_DTYPES, autocast_model
from nbtoolkit.optimizations.checkpoint import check_module, checkpoint_blocks, resolve_blocks
from nbtoolkit.optimizations.compile import compile_model, compile_options
from nbtoolkit.optimizations.measure import Progress, check_step, measure_step
from nbtoolkit.optimizations.recompute import plan_recompute
from nbtoolkit.units import format_bytes, parse_bytes

__all__ = ["ENV_BUDGET", "ENV_RECOMPUTE", "optimize", "settings_from_env"]

ENV_RECOMPUTE = "NBTOOLKIT_RECOMPUTE"
ENV_BUDGET = "NBTOOLKIT_MEMORY_BUDGET"


def settings_from_env(recompute: Any, budget_bytes: Any) -> tuple[Any, int | None]:
    """(recompute, budget) after applying the environment switch to arguments left as None."""
    if recompute is None:
        raw = os.environ.get(ENV_RECOMPUTE, "").strip().lower()
        if raw == "auto":
            recompute = "auto"
        elif raw not in {"", "none", "off", "0", "false", "no"}:
            raise NbtUsageError(
                f"{ENV_RECOMPUTE}={os.environ[ENV_RECOMPUTE]!r} is not understood: set it to 'auto' "
                "(plan recomputation under NBTOOLKIT_MEMORY_BUDGET) or 'off'"
            )
    budget = None
    if budget_bytes is not None:
        budget = parse_bytes(budget_bytes)
    elif os.environ.get(ENV_BUDGET, "").strip():
        budget = parse_bytes(os.environ[ENV_BUDGET], what=f"{ENV_BUDGET}")
    return recompute, budget


def optimize(
    model: Any,
    step: Any,
    *,
    compile: bool | str | dict[str, Any] = False,
    recompute: str | Sequence[str] | None = None,
    budget_bytes: int | float | str | None = None,
    amp: str | None = None,
    steps: int = 5,
    warmup: int = 2,
    undo: bool = True,
    categories: bool = True,
    progress: Progress | None = None,
    metrics: bool = True,
    tokens_per_step: int | None = None,
) -> Comparison:
    """Measure ``step``, apply the requested changes to ``model``, measure again; a :class:`Comparison`.

    Args:
        model: the ``torch.nn.Module`` that ``step`` trains.
        step: zero-argument callable running one training step; returns the loss or None.
        compile: False; True (torch.compile defaults); a mode name; or a dict of torch.compile
            options (``mode``, ``fullgraph``, ``dynamic``, ``backend``, ``options``).
        recompute: None (no checkpointing); ``"auto"`` (plan under ``budget_bytes`` with
            :func:`~nbtoolkit.optimizations.recompute.plan_recompute`); or a list of module names
            to checkpoint.
        budget_bytes: peak step memory for ``recompute="auto"`` (bytes or ``"1.5GB"``).
        amp: None, ``"bf16"`` or ``"fp16"`` (autocast around the forward).
        steps, warmup: timed steps and warm-up steps of each measurement.
        undo: restore the model at the end (default); False keeps the changes (``.applied``).
        categories: also measure the peak by torch memory category (one more profiled step each).
        progress: ``progress(done, total, what)`` while measuring.
        metrics: also count each configuration's FLOPs (one more step each) and show model and
            hardware FLOPs, achieved FLOP/s, MFU and HFU (``nbt.step_metrics``) in the table.
        tokens_per_step: tokens one step processes, for tokens/s (with ``metrics``).

    Both measurements start from the same weights: the model's parameters and buffers are
    copied (to the CPU) before the baseline and put back before the second measurement and
    again at the end. So the first loss of each measurement is computed
    from identical weights and shows whether the changes alter what the step computes, and the
    model's weights are as they were afterwards. Optimizer state (e.g. Adam's moments) lives in
    the step and is not restored: it has advanced by the measured steps.
    The environment switch and the order of changes are described in the module docstring.
    Bad input raises NbtUsageError (PlanError when no plan fits) and leaves the model as it was.
    """
    module = check_module(model)
    check_step(step)
    recompute, budget = settings_from_env(recompute, budget_bytes)
    compile_opts = compile_options(compile)
    if amp is not None and amp not in AMP_DTYPES:
        raise NbtUsageError(f"amp must be None, 'bf16' or 'fp16', got {amp!r}")
    names: list[str] | None = None
    if recompute is None:
        pass
    elif isinstance(recompute, str) and recompute == "auto":
        if budget is None:
            raise NbtUsageError(
                f"recompute='auto' needs a memory budget: pass budget_bytes=... or set {ENV_BUDGET}=1.5GB"
            )
    elif isinstance(recompute, str):
        raise NbtUsageError(f"recompute must be None, 'auto' or a list of module names, got {recompute!r}")
    else:
        names = list(recompute)
        resolve_blocks(module, names)  # fail before measuring anything

    plan_runs = 0
    if recompute == "auto":
        plan_runs = 10
    runs_each = warmup + steps + 1 + (1 if metrics else 0)
    total = runs_each * 2 + plan_runs
    offset = 0

    def staged(what: str) -> Progress | None:
        if progress is None:
            return None

        def report(done: int, of: int, label: str) -> None:
            progress(min(offset + done, total), total, label)

        return report

    initial_state = _copy_state(module)
    before = measure_step(
        step, label="before", steps=steps, warmup=warmup, categories=categories,
        config={"compile": None, "recompute": [], "amp": None}, progress=staged("before"),
        flops=metrics, tokens_per_step=tokens_per_step,
    )
    offset += runs_each
    plan = None
    applied = Applied()
    notes: list[str] = []
    try:
        if recompute == "auto":
            assert budget is not None
            plan_progress: Progress | None = None
            if progress is not None:
                report = progress

                def plan_progress(done: int, of: int, what: str) -> None:
                    report(offset + round(plan_runs * done / max(of, 1)), total, f"plan: {what}")

            plan = plan_recompute(module, step, budget, steps=2, progress=plan_progress)
            names = list(plan.blocks)
            if not names:
                notes.append(
                    f"the baseline peak {format_bytes(plan.baseline_peak_bytes)} already fits the budget "
                    f"{format_bytes(budget)}: nothing to recompute"
                )
        offset += plan_runs
        if names:
            applied.extend(checkpoint_blocks(module, names))
        if amp is not None:
            applied.extend(autocast_model(module, amp))
        if compile_opts is not None:
            applied.extend(compile_model(module, **compile_opts))
        _restore_state(module, initial_state)  # planning ran steps too: start "after" where "before" did
        after = measure_step(
            step, label="after", steps=steps, warmup=warmup, categories=categories,
            compiled=compile_opts is not None,
            config={"compile": compile_opts, "recompute": names or [], "amp": amp},
            progress=staged("after"),
            flops=metrics, tokens_per_step=tokens_per_step,
        )
    except BaseException:
        applied.undo()
        _restore_state(module, initial_state)
        raise
    _restore_state(module, initial_state)  # measuring must not train the user's model
    if budget is not None and recompute == "auto" and after.peak_bytes > budget:
        notes.append(
            f"measured peak {format_bytes(after.peak_bytes)} is over the budget {format_bytes(budget)} "
            "with all changes applied (compile/AMP change memory too)"
        )
    changes = list(applied.changes)
    if names:
        # one line for the whole set of checkpointed blocks reads better than one per block
        changes = [c for c in changes if not c.startswith("checkpoint ")]
        changes.insert(0, f"checkpoint {len(names)} block(s): {', '.join(names)}")
    if undo:
        applied.undo()
        handle = None
    else:
        handle = applied
    return Comparison(before=before, after=after, changes=changes, plan=plan, notes=notes, applied=handle)


def _copy_state(module: Any) -> dict[str, Any]:
    """A CPU copy of the module's parameters and buffers (not on the device: no extra device memory)."""
    return {name: value.detach().to("cpu", copy=True) for name, value in module.state_dict().items()}


def _restore_state(module: Any, state: dict[str, Any]) -> None:
    """Put the copied values back in place, so the tensors (and optimizers holding them) stay the same."""
    import torch

    with torch.no_grad():
        for name, value in module.state_dict().items():
            value.copy_(state[name])
