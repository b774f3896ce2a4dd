"""A chart of MFU (and HFU) across runs: the steps of a walkthrough, before/after, or ranks."""

from __future__ import annotations

import math
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
    # MFU and HFU are None where a step beat the peak (never above 100%): no bar, "n/a" instead
    mfu_pct, hfu_pct, low_pct, high_pct = (_percent(frame[c]) for c in ("mfu", "hfu", "mfu_low", "mfu_high"))
    kinds = sorted(set(frame["peak_kind"]))
    peak_word = {"table": "datasheet peak", "measured": "measured peak", "given": "given peak"}.get(
        kinds[0], "peak") if len(kinds) == 1 else "peak"
    hover = []
    for label, m, lo, hi, rate, peak, t, kind, why in zip(
        labels, mfu_pct, low_pct, high_pct, frame["flops_per_s"], frame["peak_flops"], frame["step_time_s"],
        frame["peak_kind"], frame["mfu_unavailable"], strict=True,
    ):
        mfu_text = (f"MFU not available: {_plain(why)}" if m is None
                    else f"MFU {m:.2f}% (range {lo:.2f}–{hi:.2f}%)")
        hover.append(f"{_plain(label)}<br>{mfu_text}<br>{format_flop_rate(rate)} model of "
                     f"{format_flop_rate(peak)} {kind} peak<br>step {1e3 * t:.1f} ms")
    figure = StaticFigure()
    figure.add_trace(go.Bar(
        name="MFU",
        x=labels,
        y=mfu_pct,
        error_y={
            "type": "data",
            "symmetric": False,
            "array": [_gap(hi, m) for m, hi in zip(mfu_pct, high_pct, strict=True)],
            "arrayminus": [_gap(m, lo) for m, lo in zip(mfu_pct, low_pct, strict=True)],
        },
        hovertext=hover,
        hoverinfo="text",
        text=["n/a (peak beaten)" if v is None else f"{v:.1f}%" for v in mfu_pct],
        textposition="outside",
    ))
    if hfu:
        figure.add_trace(go.Bar(
            name="HFU (with recomputation)",
            x=labels,
            y=hfu_pct,
            text=["n/a" if v is None else f"{v:.1f}%" for v in hfu_pct],
            textposition="outside",
        ))
    sources = sorted(set(frame["peak_source"]))
    subtitle = sources[0] if len(sources) == 1 else f"{len(sources)} different peaks (see peak_source)"
    figure.update_layout(
        title={"text": f"{title}<br><sup>{peak_word}: {_plain(subtitle)}</sup>"},
        yaxis_title=f"% of the {peak_word} FLOP/s",
        xaxis_title="run",
        barmode="group",
        template="plotly_white",
        height=400,
    )
    return figure


def _percent(column: Iterable[Any]) -> list[float | None]:
    """Fractions as percent; None (or the NaN pandas turns it into) stays None."""
    return [None if v is None or not math.isfinite(float(v)) else 100 * float(v) for v in column]


def _gap(high: float | None, low: float | None) -> float | None:
    return None if high is None or low is None else high - low


def _plain(text: Any) -> str:
    """Plotly renders titles as HTML-ish markup: escape foreign text (device names) first."""
    from nbtoolkit.core.result import escape

    return escape(text)
