"""A chart of MFU (and HFU) across runs: the steps of a walkthrough, before/after, or ranks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.units import format_flop_rate
from nbtoolkit.metrics.step_metrics import StepMetrics, metrics_frame

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["mfu_chart"]


def mfu_chart(
    runs: Mapping[str, StepMetrics] | Iterable[StepMetrics | tuple[str, StepMetrics]],
    *,
    hfu: bool = True,
    title: str = "Model FLOPs utilization",
) -> go.Figure:
    """Bars of MFU per run (in %, with the range over the timed steps as error bars), and
    HFU beside them when ``hfu`` (it differs from MFU only by recomputation).

    ``runs``: ``[("baseline", m1), ("compiled", m2)]``, a mapping label -> StepMetrics, or a
    plain list (labelled 0, 1, ... e.g. ranks). Returns a plotly Figure.
    """
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    if isinstance(runs, StepMetrics):
        runs = [("step", runs)]
    frame = metrics_frame(runs)  # raises NbtUsageError for an empty or malformed list
    labels = [str(v) for v in frame["run"]]
    if len(set(labels)) != len(labels):
        raise NbtUsageError(f"run labels must differ, got {labels!r}: name each run once")
    mfu_pct = 100 * frame["mfu"]
    hover = [
        f"{label}<br>MFU {m:.2f}% (range {100 * lo:.2f}–{100 * hi:.2f}%)<br>"
        f"{format_flop_rate(rate)} model of {format_flop_rate(peak)} peak<br>step {1e3 * t:.1f} ms"
        for label, m, lo, hi, rate, peak, t in zip(
            labels, mfu_pct, frame["mfu_low"], frame["mfu_high"], frame["flops_per_s"], frame["peak_flops"],
            frame["step_time_s"], strict=True,
        )
    ]
    figure = StaticFigure()
    figure.add_trace(go.Bar(
        name="MFU",
        x=labels,
        y=mfu_pct,
        error_y={
            "type": "data",
            "symmetric": False,
            "array": 100 * frame["mfu_high"] - mfu_pct,
            "arrayminus": mfu_pct - 100 * frame["mfu_low"],
        },
        hovertext=hover,
        hoverinfo="text",
        text=[f"{v:.1f}%" for v in mfu_pct],
        textposition="outside",
    ))
    if hfu:
        figure.add_trace(go.Bar(
            name="HFU (with recomputation)",
            x=labels,
            y=100 * frame["hfu"],
            text=[f"{100 * v:.1f}%" for v in frame["hfu"]],
            textposition="outside",
        ))
    sources = sorted(set(frame["peak_source"]))
    subtitle = sources[0] if len(sources) == 1 else f"{len(sources)} different peaks (see peak_source)"
    figure.update_layout(
        title={"text": f"{title}<br><sup>peak: {_plain(subtitle)}</sup>"},
        yaxis_title="% of peak FLOP/s",
        xaxis_title="run",
        barmode="group",
        template="plotly_white",
        height=400,
    )
    return figure


def _plain(text: Any) -> str:
    """Plotly renders titles as HTML-ish markup: escape foreign text (device names) first."""
    from nbtoolkit.core.result import escape

    return escape(text)
