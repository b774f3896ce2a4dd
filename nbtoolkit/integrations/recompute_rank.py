"""What runs on each rank of a recompute plan under a wrapper that shards the model across ranks
(DeepSpeed ZeRO: :func:`~nbtoolkit.integrations.deepspeed.recompute.zero_plan_recompute`; FSDP2:
:func:`~nbtoolkit.integrations.fsdp2.recompute.fsdp2_plan_recompute`).

One call per wrapper configuration (a ZeRO stage, an FSDP2 setting), on every rank at once, with
the model already wrapped (:func:`plan_on_rank` takes the wrapped module and its training step):

1. measure the candidate blocks on this rank (``measure_recompute_costs``: savings, recompute
   times, phases, and what this rank holds outside the step, which each wrapper shards in its
   own way);
2. gather every rank's measurements; rank 0 solves one plan per budget on the worst case
   over ranks (``RecomputeCosts.worst_of``) and broadcasts it, so every rank applies the same
   blocks;
3. apply each plan, measure every rank's total peak and step time, and re-plan under a lowered
   budget while the largest rank is over it (at most three times), as ``plan_recompute`` does;
   if still over, take the fastest plan measured under the budget (checkpointing every block
   is always measured).

Collectives happen in the same order on every rank: every decision is made on rank 0 and
broadcast, never recomputed on each rank from floating-point results.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.core.step_runner import call_step, run_steps

__all__ = ["plan_on_rank"]

#: Re-plans after the largest rank measured over the budget.
_VERIFY_ATTEMPTS = 3


def _gathered(value: Any) -> list[Any]:
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def _from_rank0(value: Any) -> Any:
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _fastest_measured_fit(row: dict[str, Any], measured: dict[tuple[str, ...], Any], budget: int) -> None:
    """When the model's plans all measured over the budget, the fastest plan that *measured* under it.

    The memory model can under-predict where a stage re-gathers or re-buckets during
    recomputation (ZeRO-3 gathers a block's parameters again for its recompute); every rank
    holds the same gathered measurements (checkpointing nothing and every block are always
    among them), so every rank makes the same choice.
    """
    fits = [(max(v["step_time_s"]), blocks) for blocks, v in measured.items() if max(v["peak"]) <= budget]
    if not fits:
        row["notes"].append("no measured plan fits either, not even checkpointing every block")
        return
    _, blocks = min(fits)
    row.update(blocks=list(blocks), measured=measured[blocks])
    row["notes"].append(
        "the memory model under-predicted this stage's peak: chose the fastest plan measured under the budget"
    )


def plan_on_rank(
    module: Any,
    step: Callable[[], float],
    *,
    budgets: Sequence[int],
    blocks: Sequence[str] | None,
    steps: int,
    timing: MeasureConfig,
) -> dict[str, Any]:
    """Measure, plan (one plan for all ranks per budget) and verify ``step`` of the wrapped ``module``.

    Returns this rank's ``costs`` and, per budget, the plan's blocks, predicted peak (worst
    rank), every rank's measured total peak and step time, or the PlanError text.
    """
    import torch.distributed as dist

    from nbtoolkit.core.device_memory import model_gpu
    from nbtoolkit.core.errors import PlanError
    from nbtoolkit.recompute.blocks import candidate_blocks
    from nbtoolkit.recompute.checkpoint import checkpoint_blocks
    from nbtoolkit.recompute.costs import RecomputeCosts
    from nbtoolkit.recompute.measure import profile_memory_series
    from nbtoolkit.recompute.plan_measure import measure_recompute_costs
    from nbtoolkit.recompute.solver import solve_recompute

    rank = dist.get_rank()
    candidates = candidate_blocks(module, list(blocks) if blocks else None)
    names = candidates.names
    gpu = model_gpu(module)
    costs = measure_recompute_costs(step, candidates, device=gpu, steps=steps, tick=lambda _: None)
    everyone = _gathered(costs)  # a collective: every rank calls it
    merged = RecomputeCosts.worst_of(everyone) if rank == 0 else None
    measured: dict[tuple[str, ...], dict[str, list[Any]]] = {}

    def measure(chosen: tuple[str, ...]) -> dict[str, list[Any]]:
        """Every rank's total peak, median step time and last loss with ``chosen`` checkpointed."""
        if chosen not in measured:
            with checkpoint_blocks(module, list(chosen)):
                call_step(step, "warm-up step under the new wrappers")
                series, _, _ = profile_memory_series(step, total=True, device=gpu)
                timed = run_steps(step, dataclasses.replace(timing, warmup=0), device=gpu)
            mine = (
                series.total_peak_bytes or series.peak_bytes, statistics.median(timed.times_s),
                float(timed.value),
            )
            peaks, medians, losses = zip(*_gathered(mine), strict=True)
            measured[chosen] = {"peak": list(peaks), "step_time_s": list(medians), "loss": list(losses)}
        return measured[chosen]

    reference = {"none": measure(()), "all": measure(tuple(names))}
    plans = []
    for budget in budgets:
        decision = None
        if rank == 0:
            assert merged is not None
            try:
                plan = solve_recompute(merged, int(budget))
                decision = {"blocks": list(plan.blocks), "predicted": plan.predicted_peak_bytes}
            except PlanError as exc:
                decision = {"error": str(exc)}
        decision = _from_rank0(decision)
        row: dict[str, Any] = {"budget_bytes": int(budget), **decision, "notes": []}
        for _attempt in range(_VERIFY_ATTEMPTS if "blocks" in row else 0):
            result = measure(tuple(row["blocks"]))
            row.update(measured=result)
            worst = max(result["peak"])
            if worst <= budget:
                break
            tighter = None
            if rank == 0:
                assert merged is not None
                lowered = int(budget) - max(worst - row["predicted"], 1024)
                try:
                    plan = solve_recompute(merged, lowered)
                    tighter = {"blocks": list(plan.blocks), "predicted": plan.predicted_peak_bytes}
                except PlanError:
                    tighter = None
            tighter = _from_rank0(tighter)
            if tighter is None or set(tighter["blocks"]) == set(row["blocks"]):
                row["notes"].append("measured over the budget; no plan with a lower prediction exists")
                break
            row["notes"].append(
                f"the largest rank measured {worst:,} bytes, over the budget: re-planned with the "
                "budget lowered by the overshoot"
            )
            row.update(tighter)
        if "measured" in row and max(row["measured"]["peak"]) > budget:
            _fastest_measured_fit(row, measured, int(budget))
        plans.append(row)
    return {"costs": costs, "reference": reference, "plans": plans, "blocks": names}
