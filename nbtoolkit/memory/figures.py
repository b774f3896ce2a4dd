"""Figures of memory: the timeline by category, the allocator's segments, before/after.

Every function returns a plotly ``Figure`` (zoomable, hover shows sizes with units).
Large timelines are *decimated* before plotting (``nbtoolkit.memory.timeline_analysis.decimate``:
per time bin the highest and the lowest total are kept, so every peak stays visible):
a figure holds at most ``max_points`` points per series whatever the number of events,
builds in well under a second for a million events and stays a few hundred KB in the
notebook. Decimation was chosen over datashader rasterization because a stacked area
needs exact values at the peaks, and because the figure then stays a plain plotly
figure that works in any front end without a running server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from nbtoolkit.core.result import escape

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go


# What these figures read of the model objects. Named here rather than imported: the objects'
# figure() methods import this module, and importing them back (even for annotations) would
# close an import cycle.
class MemoryTimeline(Protocol):
    """A :class:`nbtoolkit.memory.timeline.MemoryTimeline`."""

    events: pd.DataFrame
    device: str
    category_method: str

    @property
    def peak_bytes(self) -> int: ...

    @property
    def peak_time(self) -> float: ...

    def by_module(self) -> pd.DataFrame: ...

    def alive_at_peak(self, top: int = 20) -> pd.DataFrame: ...


class MemorySnapshot(Protocol):
    """A :class:`nbtoolkit.memory.snapshot.MemorySnapshot`."""

    def segment_summary(self) -> pd.DataFrame: ...

    def stats(self) -> Any: ...

    def fragmentation(self) -> float: ...


class RankMemory(Protocol):
    """A :class:`nbtoolkit.memory.rank_memory.RankMemory`."""

    @property
    def ranks(self) -> list[int]: ...

    def timeline(self, rank: int) -> MemoryTimeline: ...

    def peaks(self) -> pd.DataFrame: ...

__all__ = [
    "CATEGORY_COLORS",
    "alive_at_peak_html",
    "comparison_figure",
    "module_figure",
    "ranks_figure",
    "segment_figure",
    "timeline_figure",
]

#: The colors torch's export_memory_timeline uses, so both plots read the same way.
CATEGORY_COLORS = {
    "parameter": "darkgreen",
    "optimizer_state": "goldenrod",
    "input": "black",
    "temporary": "mediumpurple",
    "activation": "red",
    "gradient": "mediumblue",
    "autograd_detail": "royalblue",
    "unsharded_parameter": "mediumseagreen",  # FSDP2's gathered parameters: beside the shards' green
    "unsharded_gradient": "lightskyblue",  # and its full-size gradients: beside the shards' blue
    "unknown": "grey",
}
_PHASE_COLORS = {
    "before": "rgba(128,128,128,0.08)",
    "forward": "rgba(255,99,71,0.10)",
    "backward": "rgba(65,105,225,0.10)",
    "optimizer": "rgba(218,165,32,0.14)",
}
_MAX_BANDS = 300
_MAX_MODULES = 25
_MAX_MODULE_SPANS = 3000


def _scale(peak: float) -> tuple[float, str]:
    for divisor, unit in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if peak >= divisor:
            return float(divisor), unit
    return 1.0, "B"


def _time_scale(span_us: float) -> tuple[float, str]:
    if span_us >= 5e6:
        return 1e6, "s"
    if span_us >= 5e3:
        return 1e3, "ms"
    return 1.0, "µs"


def timeline_figure(
    timeline: MemoryTimeline,
    *,
    max_points: int = 4000,
    phases: bool = True,
    modules: bool = True,
    title: str | None = None,
) -> go.Figure:
    """Stacked area of allocated bytes by category over time, with phase bands and a module lane.

    Args:
        timeline: the MemoryTimeline to draw.
        max_points: at most this many points per category (decimated, peaks kept).
        phases: shade forward / backward / optimizer spans behind the areas.
        modules: add a lane below showing which module was allocating when.
        title: figure title (default: device and peak).
    """
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nbtoolkit.core.static_figure import StaticFigure
    from nbtoolkit.core.units import format_bytes
    from nbtoolkit.memory.schema import CATEGORIES
    from nbtoolkit.memory.timeline_analysis import category_series, decimate, module_spans, phase_spans

    events = timeline.events
    series = decimate(category_series(events, coalesce=True), max_points=max_points)
    peak_bytes = timeline.peak_bytes
    reserved_frame = getattr(timeline, "reserved", None)
    top_bytes = max(
        peak_bytes,
        int(reserved_frame["reserved_bytes"].max())
        if reserved_frame is not None and len(reserved_frame)
        else 0,
    )
    divisor, unit = _scale(top_bytes)
    times = series["time_us"].to_numpy(dtype="float64")
    span = float(times[-1] - times[0]) if len(times) else 0.0
    tdiv, tunit = _time_scale(span)
    x = times / tdiv

    spans = module_spans(events) if modules else None
    show_modules = spans is not None and len(spans) > 0
    if show_modules:
        figure = make_subplots(
            rows=2, cols=1, shared_xaxes=True, row_heights=[0.75, 0.25], vertical_spacing=0.04,
            figure=StaticFigure(),
        )
    else:
        figure = StaticFigure()
    row: dict[str, int] = {"row": 1, "col": 1} if show_modules else {}

    present = [c for c in CATEGORIES if c in series and np.any(series[c].to_numpy() != 0)]
    for category in present:
        values = series[category].to_numpy(dtype="float64") / divisor
        figure.add_trace(
            go.Scatter(
                x=x,
                y=values,
                name=category,
                mode="lines",
                line={"width": 0.5, "color": CATEGORY_COLORS[category]},
                stackgroup="memory",
                hovertemplate=f"{category}: %{{y:.2f}} {unit}<extra></extra>",
            ),
            **row,
        )
    reserved = getattr(timeline, "reserved", None)
    if reserved is not None and len(reserved):
        # Reserved memory (segments held by the caching allocator) as a dashed line above the areas.
        kept = decimate(reserved.rename(columns={"reserved_bytes": "total"}), max_points=max_points)
        figure.add_trace(
            go.Scatter(
                x=kept["time_us"].to_numpy(dtype="float64") / tdiv,
                y=kept["total"].to_numpy(dtype="float64") / divisor,
                name="reserved (segments)",
                mode="lines",
                line={"color": "black", "dash": "dash", "width": 1, "shape": "hv"},
                hovertemplate=f"reserved: %{{y:.2f}} {unit}<extra></extra>",
            ),
            **row,
        )
    peak_x = timeline.peak_time / tdiv
    figure.add_trace(
        go.Scatter(
            x=[peak_x],
            y=[peak_bytes / divisor],
            mode="markers",
            marker={"symbol": "triangle-down", "size": 11, "color": "black"},
            name=f"peak {format_bytes(peak_bytes)}",
            hovertemplate=f"peak {format_bytes(peak_bytes)} at %{{x:.3f}} {tunit}<extra></extra>",
        ),
        **row,
    )
    if phases and len(events):
        bands = phase_spans(events)
        bands = bands[bands["phase"].isin(list(_PHASE_COLORS))]
        if len(bands) > _MAX_BANDS:  # keep the widest bands; thin ones are invisible anyway
            widths = bands["end_us"] - bands["start_us"]
            bands = bands.loc[widths.nlargest(_MAX_BANDS).index].sort_values("start_us")
        shapes = [
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": float(b.start_us) / tdiv,
                "x1": float(b.end_us) / tdiv,
                "y0": 0,
                "y1": 1,
                "fillcolor": _PHASE_COLORS[str(b.phase)],
                "line": {"width": 0},
                "layer": "below",
            }
            for b in bands.itertuples()
            if b.end_us > b.start_us
        ]
        figure.update_layout(shapes=shapes)
        for phase_name in [p for p in _PHASE_COLORS if p in set(bands["phase"])]:
            # A legend entry per phase band color.
            figure.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="markers",
                    marker={
                        "size": 12,
                        "symbol": "square",
                        "color": _PHASE_COLORS[phase_name].replace("0.1", "0.5"),
                    },
                    name=f"phase: {phase_name}",
                    hoverinfo="skip",
                ),
                **row,
            )
    if show_modules and spans is not None:
        allocated = events[events["action"] == "alloc"].groupby("module")["delta_bytes"].sum()
        allocated = allocated[allocated.index != ""]
        top = list(allocated.nlargest(_MAX_MODULES).index)
        spans = spans[spans["module"].isin(top)].head(_MAX_MODULE_SPANS)
        xs: list[float | None] = []
        ys: list[str | None] = []
        for s in spans.itertuples():
            start = float(s.start_us) / tdiv
            end = max(float(s.end_us) / tdiv, start + span / tdiv / 2000)  # at least visible
            xs += [start, end, None]
            ys += [str(s.module), str(s.module), None]
        figure.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line={"width": 8, "color": "slategray"},
                name="allocating module",
                hovertemplate="%{y}<extra></extra>",
                showlegend=False,
            ),
            row=2,
            col=1,
        )
        figure.update_yaxes(title_text="module", type="category", row=2, col=1, automargin=True)
        figure.update_xaxes(title_text=f"time ({tunit})", row=2, col=1)
        figure.update_yaxes(title_text=f"allocated ({unit})", row=1, col=1)
    else:
        figure.update_xaxes(title_text=f"time ({tunit})")
        figure.update_yaxes(title_text=f"allocated ({unit})")
    shown_title = title or (
        f"Memory on {escape(timeline.device)}: peak {format_bytes(peak_bytes)} "
        f"({len(events):,} events, categories from {escape(timeline.category_method)})"
    )
    figure.update_layout(
        title={"text": shown_title, "font": {"size": 14}},
        template="plotly_white",
        hovermode="x unified",
        height=560 if show_modules else 420,
        legend={"traceorder": "normal"},
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return figure


def module_figure(
    timeline: MemoryTimeline, *, top: int = 20, include_unattributed: bool = False
) -> go.Figure:
    """Bytes alive at the peak per module (layer), stacked by category: which layer holds the peak.

    The ``top`` modules with the most bytes at the peak are drawn, largest on top. Memory
    made outside any module (``(no module)``: the loss, optimizer temporaries...) is left
    out unless ``include_unattributed``.
    """
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure
    from nbtoolkit.core.units import format_bytes
    from nbtoolkit.memory.schema import CATEGORIES

    table = timeline.by_module()
    if not include_unattributed:
        table = table[table["module"] != "(no module)"]
    table = table.head(top).iloc[::-1]
    divisor, unit = _scale(float(table["at_peak_bytes"].max()) if len(table) else 0.0)
    figure = StaticFigure()
    for category in CATEGORIES:
        column = f"{category}_at_peak_bytes"
        if column not in table or not (table[column] > 0).any():
            continue
        figure.add_trace(
            go.Bar(
                y=table["module"],
                x=table[column] / divisor,
                name=category,
                orientation="h",
                marker={"color": CATEGORY_COLORS[category]},
                hovertemplate=f"%{{y}}<br>{category}: %{{x:.2f}} {unit}<extra></extra>",
            )
        )
    figure.update_layout(
        barmode="stack",
        template="plotly_white",
        title={
            "text": f"Alive at the peak ({format_bytes(timeline.peak_bytes)}) by module",
            "font": {"size": 14},
        },
        xaxis_title=f"bytes at the peak ({unit})",
        height=min(900, 160 + 24 * len(table)),
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return figure


def alive_at_peak_html(timeline: MemoryTimeline, *, top: int = 15) -> str:
    """An HTML table of the largest allocations alive at the peak, with their stacks (escaped)."""
    from nbtoolkit.core.units import format_bytes

    alive = timeline.alive_at_peak(top=top)
    rows = []
    for r in alive.itertuples():
        stack = escape(str(r.stack)).replace("\n", "<br>")
        rows.append(
            "<tr>"
            f"<td style='text-align:right'>{escape(format_bytes(r.bytes))}</td>"
            f"<td>{escape(r.category)}</td><td>{escape(r.module)}</td><td>{escape(r.phase)}</td>"
            f"<td>{escape(r.shape)}</td><td>{escape(r.source)}</td>"
            f"<td><details><summary>stack</summary><small>{stack}</small></details></td>"
            "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>" for h in ("size", "category", "module", "phase", "shape", "allocated at", "stack")
    )
    return (
        f"<p><b>At the peak ({escape(format_bytes(timeline.peak_bytes))})</b>: largest live allocations</p>"
        f"<table class='nbt-table'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def segment_figure(snapshot: MemorySnapshot, *, max_segments: int = 200) -> go.Figure:
    """The allocator's segments as stacked horizontal bars: allocated, free (rounding), free (cached).

    The ``max_segments`` largest segments are drawn, largest on top; the title gives
    the totals of all of them.
    """
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure
    from nbtoolkit.core.units import format_bytes

    summary = snapshot.segment_summary().sort_values("reserved", ascending=True, kind="stable")
    shown = summary.tail(max_segments)
    divisor, unit = _scale(float(shown["reserved"].max()) if len(shown) else 0.0)
    labels = [
        f"seg {s} (dev {d}, {t})"
        for s, d, t in zip(shown["segment"], shown["device"], shown["segment_type"], strict=True)
    ]
    figure = StaticFigure()
    for column, name, color in (
        ("allocated", "allocated", "indianred"),
        ("free_internal", "free: rounding", "orange"),
        ("free_external", "free: cached", "lightgray"),
    ):
        figure.add_trace(
            go.Bar(
                y=labels,
                x=shown[column] / divisor,
                name=name,
                orientation="h",
                marker={"color": color},
                hovertemplate=f"%{{y}}<br>{name}: %{{x:.2f}} {unit}<extra></extra>",
            )
        )
    stats = snapshot.stats()
    figure.update_layout(
        barmode="stack",
        template="plotly_white",
        title={
            "text": (
                f"{len(summary):,} segments: reserved {format_bytes(stats.total_reserved)}, allocated "
                f"{format_bytes(stats.total_allocated)}, free {format_bytes(stats.total_free)}; "
                f"fragmentation {100 * snapshot.fragmentation():.1f}%"
                + (f" (largest {len(shown)} shown)" if len(shown) < len(summary) else "")
            ),
            "font": {"size": 13},
        },
        xaxis_title=f"bytes ({unit})",
        height=min(900, 160 + 14 * len(shown)),
        yaxis={"showticklabels": len(shown) <= 60},
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return figure


def comparison_figure(
    before: MemoryTimeline,
    after: MemoryTimeline,
    *,
    labels: tuple[str, str] = ("before", "after"),
    max_points: int = 3000,
) -> go.Figure:
    """Total allocated bytes of two runs over their own time, and bytes at the peak by category."""
    from nbtoolkit.memory.timeline_analysis import compare_peaks

    table = compare_peaks(before.events, after.events, labels=labels)
    colors = ("gray", "seagreen")
    return _totals_and_peaks_figure(
        runs=[(before, labels[0], colors[0]), (after, labels[1], colors[1])],
        bars=[
            (list(table["category"]), table[f"{label}_bytes"], f"{label} at peak", color)
            for label, color in zip(labels, colors, strict=True)
        ],
        titles=("total over time", "at the peak, by category"),
        barmode="group",
        max_points=max_points,
    )


def ranks_figure(memory: RankMemory, *, max_points: int = 3000) -> go.Figure:
    """Total allocated bytes of each rank over its own time, and each rank's peak stacked by category."""
    from plotly.colors import qualitative

    from nbtoolkit.memory.schema import category_columns

    table = memory.peaks()
    palette = qualitative.D3
    ranks = [f"rank {r}" for r in table["rank"]]
    return _totals_and_peaks_figure(
        runs=[
            (memory.timeline(r), f"rank {r}", palette[i % len(palette)]) for i, r in enumerate(memory.ranks)
        ],
        bars=[
            (ranks, table[category], str(category), CATEGORY_COLORS.get(str(category), "grey"))
            for category in category_columns(table)
        ],
        titles=("total over time, per rank", "each rank's peak, by category"),
        barmode="stack",
        max_points=max_points,
    )


