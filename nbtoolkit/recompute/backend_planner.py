"""Plan recomputation under the backend that will run the step: torch.compile (any backend and
mode) or eager, with per-block choices keep / selective / full (/ offload on a GPU), and under
compile torch's own partitioner budget as a second route.

Why a planner of its own: under torch.compile the partitioner decides again what to save, so a
plan measured in eager mode does not carry over (``benchmarks/recompute_quality.py`` measured an
eager plan 13% over torch's own peak under compile). And a compiled step is one graph whose
inside no hook sees, so the phase model of ``nbtoolkit.recompute.planner`` cannot be measured
there. Everything here is measured as a whole step with the backend applied.

Algorithm (:meth:`BackendPlanner.plan`), every number measured with the backend applied (each
*setting*, a choice per block and a partitioner budget, is applied, the model compiled afresh,
two warm-up steps run, then one profiled step gives the peak and ``steps`` steps the time, the
fastest of them: load only ever adds time):

1. **Baseline**: nothing recomputed.
2. **Costs per choice**: blocks of the same class and parameter shapes form a group (the layers of
   a transformer); for each group and each choice, the setting with every member so chosen. A
   member's saving is the drop in peak divided by the group's size, its cost the rise in step time
   divided likewise (a rise lost in noise counts 0). One setting per group and choice, not per
   block: the members of a group save and cost alike, and measuring them together is the larger,
   less noisy signal.
3. **Solve**: the exact per-block choice ILP of ``nbtoolkit.recompute.choice_solver`` (each block
   exactly one choice, the fastest plan whose predicted peak fits).
4. **Verify**: the chosen setting is measured; while its peak is over the budget, re-solve with the
   budget lowered by the overshoot (three times at most). Savings need not add up exactly under a
   compiler (nor in eager mode, where one block's recomputation can move the peak), so up to
   :data:`FRONT_TRIES` more settings are measured: the plan with one block stepped down
   (full -> selective or keep, selective -> keep) when the chosen plan fits (kept if it still fits
   and runs faster), the front's lowest plans when it does not.
5. **Partitioner route** (under compile, backends with the min-cut partitioner, ``route`` "auto"
   or "partitioner"): torch's ``activation_memory_budget`` (a fraction 0..1) is searched by
   bisection against the *measured* peak for the highest fraction that fits, in
   :data:`BISECTION_STEPS` halvings from 0.5 (a fit goes higher, an overshoot lower), then 0 (the
   least torch keeps) if nothing fit. Torch's peak is not monotone in the fraction
   (pytorch#197838; here too: 0 measured above the baseline on a small transformer), so every probe
   that fits is a candidate and the fastest measured wins.
6. **Route**: of the block plan and the partitioner's best, the one measured faster at the budget
   (the plan's notes say which, with both times).

Measured settings are cached, so planning for several budgets (:meth:`BackendPlanner.plans`)
measures steps 1-2 once. Over budgets given from high to low a lower budget never gets a higher
measured peak: when its own plan measures higher than the plan of the budget above (which then
fits it too), that plan is taken instead and a note says so.

Offload (``torch.autograd.graph.save_on_cpu``) is offered only where the model is on a CUDA
device; on the CPU the plan says in one note that it was not offered.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import PlanError
from nbtoolkit.core.units import format_bytes, format_seconds
from nbtoolkit.recompute.apply_compile import compile_model
from nbtoolkit.recompute.blocks import Candidates
from nbtoolkit.recompute.choice_solver import choice_front, predict_choice_peak, solve_choices
from nbtoolkit.recompute.measure import profile_memory_series, run_step
from nbtoolkit.recompute.selective import apply_choices, partitioner_budget

if TYPE_CHECKING:
    import torch

    from nbtoolkit.recompute.plan import RecomputePlan

__all__ = ["BISECTION_STEPS", "ROUTES", "BackendPlanner"]

ROUTES = ("auto", "blocks", "partitioner")

#: Halvings of the partitioner search between the fraction 0 and 1 (after probing 0).
BISECTION_STEPS = 3
_VERIFY_ATTEMPTS = 3
#: More plans of the front measured after the ILP's (``BackendPlanner._front_walk``).
FRONT_TRIES = 4
_WARMUP = 2
#: Backends whose partitioner honours activation_memory_budget (the min-cut partitioner).
_MIN_CUT_BACKENDS = ("inductor", "aot_eager_decomp_partition")


@dataclasses.dataclass(frozen=True)
class Measured:
    peak_bytes: int
    step_time_s: float


class BackendPlanner:
    """Measures settings under one backend and plans from them (module docstring)."""

    def __init__(
        self,
        module: torch.nn.Module,
        step: Callable[[], Any],
        candidates: Candidates,
        *,
        compile_options: dict[str, Any] | None,
        total: bool = True,
        steps: int = 3,
        route: str = "auto",
        tick: Callable[[str], None] | None = None,
    ) -> None:
        import torch

        self.module = module
        self.step = step
        self.candidates = candidates
        self.compile_options = compile_options
        self.total = total
        self.steps = max(3, steps)
        self.route = route
        self.tick = tick or (lambda what: None)
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        self.gpu = device if device.type == "cuda" else None
        self.offered = ("selective", "full", "offload") if self.gpu is not None else ("selective", "full")
        self._cache: dict[tuple[tuple[str, ...], float | None], Measured] = {}
        self._table: tuple[list[dict[str, float]], list[dict[str, float]]] | None = None

    # ---- measuring ----
    @property
    def backend(self) -> str:
        if self.compile_options is None:
            return "eager"
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(self.compile_options.items()))
        return f"torch.compile({shown})"

    @property
    def partitioner_usable(self) -> bool:
        if self.compile_options is None:
            return False
        return str(self.compile_options.get("backend", "inductor")) in _MIN_CUT_BACKENDS

    def measure(self, choices: Sequence[str], fraction: float | None = None) -> Measured:
        """Peak and step time of one setting (cached): the blocks as ``choices`` says, torch's
        partitioner budget at ``fraction`` (None: torch's default), the backend applied afresh."""
        import torch

        key = (tuple(choices), fraction)
        if key in self._cache:
            return self._cache[key]
        names = self.candidates.names
        applied = apply_choices(self.candidates.blocks, dict(zip(names, choices, strict=True)))
        try:
            if fraction is not None:
                applied.extend(partitioner_budget(fraction))
            if self.compile_options is not None:
                applied.extend(compile_model(self.module, **self.compile_options))
            for _ in range(_WARMUP):
                run_step(self.step, "warm-up step")
            series = profile_memory_series(self.step, total=self.total, device=self.gpu)[0]
            whole = series.total_peak_bytes
            peak = whole if self.total and whole is not None else series.peak_bytes
            times = [self._timed() for _ in range(self.steps)]
        finally:
            applied.undo()
            if self.compile_options is not None:
                torch._dynamo.reset()  # the next setting compiles afresh
        result = Measured(int(peak), min(times))
        self._cache[key] = result
        self.tick(f"measured {self._describe(choices, fraction)}")
        return result

    def _timed(self) -> float:
        """One step's seconds: processor time on the CPU (not inflated by waiting for a busy core),
        synchronised wall time on a GPU."""
        import torch

        if self.gpu is None:
            start = time.process_time()
            run_step(self.step, "timed step")
            return time.process_time() - start
        torch.cuda.synchronize(self.gpu)
        begin = time.perf_counter()
        run_step(self.step, "timed step")
        torch.cuda.synchronize(self.gpu)
        return time.perf_counter() - begin

    def _describe(self, choices: Sequence[str], fraction: float | None) -> str:
        changed = sum(c != "keep" for c in choices)
        what = f"{changed} block(s) recomputed" if changed else "nothing recomputed"
        return what + (f", activation_memory_budget={fraction:.3f}" if fraction is not None else "")

    def table(self) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
        """Per block, choice -> bytes saved and choice -> seconds added (steps 1-2)."""
        if self._table is not None:
            return self._table
        names = self.candidates.names
        base = self.measure(["keep"] * len(names))
        saved: list[dict[str, float]] = [{} for _ in names]
        cost: list[dict[str, float]] = [{} for _ in names]
        for members in self._groups():
            for choice in self.offered:
                setting = [choice if i in members else "keep" for i in range(len(names))]
                got = self.measure(setting)
                for i in members:
                    saved[i][choice] = (base.peak_bytes - got.peak_bytes) / len(members)
                    cost[i][choice] = max(0.0, got.step_time_s - base.step_time_s) / len(members)
        self._table = (saved, cost)
        return self._table

    def measured_table(self) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
        """:meth:`table` when measured, else no per-block costs (the partitioner route alone
        measures none)."""
        if self._table is not None:
            return self._table
        n = len(self.candidates.names)
        return [{} for _ in range(n)], [{} for _ in range(n)]

    def _groups(self) -> list[list[int]]:
        groups: dict[Any, list[int]] = {}
        for i, block in enumerate(self.candidates.blocks.values()):
            shapes = tuple(tuple(p.shape) for p in block.parameters())
            groups.setdefault((type(block).__name__, shapes), []).append(i)
        return list(groups.values())

    # ---- planning ----
    def plans(self, budgets: Sequence[int]) -> list[RecomputePlan]:
        """One plan per budget, the budgets taken from high to low, measured peaks never rising as
        the budget falls (module docstring); returned in the order given."""
        order = sorted(range(len(budgets)), key=lambda k: -budgets[k])
        made: dict[int, RecomputePlan] = {}
        above: RecomputePlan | None = None
        for k in order:
            plan = self.plan(int(budgets[k]))
            if above is not None and _peak(plan) > _peak(above):
                plan = dataclasses.replace(
                    above, budget_bytes=int(budgets[k]),
                    notes=[*above.notes, (
                        f"the plan made for this budget measured {format_bytes(_peak(plan))}, above the "
                        f"{format_bytes(_peak(above))} of the plan for the higher budget "
                        f"{format_bytes(above.budget_bytes)}: that plan is taken (a lower budget never "
                        "gets a higher peak)"
                    )],
                )
            made[k] = plan
            above = plan
        return [made[k] for k in range(len(budgets))]

    def plan(self, budget: int | None) -> RecomputePlan:
        """The fastest measured plan whose measured peak fits ``budget`` (None: keep everything,
        with the table and the front measured)."""
        if self.route != "partitioner":
            self.table()
        n = len(self.candidates.names)
        base = self.measure(["keep"] * n)
        notes = [] if self.gpu is not None else [
            ("offload (saved activations to host memory) was not offered: it needs a GPU, and the model "
            "is on the CPU")
        ]
        if budget is None or base.peak_bytes <= budget:
            chosen = ["keep"] * n
            return self._plan(chosen, base, budget or base.peak_bytes, base, notes, route="blocks")
        blocks = self._block_plan(budget, base, notes)
        partition = self._partitioner_plan(budget, notes) if self._searching() else None
        candidates = [c for c in (blocks, partition) if c is not None and c[1].peak_bytes <= budget]
        if not candidates:
            lowest = min(m.peak_bytes for m in self._cache.values())
            raise PlanError(
                f"no recomputation plan measured under a budget of {format_bytes(budget)} "
                f"with {self.backend}: "
                f"the lowest measured peak was {format_bytes(lowest)} "
                f"({'the device total' if self.total else 'the step'}). Raise the budget, name smaller "
                "blocks with blocks=[...], or train with a smaller batch or in bf16"
            )
        choices, measured, fraction = min(candidates, key=lambda c: c[1].step_time_s)
        route = "partitioner" if fraction is not None else "blocks"
        if blocks is not None and partition is not None:
            notes.append(_route_note(route, blocks[1], partition[1], partition[2], budget))
        return self._plan(choices, measured, budget, base, notes, route=route, fraction=fraction)

    def _searching(self) -> bool:
        return self.route in ("auto", "partitioner") and self.partitioner_usable

    def _block_plan(
        self, budget: int, base: Measured, notes: list[str]
    ) -> tuple[list[str], Measured, None] | None:
        if self.route == "partitioner":
            return None
        saved, cost = self.table()
        target = budget
        best: tuple[list[str], Measured, None] | None = None
        for _attempt in range(_VERIFY_ATTEMPTS):
            choices = solve_choices(base.peak_bytes, saved, cost, target)
            if choices is None:
                break
            measured = self.measure(choices)
            best = (choices, measured, None)
            if measured.peak_bytes <= budget:
                break
            overshoot = measured.peak_bytes - predict_choice_peak(base.peak_bytes, saved, choices)
            notes.append(
                f"block plan measured {format_bytes(measured.peak_bytes)}, over the budget: re-planned with "
                f"the budget lowered by {format_bytes(max(overshoot, 1024))}"
            )
            target -= max(overshoot, 1024)
        return self._front_walk(best, budget, base)

    def _front_walk(
        self, best: tuple[list[str], Measured, None] | None, budget: int, base: Measured
    ) -> tuple[list[str], Measured, None] | None:
        """Savings need not add up exactly (a compiler, or where the peak falls), so up to
        :data:`FRONT_TRIES` more settings are measured. When the ILP's plan fits: the plan with one
        block stepped down (full -> selective or keep, selective or offload -> keep), the step that gave up
        the least saving first, kept when it still measures under the budget and runs faster (then
        stepping down from there). When it does not fit: the front's lowest plans."""
        saved, cost = self.table()
        tries = 0
        if best is not None and best[1].peak_bytes <= budget:
            improved = True
            while improved and tries < FRONT_TRIES:
                improved = False
                for variant in _stepped_down(best[0], saved):
                    cached = (tuple(variant), None) in self._cache  # measured already: free
                    if not cached and tries >= FRONT_TRIES:
                        break
                    tries += 0 if cached else 1
                    got = self.measure(variant)
                    if got.peak_bytes <= budget and got.step_time_s < best[1].step_time_s:
                        best, improved = (variant, got, None), True
                        break
            return best
        front = choice_front(base.peak_bytes, saved, cost)[1:]  # without "keep everything"
        lowest = sorted(front, key=lambda p: predict_choice_peak(base.peak_bytes, saved, p))
        for choices in lowest[:FRONT_TRIES]:
            got = self.measure(choices)
            better = best is None or best[1].peak_bytes > budget or got.step_time_s < best[1].step_time_s
            if got.peak_bytes <= budget and better:
                best = (choices, got, None)
        return best

    def _partitioner_plan(self, budget: int, notes: list[str]) -> tuple[list[str], Measured, float] | None:
        keep = ["keep"] * len(self.candidates.names)
        fits: dict[float, Measured] = {}
        lo, hi = 0.0, 1.0  # the default 1.0 is the baseline, measured over the budget already
        for _ in range(BISECTION_STEPS):
            mid = round((lo + hi) / 2, 6)
            got = self.measure(keep, mid)
            if got.peak_bytes <= budget:
                fits[mid] = got
                lo = mid
            else:
                hi = mid
        if not fits:  # the least torch can keep, last: its peak need not be the lowest (pytorch#197838)
            got = self.measure(keep, 0.0)
            if got.peak_bytes <= budget:
                fits[0.0] = got
        if not fits:
            lowest = min(self.measure(keep, f).peak_bytes for f in self._probed())
            notes.append(
                f"torch's partitioner did not reach the budget: its lowest measured peak was "
                f"{format_bytes(lowest)} over activation_memory_budget {', '.join(map(str, self._probed()))}"
            )
            return None
        fraction = min(fits, key=lambda f: fits[f].step_time_s)
        return keep, fits[fraction], fraction

    def _probed(self) -> list[float]:
        return sorted(f for (_, f) in self._cache if f is not None)

    def _plan(
        self,
        choices: list[str],
        measured: Measured,
        budget: int,
        base: Measured,
        notes: list[str],
        *,
        route: str,
        fraction: float | None = None,
    ) -> RecomputePlan:
        saved, cost = self.measured_table()
        front = choice_front(base.peak_bytes, saved, cost)
        return build_plan(
            self, choices, measured=measured, budget=budget, base=base, notes=notes, route=route,
            fraction=fraction, front=front,
        )


#: What a block's choice may step down to, from most to least recomputation.
_STEP_DOWN = {"full": ("selective", "keep"), "selective": ("keep",), "offload": ("keep",)}


def _stepped_down(choices: list[str], saved: list[dict[str, float]]) -> list[list[str]]:
    """``choices`` with one block stepped down to a cheaper choice (full to selective or keep,
    selective or offload to keep), the one giving up the least saving first."""
    variants = []
    for i, choice in enumerate(choices):
        for lower in _STEP_DOWN.get(choice, ()):
            if lower != "keep" and lower not in saved[i]:
                continue
            lost = saved[i].get(choice, 0.0) - saved[i].get(lower, 0.0)
            variants.append((lost, [*choices[:i], lower, *choices[i + 1:]]))
    return [v for _, v in sorted(variants, key=lambda pair: pair[0])]


def _peak(plan: RecomputePlan) -> int:
    measured = plan.measured_peak_bytes
    return int(measured if measured is not None else plan.predicted_peak_bytes)


def _route_note(route: str, blocks: Measured, partition: Measured, fraction: float, budget: int) -> str:
    """Which route won at the budget, with both measured results."""
    block_text = f"the block plan {format_bytes(blocks.peak_bytes)} in {format_seconds(blocks.step_time_s)}"
    torch_text = (
        f"torch's partitioner at activation_memory_budget={fraction:.3f} "
        f"{format_bytes(partition.peak_bytes)} in {format_seconds(partition.step_time_s)}"
    )
    over = [what for what, m in (("block plan", blocks), ("partitioner", partition)) if m.peak_bytes > budget]
    why = f" ({' and '.join(over)} over the budget)" if over else " (both fit the budget; the faster wins)"
    chosen = "torch's partitioner" if route == "partitioner" else "the block plan"
    return f"route: {chosen}. Measured {block_text}; {torch_text}{why}"


def build_plan(
    planner: BackendPlanner,
    choices: list[str],
    *,
    measured: Measured,
    budget: int,
    base: Measured,
    notes: list[str],
    route: str,
    fraction: float | None,
    front: list[list[str]],
) -> RecomputePlan:
    import pandas as pd

    from nbtoolkit.recompute.plan import RecomputePlan

    saved, cost = planner.measured_table()
    names = planner.candidates.names
    modules = [type(m).__name__ for m in planner.candidates.blocks.values()]
    why = [_why(choices[i], saved[i], cost[i], route, fraction) for i in range(len(names))]
    candidates = pd.DataFrame({
        "block": names,
        "module": modules,
        "saved_bytes": [round(s.get("full", 0)) for s in saved],
        "recompute_time_s": [float(c.get("full", 0.0)) for c in cost],
        "recompute_time_p25_s": [float(c.get("full", 0.0)) for c in cost],
        "recompute_time_p75_s": [float(c.get("full", 0.0)) for c in cost],
        "forward_time_s": [0.0] * len(names),
        "chosen": [c == "full" for c in choices],
        "selective_saved_bytes": [round(s.get("selective", 0)) for s in saved],
        "selective_time_s": [float(c.get("selective", 0.0)) for c in cost],
        "choice": list(choices),
        "why": why,
    })
    rows = [
        {
            "predicted_peak_bytes": predict_choice_peak(base.peak_bytes, saved, plan),
            "predicted_overhead_s": _overhead(cost, plan),
            "predicted_overhead_p25_s": _overhead(cost, plan),
            "predicted_overhead_p75_s": _overhead(cost, plan),
            "n_blocks": sum(c != "keep" for c in plan),
            "blocks": ",".join(n for n, c in zip(names, plan, strict=True) if c == "full"),
            "choices": ",".join(f"{n}:{c}" for n, c in zip(names, plan, strict=True) if c != "keep"),
        }
        for plan in front
    ]
    if route == "partitioner":
        predicted_peak = measured.peak_bytes
        overhead = max(0.0, measured.step_time_s - base.step_time_s)
    else:
        predicted_peak = predict_choice_peak(base.peak_bytes, saved, choices)
        overhead = _overhead(cost, choices)
    return RecomputePlan(
        blocks=[n for n, c in zip(names, choices, strict=True) if c == "full"],
        budget_bytes=int(budget),
        predicted_peak_bytes=int(predicted_peak),
        predicted_overhead_s=overhead,
        predicted_overhead_p25_s=overhead,
        predicted_overhead_p75_s=overhead,
        baseline_peak_bytes=int(base.peak_bytes),
        baseline_step_time_s=float(base.step_time_s),
        candidates=candidates,
        tradeoff=pd.DataFrame(rows),
        phases=pd.DataFrame(
            {"phase": [0], "baseline_bytes": [int(base.peak_bytes)], "alive": [tuple(names)]}
        ),
        measured_peak_bytes=int(measured.peak_bytes),
        solver=f"per-block choice ILP (PuLP + CBC), every setting measured under {planner.backend}",
        notes=list(notes),
        fixed_bytes=0,
        budget_kind="total" if planner.total else "step",
        choices=dict(zip(names, choices, strict=True)),
        backend=planner.backend,
        route=route,
        activation_memory_budget=fraction,
        measured_step_time_s=float(measured.step_time_s),
    )


def _overhead(cost: list[dict[str, float]], choices: list[str]) -> float:
    return float(sum(cost[i].get(c, 0.0) for i, c in enumerate(choices)))


def _why(
    choice: str, saved: dict[str, float], cost: dict[str, float], route: str, fraction: float | None
) -> str:
    """One block's line: what it does and what that saves and costs (measured), against the others."""
    if route == "partitioner":
        return f"torch's partitioner decides what to save (activation_memory_budget={fraction:.3f})"
    options = "; ".join(
        f"{c} saves {format_bytes(round(saved[c]))} for +{format_seconds(cost.get(c, 0.0))}"
        for c in saved if c != choice
    )
    if choice == "keep":
        return f"the budget is met without it ({options})"
    return (
        f"saves {format_bytes(round(saved.get(choice, 0)))} for +{format_seconds(cost.get(choice, 0.0))}"
        + (f" ({options})" if options else "")
    )
