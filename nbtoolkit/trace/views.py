"""Views of a Trace: the per-rank lane timeline, the overlap chart, and the report ``%nbt trace`` shows.

The timeline draws one lane per rank and stream (device) or thread (host); each lane
shows compute, communication, memory and other time in its own colour, collectives in
red, and ProfilerSteps as shaded bands. It stays responsive on traces with hundreds of
thousands of events by *decimating*: within a lane and kind, intervals closer together
than one pixel-equivalent (``span / resolution``) are merged before drawing, so the
figure never holds more than about ``resolution`` segments per lane and kind, whatever
the size of the trace. Segments are drawn with WebGL (``Scattergl``).

plotly is imported inside the functions (``%load_ext nbtoolkit`` stays light).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nbtoolkit.core.profiler_steps import PROFILER_STEP_PREFIX
from nbtoolkit.core.result import Result, html_table

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import StragglerReport, Trace

__all__ = ["TraceReport", "overlap_chart", "timeline"]

COLOURS = {
    "compute": "#4C78A8",
    "communication": "#E45756",
    "memory": "#54A24B",
    "other": "#9D9D9D",
    "host": "#72B7B2",
}


def _lanes(trace: Trace, rank: int) -> list[tuple[str, str, np.ndarray, np.ndarray, list[str]]]:
    """(lane label, kind, starts, ends, names) for one rank, device lanes first."""
    from nbtoolkit.trace import _kernels as k
    from nbtoolkit.trace.overlap import COMM_PREFIXES

    frame = trace.events[rank]
    out = []
    stream = frame["stream"].to_numpy()
    device = frame[stream >= 0]
    if len(device):
        kinds = k.kernel_types(device["name"])
        mapping = {
            k.COMPUTATION: "compute",
            k.COMMUNICATION: "communication",
            k.MEMORY: "memory",
            k.OTHER: "other",
        }
        for s in sorted(device["stream"].unique()):
            on = (device["stream"] == s).to_numpy()
            for hta_kind, kind in mapping.items():
                sel = on & (kinds == hta_kind)
                if sel.any():
                    rows = device[sel]
                    out.append(
                        (
                            f"rank {rank} · stream {s}",
                            kind,
                            rows["ts"].to_numpy(),
                            (rows["ts"] + rows["dur"]).to_numpy(),
                            rows["name"].astype(str).tolist(),
                        )
                    )
    host = frame[(stream < 0) & ~frame["name"].astype(str).str.startswith(PROFILER_STEP_PREFIX)]
    names = host["name"]
    comm_flags = np.array([str(c).startswith(COMM_PREFIXES) for c in names.cat.categories] + [False])
    is_comm = comm_flags[names.cat.codes.to_numpy()]
    threads = trace.info[rank].thread_names
    for (pid, tid), rows_index in host.groupby(["pid", "tid"], sort=True).indices.items():
        label = threads.get(f"{pid}:{tid}", f"thread {tid}")
        label = f"rank {rank} · {label}"
        for kind, sel in (("host", ~is_comm[rows_index]), ("communication", is_comm[rows_index])):
            rows = host.iloc[rows_index[sel]]
            if len(rows):
                out.append(
                    (
                        label,
                        kind,
                        rows["ts"].to_numpy(),
                        (rows["ts"] + rows["dur"]).to_numpy(),
                        rows["name"].astype(str).tolist(),
                    )
                )
    return out


def _decimate(
    starts: np.ndarray, ends: np.ndarray, names: list[str], gap: float
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Merge intervals closer than ``gap``; a merged segment is labelled with its event count."""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[:1] = True
    new[1:] = s[1:] > running[:-1] + gap
    firsts = np.flatnonzero(new)
    lasts = np.r_[firsts[1:], len(s)] - 1
    counts = lasts - firsts + 1
    labels = [
        names[order[f]] if c == 1 else f"{c} events, e.g. {names[order[f]]}"
        for f, c in zip(firsts, counts, strict=True)
    ]
    return s[firsts], running[lasts], labels


def timeline(trace: Trace, *, ranks: list[int] | None = None, resolution: int = 2000) -> Any:
    """Per-rank lane timeline as a plotly figure (see the module docstring).

    Args:
        ranks: ranks to draw (default: all, up to 16).
        resolution: segments per lane and kind at most; smaller is faster.
    """
    import plotly.graph_objects as go

    chosen = list(ranks) if ranks is not None else trace.ranks[:16]
    unknown = [r for r in chosen if r not in trace.events]
    if unknown:
        from nbtoolkit.core.errors import TraceError

        raise TraceError(
            f"ranks {unknown} are not in this trace (ranks present: {trace.ranks[:32]}); lanes of "
            "hundreds of ranks are unreadable: pick a few, e.g. the slowest from nbt.stragglers(...)"
        )
    lanes = [lane for r in chosen for lane in _lanes(trace, r)]
    if not lanes:
        return go.Figure()
    origin = min(float(lane[2].min()) for lane in lanes)
    span = max(float(lane[3].max()) for lane in lanes) - origin
    gap = span / max(resolution, 1)
    labels: list[str] = []
    for lane in lanes:
        if lane[0] not in labels:
            labels.append(lane[0])
    y_of = {label: i for i, label in enumerate(labels)}
    segments: dict[str, tuple[list[float], list[float], list[str]]] = {}
    for label, kind, starts, ends, names in lanes:
        s, e, text = _decimate(starts, ends, names, gap)
        xs, ys, hover = segments.setdefault(kind, ([], [], []))
        y = y_of[label]
        for a, b, t in zip((s - origin) / 1e3, (e - origin) / 1e3, text, strict=True):
            xs += [a, b, None]  # type: ignore[list-item]  # None breaks the line between segments
            ys += [y, y, None]  # type: ignore[list-item]
            hover += [t, t, ""]
    fig = go.Figure()
    for kind in ("compute", "communication", "memory", "other", "host"):
        if kind in segments:
            xs, ys, hover = segments[kind]
            fig.add_trace(
                go.Scattergl(
                    x=xs,
                    y=ys,
                    mode="lines",
                    name=kind,
                    line={"color": COLOURS[kind], "width": 10},
                    hovertext=hover,
                    hoverinfo="text+x",
                )
            )
    steps = trace.steps
    first_rank = chosen[0] if chosen else None
    for i, row in enumerate(steps[steps["rank"] == first_rank].itertuples(index=False)):
        fig.add_vrect(
            x0=(row.ts - origin) / 1e3,
            x1=(row.ts + row.dur - origin) / 1e3,
            fillcolor="#F2CF5B" if i % 2 == 0 else "#B8B0AC",
            opacity=0.15,
            line_width=0,
            annotation_text=f"step {row.step}",
            annotation_position="top left",
        )
    fig.update_layout(
        title=f"Timeline of {len(chosen)} rank(s) (ms from the first event)",
        xaxis_title="time (ms)",
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(len(labels))),
            "ticktext": labels,
            "autorange": "reversed",
        },
        height=max(250, 40 * len(labels) + 120),
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
    )
    return fig


