"""The critical path drawn over the rank's timeline lanes (plotly).

The lanes are :func:`nbtoolkit.trace.timeline_figure.timeline`'s; the path is one more trace on
top: each segment a wide translucent band on the lane it ran on (host thread or stream), the
waits and gaps between them as a thin dashed line, so the eye follows the chain from lane to
lane. The x axis is zoomed to the iteration. plotly is imported inside the function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from nbtoolkit.core.profiler_steps import PROFILER_STEP_PREFIX
from nbtoolkit.trace.timeline_figure import timeline

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = ["critical_path_figure", "lane_origin"]


class CriticalPath(Protocol):
    """What the figure reads of a :class:`nbtoolkit.trace.critical_path.CriticalPath` (whose
    ``figure()`` imports this module, so the fields are named here instead of importing it back)."""

    rank: int
    step: Any
    span_us: float
    length_us: float
    start_us: float
    segments: pd.DataFrame

PATH_COLOUR = "#222222"


def lane_origin(trace: Trace, rank: int) -> float:
    """The trace time (µs) that x = 0 ms is on the timeline of ``rank``: its first drawn event."""
    frame = trace.rank_events(rank)
    drawn = (frame["stream"].to_numpy() >= 0) | ~frame["name"].astype(str).str.startswith(
        PROFILER_STEP_PREFIX).to_numpy()
    return float(frame["ts"].to_numpy()[drawn].min())


def critical_path_figure(path: CriticalPath, trace: Trace) -> Any:
    """The rank's lanes with the critical path over them, zoomed to the iteration."""
    import plotly.graph_objects as go

    rank = path.rank
    fig = timeline(trace, ranks=[rank])
    labels = list(fig.layout.yaxis.ticktext or [])
    y_of = {label: i for i, label in enumerate(labels)}
    origin = lane_origin(trace, rank)
    frame = trace.rank_events(rank)
    threads = trace.info[rank].thread_names
    seg = path.segments
    lane: list[int | None] = []
    for row, stream in zip(seg["row"], seg["stream"], strict=True):
        if row < 0:
            lane.append(None)
        elif stream >= 0:
            lane.append(y_of.get(f"rank {rank} · stream {stream}"))
        else:
            pid, tid = int(frame["pid"].iat[row]), int(frame["tid"].iat[row])
            lane.append(y_of.get(f"rank {rank} · " + threads.get(f"{pid}:{tid}", f"thread {tid}")))
    # a gap sits on the lane the path was on before it (the first: the next segment's lane)
    known = [y for y in lane if y is not None]
    previous: int = known[0] if known else 0
    for i, y in enumerate(lane):
        previous = previous if y is None else y
        lane[i] = previous
    start = (seg["start_us"].to_numpy() - origin) / 1e3
    end = start + seg["dur_us"].to_numpy() / 1e3
    bands_x: list[float | None] = []
    bands_y: list[float | None] = []
    hover: list[str] = []
    for i, (a, b) in enumerate(zip(start, end, strict=True)):
        text = (f"{seg['kind'].iat[i]}: {seg['name'].iat[i]}<br>{seg['dur_us'].iat[i]:,.1f} µs, "
                f"{seg['share_pct'].iat[i]:.1f} % of the step")
        bands_x += [float(a), float(b), None]
        bands_y += [lane[i], lane[i], None]
        hover += [text, text, ""]
    fig.add_trace(go.Scatter(x=bands_x, y=bands_y, mode="lines", name="critical path",
                             line={"color": PATH_COLOUR, "width": 18}, opacity=0.35,
                             hovertext=hover, hoverinfo="text"))
    # the chain: from each segment's end to the next one's start, across lanes
    chain_x = np.repeat(end, 2)[:-1]
    chain_y = np.repeat(np.asarray(lane, dtype=float), 2)[1:]
    fig.add_trace(go.Scatter(x=chain_x, y=chain_y, mode="lines", name="path order",
                             line={"color": PATH_COLOUR, "width": 1, "dash": "dot"}, hoverinfo="skip"))
    left = (path.start_us - origin) / 1e3
    fig.update_xaxes(range=[left, left + path.span_us / 1e3])
    step = f"step {path.step}" if isinstance(path.step, int) else str(path.step)
    fig.update_layout(title=f"Critical path of rank {rank}, {step}: {path.span_us / 1e3:,.2f} ms, "
                            f"work on the path {path.length_us / 1e3:,.2f} ms")
    return fig
