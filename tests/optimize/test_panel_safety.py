"""The optimize panel's logic without a kernel or a browser (issue 41): fast, real widgets objects.

The budget takes any size and says why no plan fits below the floor; the panel chooses the blocks
``plan_recompute`` chooses; one measurement at a time; an interrupt is reported with what was
measured; the result is one static output marked stale when the controls move; torch's native
lines are caught; the headline speaks of one peak with the budget's verdict. The browser test
(tests/browser/test_optimize_panel_in_jupyterlab.py) does the same through JupyterLab.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError, PlanError
from nbtoolkit.recompute.comparison import Comparison, Measurement
from nbtoolkit.recompute.costs import RecomputeCosts
from nbtoolkit.recompute.panel import OptimizePanel
from nbtoolkit.recompute.panel_model import (
    MIB,
    Choice,
    ProgressLog,
    budget_text,
    headline,
    progress_text,
    read_budget,
    result_bundle,
    slider_range,
)
from nbtoolkit.recompute.plan import RecomputePlan
from nbtoolkit.recompute.solver import plan_for_budget, solve_recompute

BLOCKS = [f"blocks.{i}" for i in range(4)]


def _costs(times: tuple[float, ...] = (0.002, 0.001, 0.003, 0.0015)) -> RecomputeCosts:
    """A step like the issue's: 14.3 MiB without recomputation, parameters and AdamW state fixed."""
    levels = [2.0, 4.5, 7.0, 9.0, 10.8]  # MiB per phase; phase p has the first p blocks alive
    return RecomputeCosts(
        blocks=BLOCKS,
        saved_bytes=[round(s * MIB) for s in (1.6, 1.7, 1.5, 1.8)],
        recompute_time_s=times,
        phase_bytes=[round(v * MIB) for v in levels],
        phase_alive=[set(BLOCKS[:p]) for p in range(5)],
        modules=["Block"] * 4,
        baseline_step_time_s=0.018,
        fixed_bytes=round(3.5 * MIB),
        fixed_by_category={"parameter": MIB // 2, "optimizer_state": MIB, "gradient": MIB // 2},
    )


@pytest.fixture(scope="module")
def plan() -> RecomputePlan:
    return solve_recompute(_costs(), None)


@pytest.fixture
def panel(plan: RecomputePlan) -> OptimizePanel:
    return OptimizePanel(torch.nn.Linear(2, 2), lambda: None, plan, steps=1, warmup=0)


def _measurement(label: str, seconds: float, total: int, step: int) -> Measurement:
    return Measurement(label=label, step_time_s=seconds, step_time_spread_s=seconds / 50,
                       step_times_s=[seconds * f for f in (0.99, 1.0, 1.01)], peak_bytes=step,
                       total_peak_bytes=total)


def _comparison(after_total: float = 10.53) -> Comparison:
    before = _measurement("before", 0.018, round(14.30 * MIB), round(11.20 * MIB))
    after = _measurement("after", 0.022, round(after_total * MIB), round(7.43 * MIB))
    return Comparison(before=before, after=after, changes=["checkpoint 2 block(s): blocks.0, blocks.1"])


# ---- the budget: any size, exactly as typed ----
def test_the_budget_box_reads_any_size_exactly() -> None:
    assert read_budget("11MiB") == read_budget("11") == read_budget(" 11 MiB ") == 11 * MIB
    assert read_budget("1.5GB") == 1_500_000_000
    assert read_budget("0.5") == MIB // 2  # under any floor: accepted, the panel explains
    assert budget_text(11 * MIB) == "11 MiB" and budget_text(round(10.5 * MIB)) == "10.5 MiB"
    for bad in ("abc", "0", "-3", "nan", "inf", "1.5XB"):
        with pytest.raises(NbtUsageError):
            read_budget(bad)
    low, high = slider_range(round(6.853 * MIB), round(14.301 * MIB))
    assert (low, high) == (6.86, 14.31)  # its lowest stop fits; 11 MiB is a stop (no 10.99)
    assert round((11 - low) * 100, 6) == round((11 - low) * 100)


def test_a_budget_under_the_floor_shows_the_plan_error_and_is_not_clamped(panel: OptimizePanel) -> None:
    panel.set_budget("3")
    assert panel.budget_bytes == 3 * MIB  # not moved up to the floor
    summary = panel.summary.value
    assert "No plan fits" in summary and "checkpointing every candidate still peaks at 7.70 MiB" in summary
    assert "Recomputation cannot lower what the step holds regardless" in summary
    assert "parameters 512.00 KiB" in summary and "optimizer state 1.00 MiB" in summary
    assert panel.button.disabled and panel.predicted() is None
    with pytest.raises(PlanError, match=r"7\.70 MiB"):
        panel.choice()
    panel.set_budget("11MiB")
    assert panel.budget_bytes == 11 * MIB and panel.budget.value == 11.0
    assert "budget <b>11.00 MiB</b>" in panel.summary.value and not panel.button.disabled
    panel.set_budget("twelve")
    assert "cannot read budget &#x27;twelve&#x27;" in panel.summary.value and panel.button.disabled
    assert panel.budget_bytes == 11 * MIB  # the last readable budget is kept


def test_the_slider_sets_the_box_and_the_page_echo_does_not_move_the_budget(panel: OptimizePanel) -> None:
    panel.budget.value = 9.37  # a person drags the slider
    assert panel.budget_text.value == "9.37 MiB" and panel.budget_bytes == round(9.37 * MIB)
    panel.set_budget("9.3712")
    assert panel.budget.value == 9.37
    panel.budget.value = 9.37  # the page echoing the value it was given: the exact budget stays
    assert panel.budget_bytes == round(9.3712 * MIB)


@pytest.mark.parametrize("times", [(0.002, 0.001, 0.003, 0.0015), (0.002, 0.002, 0.002, 0.002)])
def test_the_panel_chooses_the_blocks_plan_recompute_chooses(times: tuple[float, ...]) -> None:
    """Same measurements, same budget: the same blocks (ties included), or the same PlanError."""
    costs = _costs(times)
    start = solve_recompute(costs, None)
    for budget in range(round(7 * MIB), round(15 * MIB), round(0.13 * MIB)):
        assert _outcome(plan_for_budget, start, budget) == _outcome(solve_recompute, costs, budget), budget


def _outcome(solve: Any, *args: Any) -> Any:
    """The blocks a solve chooses, or its PlanError's message."""
    try:
        return solve(*args).blocks
    except PlanError as exc:
        return str(exc)


def test_panel_and_plan_recompute_agree_on_a_real_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the public doors: ``nbt.plan_recompute(model, step, budget)`` and the panel built on
    ``nbt.plan_recompute(model, step, None)``, on the same (fixed) measurements."""
    import nbtoolkit.recompute.planner as planner
    from tests.optimize._models import make_gpt

    costs = _costs((0.002, 0.002, 0.002, 0.002))
    monkeypatch.setattr(planner, "measure_recompute_costs", lambda *a, **k: costs)
    model, step = make_gpt()
    panel = OptimizePanel(model, step, nbt.plan_recompute(model, step, None))
    for mib in ("8.5", "9.9", "11", "12.75"):
        direct = nbt.plan_recompute(model, step, f"{mib}MiB", verify=False)
        panel.set_budget(mib)
        predicted = panel.predicted()
        assert predicted is not None and predicted["blocks"] == direct.blocks, mib


def test_the_figure_stars_the_blocks_the_summary_names(plan: RecomputePlan) -> None:
    """A block that costs nothing (noise clipped to 0) ties with no checkpointing: the star is on the
    solver's choice (none), not on another point of the front with the same overhead."""
    free = solve_recompute(_costs((0.0, 0.001, 0.003, 0.0015)), None)
    panel = OptimizePanel(torch.nn.Linear(2, 2), lambda: None, free)
    panel.set_budget("14.4")
    assert panel.predicted() == {"blocks": [], "predicted_peak_bytes": free.baseline_peak_bytes,
                                 "predicted_overhead_s": 0.0}
    star = panel.shown_figure.data[1]
    assert star.name == "chosen" and star.y[0] == pytest.approx(free.baseline_peak_bytes / MIB)
    assert free.best_for(round(14.4 * MIB))["blocks"] == ["blocks.0"]  # type: ignore[index]  # what it starred
    panel.set_budget("3")
    assert len(panel.shown_figure.data) == 1  # under the floor: no plan starred
    assert panel.shown_figure.layout.shapes[0].y0 == pytest.approx(3.0)  # the budget's line


# ---- one measurement at a time; the outcome always shown ----
def test_a_second_click_while_measuring_does_not_measure_again(panel: OptimizePanel) -> None:
    panel.set_budget("11")
    calls: list[str] = []

    def measure(choice: Choice, log: ProgressLog) -> Comparison:
        calls.append(threading.current_thread().name)
        panel.button.click()  # a second click on the same thread (the page's double click)
        other = threading.Thread(target=panel.button.click)  # and one from a subshell's thread
        other.start()
        other.join()
        assert panel.button.busy
        return _comparison()

    panel._measure = measure  # type: ignore[method-assign]
    seen = panel.button.finished
    panel.button.click()
    assert calls == ["MainThread"] and panel.comparison is not None
    assert not panel.button.busy and panel.button.finished == seen + 1  # every view enables its button
    late = {"event": "run", "seen": seen}  # a click sent before that run ended, delivered after it
    panel.button._on_message(panel.button, late, [])
    assert calls == ["MainThread"]
    panel.button.click()
    assert len(calls) == 2  # a new click after the end measures again


def test_an_interrupt_is_reported_with_what_was_measured(panel: OptimizePanel) -> None:
    panel.set_budget("11")

    def measure(choice: Choice, log: ProgressLog) -> Comparison:
        for done, what in enumerate(("before: warm-up step", "before: timed step", "before: timed step"), 1):
            log.add(done, 10, what)
        raise KeyboardInterrupt

    panel._measure = measure  # type: ignore[method-assign]
    panel.button.click()
    status = panel.status.value
    assert "interrupted" in status and "3 of 10 runs done" in status
    assert "warming up (before) ×1, measuring (before) ×2" in status
    assert panel.progress.description == "interrupted" and panel.progress.bar_style == "warning"
    assert panel.comparison is None and not panel.button.busy


def test_a_step_error_is_shown_and_torch_noise_is_caught(panel: OptimizePanel, capfd: Any) -> None:
    import warnings

    from nbtoolkit.core.errors import StepError

    panel.set_budget("11")

    def measure(choice: Choice, log: ProgressLog) -> Comparison:
        os.write(2, b"[W CPUAllocator.cpp:245] Memory block of unknown size was allocated before ...\n")
        os.write(2, b"a native <line> from torch\n")
        warnings.warn("a warning from torch", UserWarning, stacklevel=1)
        raise StepError("the step 'step' raised RuntimeError during timed step 1: boom")

    panel._measure = measure  # type: ignore[method-assign]
    panel.button.click()
    assert "StepError" in panel.status.value and "boom" in panel.status.value
    messages = panel.messages.value
    assert "a native &lt;line&gt; from torch" in messages and "UserWarning: a warning from torch" in messages
    assert "Memory block of unknown size" not in messages
    assert "Memory block" not in capfd.readouterr().err  # nothing printed in red
    os.write(2, b"stderr is back\n")
    assert "stderr is back" in capfd.readouterr().err


# ---- the result: kept in the cell, one peak, stale when the controls move ----
def test_the_result_is_one_static_output_marked_stale_when_the_plan_changes(panel: OptimizePanel) -> None:
    panel.set_budget("11")
    panel._measure = lambda choice, log: _comparison()  # type: ignore[method-assign]
    panel.button.click()
    kept = panel.output.bundle
    assert kept is not None and "nbt-optimize-result" in kept["text/html"]
    assert "stale" not in kept["text/html"]
    assert "step time (median)" in kept["text/html"] and "OptimizePanel result" in kept["text/plain"]
    assert "within the budget 11.00 MiB" in panel.status.value
    first = panel.output.display_id
    panel.set_budget("14.5")  # the baseline fits: no blocks, another plan
    assert "stale: this result was made for another plan" in panel.output.bundle["text/html"]  # type: ignore[index]
    assert panel.progress.description == "stale"
    panel.set_budget("11")
    assert "stale" not in panel.output.bundle["text/html"]  # type: ignore[index]
    panel.compile.value = True  # compile is part of the plan too
    assert "stale" in panel.output.bundle["text/html"]  # type: ignore[index]
    assert panel.output.display_id == first  # one output, replaced in place


def test_the_headline_speaks_of_the_device_total_and_the_budget() -> None:
    within = headline(_comparison(10.53), 11 * MIB)
    assert "device total peak 14.30 MiB -> 10.53 MiB, within the budget 11.00 MiB" in within
    assert "7.43" not in within and "11.20" not in within  # the step's own peak is not a second headline
    over = headline(_comparison(11.40), 11 * MIB)
    assert "over the budget 11.00 MiB by 409.60 KiB" in over
    assert "step peak 11.20 MiB -> 7.43 MiB" in headline(_comparison(), 8 * MIB, budget_kind="step")
    cmp = _comparison()
    cmp.changes = ["checkpoint 1 block(s): <script>x</script>"]
    choice = Choice(("<script>x</script>",), (("backend", "inductor"),), "bf16", 11 * MIB)
    now = Choice((), None, None, 11 * MIB)
    bundle = result_bundle(cmp, choice, now=now)
    assert "<script>" not in bundle["text/html"] and "stale" in bundle["text/html"]
    assert "torch.compile(backend='inductor'); bf16 AMP" in bundle["text/plain"]


def test_progress_reads_stage_first_in_both_label_styles() -> None:
    assert progress_text(3, 10, "measuring: timed step 2 of 3") == "measuring: timed step 2 of 3 · 3/10"
    assert progress_text(1, 10, "compiling: blocks.0 forward").startswith("compiling: blocks.0")
    assert progress_text(4, 22, "before: timed step") == "measuring (before): timed step · 4/22"
    assert progress_text(1, 22, "before: warm-up step").startswith("warming up (before)")
    assert progress_text(11, 22, "before: memory step", compiling=True).startswith("compiling (after)")
    assert progress_text(11, 22, "before: memory step").startswith("warming up (after)")
    assert progress_text(20, 22, "after: FLOP-counted step").startswith("FLOPs (after)")
    assert progress_text(2, 10, "plan: profiled step").startswith("planning: profiled step")
    assert progress_text(2, 10, "something else") == "something else · 2/10"


def test_compile_and_amp_choices_have_visible_defaults(panel: OptimizePanel) -> None:
    assert (panel.backend.value, panel.mode.value, panel.amp.label) == ("inductor", "default", "no AMP")
    assert panel.backend.disabled and panel.mode.disabled  # visible, greyed while compile is off
    panel.compile.value = True
    assert not panel.backend.disabled and panel.compile_options == {"backend": "inductor"}
    panel.mode.value = "max-autotune"
    assert panel.compile_options == {"backend": "inductor", "mode": "max-autotune"}
    panel.set_budget("11")
    assert panel.choice().compile_options == {"backend": "inductor", "mode": "max-autotune"}