def overlap_chart(trace_or_overlap: Trace | pd.DataFrame) -> Any:
    """Bar chart per rank: communication hidden behind compute vs exposed (ms), overlap % on top."""
    import plotly.graph_objects as go

    from nbtoolkit.trace.overlap import comm_comp_overlap
    from nbtoolkit.trace.trace import Trace

    overlap = comm_comp_overlap(trace_or_overlap) if isinstance(trace_or_overlap, Trace) else trace_or_overlap
    ranks = [f"rank {r}" for r in overlap["rank"]]
    fig = go.Figure()
    fig.add_bar(
        x=ranks, y=overlap["overlap_time_us"] / 1e3, name="hidden behind compute", marker_color="#54A24B"
    )
    fig.add_bar(
        x=ranks,
        y=overlap["exposed_comm_us"] / 1e3,
        name="exposed",
        marker_color="#E45756",
        text=[f"{p:.1f} % overlap" if np.isfinite(p) else "no comm" for p in overlap["overlap_pct"]],
        textposition="outside",
    )
    fig.update_layout(
        barmode="stack",
        title="Communication time per rank",
        yaxis_title="communication (ms)",
        height=360,
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
    )
    return fig


class _FigureDisplay(Result):
    """Shows its text/HTML bundle, then its figures (as plotly's own output) in a notebook."""

    def _figures(self) -> list[Any]:
        return []

    def _report_figures(self) -> list[Any]:  # used by nbt.report
        return self._figures()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)
        for fig in self._figures():
            display(fig)


@dataclass(repr=False, eq=False)
class TraceReport(_FigureDisplay):
    """What ``%nbt trace`` shows: summary, step times, breakdowns, overlap, stragglers, timeline.

    ``TraceReport.of(nbt.load_trace(path))``; each table is the result of the public analysis
    of the same name (``nbt.temporal_breakdown``, ``nbt.comm_comp_overlap``, ...).
    """

    trace: Trace
    temporal: pd.DataFrame
    overlap: pd.DataFrame
    idle: pd.DataFrame
    stragglers: StragglerReport
    kernel_types: pd.DataFrame | None = None

    @classmethod
    def of(cls, trace: Trace) -> TraceReport:
        from nbtoolkit.trace.breakdown import idle_breakdown, kernel_breakdown, temporal_breakdown
        from nbtoolkit.trace.overlap import comm_comp_overlap
        from nbtoolkit.trace.stragglers import stragglers

        return cls(
            trace=trace,
            temporal=temporal_breakdown(trace),
            overlap=comm_comp_overlap(trace),
            idle=idle_breakdown(trace),
            stragglers=stragglers(trace),
            kernel_types=kernel_breakdown(trace).by_type,
        )

    def _text(self) -> str:
        parts = [
            self.trace._text(),
            "Temporal breakdown (µs; HTA's definition):",
            self.temporal.round(2).to_string(index=False),
            "Communication/computation overlap (µs):",
            self.overlap.round(2).to_string(index=False),
        ]
        if self.kernel_types is not None and len(self.kernel_types):
            parts += [
                "Kernel time by type (µs, all ranks):",
                self.kernel_types.round(2).to_string(index=False),
            ]
        if len(self.idle):
            parts += ["Idle time per stream (µs):", self.idle.round(2).to_string(index=False)]
        parts.append(self.stragglers._text())
        return "\n".join(parts)

    def _html(self) -> str:
        parts = [
            self.trace._html(),
            "<p><b>Temporal breakdown</b> (µs; HTA's definition)</p>",
            html_table(self.temporal, max_rows=64),
            "<p><b>Communication/computation overlap</b> (µs)</p>",
            html_table(self.overlap, max_rows=64),
        ]
        if self.kernel_types is not None and len(self.kernel_types):
            parts += ["<p><b>Kernel time by type</b> (µs, all ranks)</p>", html_table(self.kernel_types)]
        if len(self.idle):
            parts += ["<p><b>Idle time per stream</b> (µs)</p>", html_table(self.idle, max_rows=64)]
        parts.append(self.stragglers._html())
        return "<div class='nbt-trace-report'>" + "".join(parts) + "</div>"

    def _figures(self) -> list[Any]:
        return [timeline(self.trace), overlap_chart(self.overlap)]