def _totals_and_peaks_figure(
    *,
    runs: list[tuple[MemoryTimeline, str, str]],
    bars: list[tuple[list[str], Any, str, str]],
    titles: tuple[str, str],
    barmode: str,
    max_points: int,
) -> go.Figure:
    """Total bytes over time per run (timeline, label, color) beside bars (x, bytes, name, color)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nbtoolkit.core.static_figure import StaticFigure
    from nbtoolkit.memory.timeline_analysis import category_series, decimate

    divisor, unit = _scale(float(max((t.peak_bytes for t, _, _ in runs), default=0)))
    figure = make_subplots(
        rows=1, cols=2, column_widths=[0.6, 0.4], subplot_titles=titles, figure=StaticFigure()
    )
    for timeline, label, color in runs:
        series = decimate(category_series(timeline.events), max_points=max_points)
        figure.add_trace(
            go.Scatter(
                x=series["time_us"] / 1e3,
                y=series["total"] / divisor,
                name=escape(label),
                mode="lines",
                line={"color": color},
                hovertemplate=f"{escape(label)}: %{{y:.2f}} {unit}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    for x, values, name, color in bars:
        figure.add_trace(
            go.Bar(
                x=x,
                y=values / divisor,
                name=escape(name),
                marker={"color": color},
                hovertemplate=f"%{{x}} {escape(name)}: %{{y:.2f}} {unit}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    figure.update_xaxes(title_text="time (ms)", row=1, col=1)
    figure.update_yaxes(title_text=f"allocated ({unit})", row=1, col=1)
    figure.update_layout(barmode=barmode, template="plotly_white", height=420, margin={"t": 50})
    return figure


def _figure_size_bytes(figure: Any) -> int:
    """Size of the figure's JSON as it is stored in a notebook output."""
    return len(figure.to_json().encode())
