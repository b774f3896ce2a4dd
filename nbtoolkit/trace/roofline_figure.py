"""The roofline chart (plotly): achieved FLOP/s against arithmetic intensity, under the device's roofs.

Log-log axes. One marker per op class and precision (area by time); one roof per precision
the classes ran in: the memory slope (intensity x bandwidth) up to the ridge point, then the
flat peak. Without roofs (a CPU, an unknown device) the points are drawn alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["roofline_figure"]


class Roofline(Protocol):
    """What the chart reads of a :class:`nbtoolkit.trace.roofline.Roofline` (whose ``figure()``
    imports this module, so this module names the fields instead of importing the class back)."""

    rank: int
    device: str
    bandwidth: float | None
    by_class: pd.DataFrame


def roofline_figure(roof: Roofline) -> Any:
    """The roofline chart of ``roof`` (see the module docstring)."""
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    table = roof.by_class[(roof.by_class["flops"] > 0) & (roof.by_class["bytes"] > 0)]
    fig = StaticFigure()
    if not len(table):
        fig.update_layout(title="Roofline: no op with FLOPs and bytes (record with record_shapes=True)")
        return fig
    lo = float(table["intensity"].min()) / 4
    hi = float(table["intensity"].max()) * 4
    if roof.bandwidth:
        for precision, peak in table.groupby("precision")["peak_tflops"].first().items():
            if not np.isfinite(peak):
                continue
            ridge = peak * 1e12 / roof.bandwidth
            xs = np.array([min(lo, ridge / 4), ridge, max(hi, ridge * 4)])
            fig.add_trace(go.Scatter(x=xs, y=np.minimum(peak, xs * roof.bandwidth / 1e12), mode="lines",
                                     name=f"roof {precision} ({peak:,.0f} TFLOP/s, ridge {ridge:,.0f})",
                                     line={"dash": "dash"}))
    size = 12 + 40 * np.sqrt(table["time_us"] / table["time_us"].max())
    columns = ("op_class", "precision", "time_us", "tflops_per_s", "bound", "pct_of_roof")
    text = [f"{c} {p}: {t / 1e3:,.3f} ms, {r:,.2f} TFLOP/s, {b or 'no roof'}"
            + (f", {pct:.1f} % of roof" if np.isfinite(pct) else "")
            for c, p, t, r, b, pct in table[list(columns)].itertuples(index=False)]
    labels = [f"{c} {p}" for c, p in zip(table["op_class"], table["precision"], strict=True)]
    fig.add_trace(go.Scatter(x=table["intensity"], y=table["tflops_per_s"], mode="markers+text",
                             text=labels,
                             textposition="top center", marker={"size": size, "opacity": 0.7},
                             hovertext=text, hoverinfo="text", name="op classes"))
    fig.update_layout(title=f"Roofline of rank {roof.rank} on {roof.device or 'an unknown device'}",
                      xaxis={"type": "log", "title": "arithmetic intensity (FLOP/byte)"},
                      yaxis={"type": "log", "title": "achieved TFLOP/s"},
                      legend={"orientation": "h", "y": -0.25}, height=520)
    return fig
