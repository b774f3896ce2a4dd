"""The optimize panel and the memory-vs-time trade-off figure.

``optimize_panel(model, step)`` measures the candidate blocks once (``plan_recompute``
without a budget), then everything the budget slider does is a lookup on the plan's exact
trade-off front: no re-run, no solver call, so the predicted plan follows the slider at
once. "Apply and measure" calls :func:`nbtoolkit.optimize` with the blocks shown, the
compile and AMP choices, and shows the :class:`~nbtoolkit.recompute.comparison.Comparison`;
a progress bar counts the steps while it measures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtoolkit.core.result import escape
from nbtoolkit.core.units import format_bytes, format_seconds
from nbtoolkit.recompute.tradeoff_figure import tradeoff_figure

if TYPE_CHECKING:
    from nbtoolkit.recompute.comparison import Comparison
    from nbtoolkit.recompute.plan import RecomputePlan

__all__ = ["OptimizePanel", "optimize_panel", "plan_summary_html", "zero_recompute_figure"]

_MIB = 2**20


def zero_recompute_figure(table: Any) -> Any:
    """Two panels from a ZeroRecompute table: blocks recomputed against the budget, one line per
    ZeRO stage; and the largest rank's measured total peak against the budget (the diagonal is
    the budget itself: points under it fit)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "blocks recomputed", "largest rank's measured peak (MiB)"))
    planned = table[table["error"] == ""]
    for stage, group in planned.groupby("stage"):
        rows = group.sort_values("budget_bytes")
        budget_mib = [v / _MIB for v in rows["budget_bytes"]]
        hover = [escape(b or "(none)") for b in rows["blocks"]]
        fig.add_trace(go.Scatter(x=budget_mib, y=rows["n_blocks"], mode="lines+markers", name=f"ZeRO-{stage}",
                                 text=hover, line={"shape": "hv"}, legendgroup=str(stage),
                                 hovertemplate="%{text}<extra></extra>"), 1, 1)
        fig.add_trace(go.Scatter(x=budget_mib, y=[v / _MIB for v in rows["measured_peak_bytes"]],
                                 mode="markers", name=f"ZeRO-{stage} peak", legendgroup=str(stage),
                                 showlegend=False, text=hover), 1, 2)
    if len(table):
        low, high = table["budget_bytes"].min() / _MIB, table["budget_bytes"].max() / _MIB
        fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", line={"dash": "dash"},
                                 name="budget"), 1, 2)
    fig.update_xaxes(title_text="budget per rank, device total (MiB)")
    fig.update_layout(title="Recompute plans under DeepSpeed ZeRO, one plan for all ranks", height=380,
                      margin={"l": 60, "r": 20, "t": 60, "b": 50})
    return fig


def plan_summary_html(plan: RecomputePlan, budget_bytes: float) -> str:
    """What the front predicts for ``budget_bytes``: blocks, peak and overhead (escaped HTML)."""
    best = plan.best_for(budget_bytes)
    if best is None:
        return (
            f"<p><b>No plan fits {escape(format_bytes(budget_bytes))}</b>: the lowest reachable peak is "
            f"{escape(format_bytes(plan.min_peak_bytes))}.</p>"
        )
    blocks = ", ".join(best["blocks"]) or "(none: the baseline fits)"
    return (
        f"<p>budget <b>{escape(format_bytes(budget_bytes))}</b>: checkpoint {len(best['blocks'])} of "
        f"{len(plan.candidates)} blocks: <code>{escape(blocks)}</code><br>"
        f"predicted peak {escape(format_bytes(best['predicted_peak_bytes']))} "
        f"(baseline {escape(format_bytes(plan.baseline_peak_bytes))}), predicted extra time "
        f"+{escape(format_seconds(best['predicted_overhead_s']))} per step "
        f"(baseline step {escape(format_seconds(plan.baseline_step_time_s))})</p>"
    )


