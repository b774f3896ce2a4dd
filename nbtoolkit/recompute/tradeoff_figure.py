"""``tradeoff_figure``: a RecomputePlan's predicted peak memory against predicted extra time.

Below the plan: it reads the plan through :class:`TradeoffPlan` (what it needs of one), so
``RecomputePlan._report_figures`` (``nbt.report``) can draw it without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from nbtoolkit.core.result import escape

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TradeoffPlan", "tradeoff_figure"]

_MIB = 2**20


class TradeoffPlan(Protocol):
    """What :func:`tradeoff_figure` reads of a :class:`~nbtoolkit.recompute.plan.RecomputePlan`."""

    @property
    def tradeoff(self) -> pd.DataFrame: ...

    @property
    def budget_bytes(self) -> int: ...

    @property
    def budget_kind(self) -> str: ...

    @property
    def predicted_peak_bytes(self) -> int: ...

    @property
    def predicted_overhead_s(self) -> float: ...

    def best_for(self, budget_bytes: float) -> dict[str, Any] | None: ...


def tradeoff_figure(plan: TradeoffPlan, *, budget_bytes: float | None = None) -> Any:
    """Plotly figure: predicted peak memory (MiB) against predicted overhead (ms) for every front plan.

    The chosen plan is highlighted: the plan's own blocks, or with ``budget_bytes`` the front's
    cheapest plan under that budget (none below the floor); a horizontal line marks the budget.
    Hover shows the blocks.
    """
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    front = plan.tradeoff
    if budget_bytes is None:  # the plan's own choice (the solver's, maybe re-planned when verified)
        budget: float = plan.budget_bytes
        best: dict[str, Any] | None = {
            "predicted_overhead_s": plan.predicted_overhead_s,
            "predicted_peak_bytes": plan.predicted_peak_bytes,
        }
    else:
        budget = budget_bytes
        best = plan.best_for(budget)
    fig = StaticFigure()
    fig.add_trace(
        go.Scatter(
            x=[v * 1e3 for v in front["predicted_overhead_s"]],
            y=[v / _MIB for v in front["predicted_peak_bytes"]],
            mode="lines+markers",
            line={"shape": "hv"},
            name="trade-off front",
            text=[escape(b or "(none)") for b in front["blocks"]],
            hovertemplate="%{text}<br>+%{x:.2f} ms, %{y:.2f} MiB<extra></extra>",
        )
    )
    if best is not None:
        fig.add_trace(
            go.Scatter(
                x=[best["predicted_overhead_s"] * 1e3],
                y=[best["predicted_peak_bytes"] / _MIB],
                mode="markers",
                marker={"size": 14, "symbol": "star"},
                name="chosen",
            )
        )
    fig.add_hline(y=budget / _MIB, line_dash="dash", annotation_text="budget")
    fig.update_layout(
        title="Recomputation: predicted peak memory vs extra time per step",
        xaxis_title="predicted extra time per step (ms)",
        yaxis_title=f"predicted peak memory, {'device total' if plan.budget_kind == 'total' else 'step'}"
        " (MiB)",
        height=360,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
    )
    return fig
