"""The optimize panel (slider follows the front without re-running; apply button) and the magics."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.recompute.panel import OptimizePanel, plan_summary_html
from nbtoolkit.recompute.plan import RecomputePlan
from nbtoolkit.recompute.tradeoff_figure import tradeoff_figure
from tests.optimize._models import make_gpt

HIDDEN = [64, 256, 128, 384]


@pytest.fixture(scope="module", autouse=True)
def _torch_compile_initialised() -> None:
    # torch's first torch.compile installs its own LazyTraceHandler (one-time init, not ours)
    torch.compile(lambda x: x + 1, backend="eager")(torch.zeros(1))


@pytest.fixture(scope="module")
def setup() -> tuple[Any, Any, RecomputePlan]:
    model, step = make_gpt(hidden=HIDDEN)
    return model, step, nbt.plan_recompute(model, step, None, steps=1)


def test_slider_updates_prediction_without_running_the_step(setup: Any) -> None:
    model, step, plan = setup
    calls = {"n": 0}

    def counting_step() -> Any:
        calls["n"] += 1
        return step()

    panel = OptimizePanel(model, counting_step, plan, steps=1, warmup=0)
    start = panel.predicted()  # at the baseline budget: the cheapest plan (maybe a free one)
    assert start is not None and start["predicted_peak_bytes"] <= plan.baseline_peak_bytes
    assert start["predicted_overhead_s"] == plan.tradeoff["predicted_overhead_s"].min()
    shown = []
    for fraction in (0.8, 0.5, 0.0):
        panel.budget.value = panel.budget.min + (panel.budget.max - panel.budget.min) * fraction
        best = panel.predicted()
        assert best is not None and best["predicted_peak_bytes"] <= panel.budget_bytes
        assert ", ".join(best["blocks"]) in panel.summary.value
        shown.append(len(best["blocks"]))
    assert shown == sorted(shown) and shown[-1] > shown[0]
    assert calls["n"] == 0  # the slider never ran the step
    assert "OptimizePanel" in repr(panel)


def test_the_amp_choice_shows_no_amp_by_default(setup: Any) -> None:
    model, step, plan = setup
    panel = OptimizePanel(model, step, plan, steps=1, warmup=0)
    assert panel.amp.label == "no AMP" and panel.amp.index == 0  # not a blank box
    assert OptimizePanel(model, step, plan, amp="bf16").amp.label == "bf16"


def test_panel_display_carries_a_static_copy_for_pages_without_the_kernel(setup: Any) -> None:
    model, step, plan = setup
    panel = OptimizePanel(model, step, plan, steps=1, warmup=0)
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # the live panel first
    html = bundle["text/html"]
    assert html.count("<svg") == 1 and "stroke" in html  # the trade-off figure, drawn
    assert "static copy" in html and plan._html() in html  # and the plan's table


def test_apply_button_measures_and_shows_comparison(setup: Any) -> None:
    model, step, plan = setup
    panel = OptimizePanel(model, step, plan, steps=1, warmup=0)
    panel.budget.value = panel.budget.min
    panel.button.click()
    cmp = panel.comparison
    assert cmp is not None
    assert cmp.after.peak_bytes <= panel.budget_bytes + 4096  # slider rounding of MiB
    assert cmp.after.peak_bytes < cmp.before.peak_bytes
    assert panel.progress.value == panel.progress.max > 1
    assert not panel.button.disabled
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_figure_and_summary_escape_and_units(setup: Any) -> None:
    _, _, plan = setup
    fig = tradeoff_figure(plan, budget_bytes=plan.min_peak_bytes)
    assert fig.layout.yaxis.title.text.endswith("(MiB)")
    assert len(fig.data) == 2  # the front and the chosen plan
    html = plan_summary_html(plan, plan.min_peak_bytes - 10)
    assert "No plan fits" in html
    bad = plan.tradeoff.copy()
    bad.loc[len(bad) - 1, "blocks"] = "<script>x</script>"
    tampered = RecomputePlan(**{**plan.__dict__, "tradeoff": bad})
    assert "<script>" not in plan_summary_html(tampered, tampered.min_peak_bytes)


def test_plan_magic(shell: InteractiveShell, setup: Any) -> None:
    model, step, plan = setup
    shell.user_ns.update(gpt=model, train_step=step)
    budget = (plan.min_peak_bytes + plan.baseline_peak_bytes) // 2
    result = shell.run_line_magic("nbt", f"plan gpt train_step --budget {budget} --name p")
    assert isinstance(result, RecomputePlan) and shell.user_ns["p"] is result
    assert result.blocks and result.predicted_peak_bytes <= budget
    with pytest.raises(Exception, match="no model named 'nope'"):
        shell.run_line_magic("nbt", "plan nope train_step")
    with pytest.raises(UsageError):
        shell.run_line_magic("nbt", "optimize gpt train_step --amp fp8")


@pytest.mark.slow
def test_optimize_magic_builds_panel_and_runs(shell: InteractiveShell, setup: Any) -> None:
    model, step, _ = setup
    shell.user_ns.update(gpt=model, train_step=step)
    panel = shell.run_line_magic("nbt", "optimize gpt train_step --steps 1 --compile --backend aot_eager")
    assert isinstance(panel, OptimizePanel) and panel.compile.value
    assert panel.compile_options == {"backend": "aot_eager"}
    cmp = shell.run_line_magic("nbt", "optimize gpt train_step --run --compile --backend aot_eager --steps 1")
    assert cmp.after.graph_count is not None and cmp.after.graph_count >= 1
    assert all("forward" not in m.__dict__ for m in model.modules())
    torch._dynamo.reset()


class _Parsed(Exception):
    """Raised where the budget has been read and the work would start: the text was accepted."""


@pytest.mark.parametrize("text", ["1.5GB", "800MiB", "2e9", "1400mib", "12345", "abc", "0", "-1", "1.5XB",
                                  "150%", "0%", "%", "nan"])
def test_panel_and_run_read_the_budget_the_same_way(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """``%nbt optimize --budget X`` (panel) and ``... --run`` accept the same text and refuse it alike."""
    import nbtoolkit.recompute.optimize as apply
    import nbtoolkit.recompute.planner as recompute

    def parsed(*args: Any, **kwargs: Any) -> Any:
        raise _Parsed

    monkeypatch.setattr(recompute, "plan_recompute", parsed)  # the panel's next call
    monkeypatch.setattr(apply, "_optimize", parsed)  # nbt.optimize's, once its config is read
    shell.user_ns.update(model=torch.nn.Linear(2, 2), step=lambda: None)
    outcomes = []
    for run in ("", " --run"):
        try:
            shell.run_line_magic("nbt", f"optimize model step --budget={text}{run}")
        except _Parsed:
            outcomes.append("accepted")
        except nbt.NbtUsageError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] == "accepted") == (text in ("1.5GB", "800MiB", "2e9", "1400mib", "12345"))


def test_plan_magic_draws_the_front_with_its_chosen_plan(
    shell: InteractiveShell, setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import IPython.display

    shown: list[Any] = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kwargs: shown.extend(objs))
    model, step, plan = setup
    shell.user_ns.update(gpt=model, train_step=step)
    budget = (plan.min_peak_bytes + plan.baseline_peak_bytes) // 2
    result = shell.run_line_magic("nbt", f"plan gpt train_step --budget {budget}")
    figures = [o for o in shown if type(o).__name__ in ("Figure", "StaticFigure")]
    assert len(figures) == 1
    front, star = figures[0].data[:2]
    assert len(front.x) == len(result.tradeoff)
    assert star.name == "chosen" and star.y[0] == pytest.approx(result.predicted_peak_bytes / 2**20)
    assert star.x[0] == pytest.approx(result.predicted_overhead_s * 1e3)


def test_optimize_magic_starts_from_a_plan_variable_with_compile_choices(
    shell: InteractiveShell, setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbtoolkit.recompute.planner as planner

    def measured_again(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the panel measured the blocks again instead of using --plan")

    model, step, plan = setup
    monkeypatch.setattr(planner, "plan_recompute", measured_again)
    shell.user_ns.update(gpt=model, train_step=step, p0=plan)
    line = "optimize gpt train_step --plan p0 --budget 11MiB --mode max-autotune"
    panel = shell.run_line_magic("nbt", line)
    assert isinstance(panel, OptimizePanel) and panel.plan is plan
    assert panel.budget_bytes == 11 * 2**20 and panel.budget_text.value == "11 MiB"
    assert panel.compile.value and (panel.backend.value, panel.mode.value) == ("inductor", "max-autotune")
    with pytest.raises(nbt.NbtUsageError, match="is a TinyGPT, not a RecomputePlan"):
        shell.run_line_magic("nbt", "optimize gpt train_step --plan gpt")