class OptimizePanel:
    """The widgets of the panel and what they act on; ``.widget`` is the VBox to display.

    ``budget`` (slider, MiB), ``compile`` (checkbox), ``amp`` (dropdown), ``button``,
    ``progress`` (IntProgress), ``comparison`` (the last Comparison, or None).
    """

    def __init__(
        self,
        model: Any,
        step: Any,
        plan: RecomputePlan,
        *,
        budget_bytes: float | None = None,
        compile: bool | dict[str, Any] = False,
        amp: str | None = None,
        steps: int | None = None,
        warmup: int | None = None,
    ) -> None:
        import ipywidgets as widgets

        self.model, self.step, self.plan = model, step, plan
        self.steps, self.warmup = steps, warmup
        # the checkbox turns compilation on/off; a dict of options (backend, mode) is kept for "on"
        self.compile_options: dict[str, Any] = compile if isinstance(compile, dict) else {}
        self.comparison: Comparison | None = None
        low = plan.min_peak_bytes / _MIB
        high = plan.baseline_peak_bytes / _MIB
        start = high if budget_bytes is None else min(max(budget_bytes / _MIB, low), high)
        self.budget = widgets.FloatSlider(
            value=start, min=low, max=high, step=max((high - low) / 200, 1e-3),
            description="budget (MiB)", readout_format=".2f", continuous_update=True,
            layout=widgets.Layout(width="520px"), style={"description_width": "initial"},
        )
        self.compile = widgets.Checkbox(value=bool(compile), description="torch.compile")
        # "none", not None: a Dropdown whose value is None shows no choice at all (a blank box)
        self.amp = widgets.Dropdown(options=[("no AMP", "none"), ("bf16", "bf16"), ("fp16", "fp16")],
                                    value=amp or "none", description="AMP")
        self.summary = widgets.HTML()
        self.figure = widgets.Output()
        self.button = widgets.Button(description="Apply and measure", button_style="primary")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="", layout={"width": "520px"})
        self.status = widgets.HTML()
        self.result = widgets.Output()
        self.budget.observe(self._on_budget, names="value")
        self.button.on_click(self._on_apply)
        self._on_budget(None)
        self.widget = widgets.VBox([
            self.budget,
            widgets.HBox([self.compile, self.amp]),
            self.summary,
            self.figure,
            widgets.HBox([self.button, self.progress]),
            self.status,
            self.result,
        ])

    @property
    def budget_bytes(self) -> int:
        return int(self.budget.value * _MIB)

    def predicted(self) -> dict[str, Any] | None:
        """The front's plan for the slider's budget (what "Apply and measure" will apply)."""
        return self.plan.best_for(self.budget_bytes)

    def _on_budget(self, _change: Any) -> None:
        self.summary.value = plan_summary_html(self.plan, self.budget_bytes)
        self.figure.clear_output(wait=True)
        with self.figure:
            from IPython.display import display

            display(tradeoff_figure(self.plan, budget_bytes=self.budget_bytes))

    def _report(self, done: int, total: int, what: str) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = min(done, total)
        self.status.value = f"<small>{escape(what)}</small>"

    def apply_and_measure(self) -> Comparison:
        """Run :func:`nbtoolkit.optimize` with the panel's choices; show and return the comparison."""
        from nbtoolkit.core.errors import NbtError
        from nbtoolkit.core.measure_config import measure_config
        from nbtoolkit.recompute.optimize import optimize

        best = self.predicted()
        blocks = best["blocks"] if best else None
        self.button.disabled = True
        self.progress.value = 0
        self.result.clear_output()
        compile_arg = (self.compile_options or True) if self.compile.value else False
        try:
            comparison = optimize(
                self.model, self.step, compile=compile_arg, recompute=blocks or None,
                amp=None if self.amp.value == "none" else self.amp.value, progress=self._report,
                config=measure_config(steps=self.steps, warmup=self.warmup),
            )
        except NbtError as exc:
            self.status.value = f"<b>{escape(type(exc).__name__)}</b>: {escape(exc)}"
            raise
        finally:
            self.button.disabled = False
        self.comparison = comparison
        self.status.value = "<small>done</small>"
        with self.result:
            from IPython.display import display

            display(comparison)
        return comparison

    def _on_apply(self, _button: Any) -> None:
        import contextlib

        from nbtoolkit.core.errors import NbtError

        # shown in the status line; a widget callback has nowhere else to raise to
        with contextlib.suppress(NbtError):
            self.apply_and_measure()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        if isinstance(bundle, dict):
            text = f"OptimizePanel: budget slider over the trade-off front of {len(self.plan.tradeoff)} plans"
            bundle["text/plain"] = text
        return bundle

    def __repr__(self) -> str:
        budget = format_bytes(self.budget_bytes)
        return f"OptimizePanel(budget={budget}, front of {len(self.plan.tradeoff)} plans)"


def optimize_panel(
    model: Any,
    step: Any,
    *,
    plan: RecomputePlan | None = None,
    budget_bytes: Any = None,
    compile: bool | dict[str, Any] = False,
    amp: str | None = None,
    steps: int | None = None,
    warmup: int | None = None,
) -> OptimizePanel:
    """Measure the candidates once (unless ``plan`` is given) and build the interactive panel.

    ``budget_bytes`` (where the slider starts) reads as ``nbt.optimize``'s does: bytes, text such
    as ``"1.5GB"``, or on a GPU a share such as ``"90%"``.
    """
    from nbtoolkit.core.device_memory import budget_bytes_for, model_device
    from nbtoolkit.core.units import parse_budget
    from nbtoolkit.recompute.planner import plan_recompute

    # the one budget parser (units.parse_budget), as nbt.optimize reads it: same text, same error
    budget = None if budget_bytes is None else parse_budget(budget_bytes)
    if budget is not None and not isinstance(budget, int):  # a share of the GPU: its bytes
        budget = budget_bytes_for(budget, model_device(model))
    if plan is None:
        plan = plan_recompute(model, step, None, steps=steps)
    return OptimizePanel(model, step, plan, budget_bytes=budget, compile=compile, amp=amp,
                         steps=steps, warmup=warmup)
