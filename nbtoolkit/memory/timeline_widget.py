"""The memory timeline widget: a stacked memory timeline by category (:mod:`nbtoolkit.timeline.widget`
explains the widget), and its static overview."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import traitlets

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.units import format_bytes, format_seconds
from nbtoolkit.memory.timeline_index import memory_index
from nbtoolkit.timeline.lod import check_window
from nbtoolkit.timeline.widget import SVG_WIDTH, TimelineWidget

if TYPE_CHECKING:
    from nbtoolkit.memory.timeline_index import MemoryIndex

__all__ = ["MemoryTimelineWidget", "memory_overview_svg", "memory_widget"]

_CATEGORY_COLOURS = {
    "parameter": "#4C78A8",
    "optimizer_state": "#F58518",
    "input": "#B279A2",
    "temporary": "#EECA3B",
    "activation": "#54A24B",
    "gradient": "#E45756",
    "autograd_detail": "#72B7B2",
    "unsharded_parameter": "#88B8E0",
    "unsharded_gradient": "#F2A09F",
    "unknown": "#BAB0AC",
}


class MemoryTimelineWidget(TimelineWidget):
    """A stacked memory timeline by category; see the module docstring."""

    categories = traitlets.List(traitlets.Unicode()).tag(sync=True)
    peak = traitlets.List(traitlets.Float(), default_value=[0.0, 0.0]).tag(sync=True)  # [µs, bytes]

    def __init__(self, index: MemoryIndex, **kwargs: Any) -> None:
        self.index = index
        span = [0.0, max(index.end, 1e-3)]
        peak_at = int(np.argmax(index.total))
        peak_time = float(index.times[peak_at - 1]) if peak_at > 0 else 0.0
        super().__init__(
            kind="memory",
            title=f"memory on {index.timeline.device}, {_memory_count_text(index)}",
            lanes=[],
            categories=list(index.categories),
            span=span,
            window=span,
            peak=[peak_time, float(index.total[peak_at])],
            **kwargs,
        )

    def view_payload(
        self, t0: float, t1: float, width: int, *, client: str = "", rows: list[int] | None = None
    ) -> tuple[dict[str, Any], list[bytes]]:
        """Per pixel: max total f64, min total f64, time of the max f64 (µs from origin), and the
        bytes of each category at the max, f32, pixel-major."""
        view = self.index.view(t0, t1, width)
        header = {
            "type": "view",
            "t0": t0,
            "t1": t1,
            "width": width,
            "columns": ["max_total", "min_total", "max_time", "at_max"],
        }
        buffers = [
            view.max_total.astype(np.float64).tobytes(),
            view.min_total.astype(np.float64).tobytes(),
            view.max_time.astype(np.float64).tobytes(),
            np.ascontiguousarray(view.at_max, dtype=np.float32).tobytes(),
        ]
        return header, buffers

    def summary(self) -> str:
        index = self.index
        return (
            f"Memory timeline widget: {index.timeline.device}, {_memory_count_text(index)}, "
            f"peak {format_bytes(int(index.total.max()))} at {format_seconds(self.peak[0] / 1e6)}; "
            "wheel zooms, drag pans, click selects an instant (w.selected)"
        )

    def overview_svg(self) -> str:
        return memory_overview_svg(self.index)

    def select(self, content: dict[str, Any]) -> dict[str, Any]:
        """The state at a time (µs from origin): totals by category and the largest live allocations.

        Frames of this kernel's cells (in ``source`` and ``stack``) are named ``Cell In[N], line L``.
        """
        from nbtoolkit.core.cell_names import name_cells
        from nbtoolkit.memory.timeline_analysis import alive_at_peak

        index = self.index
        time = float(content["time"])
        check_window(time, time + 1.0, 1)  # a finite time, or a clear error
        state = index.state_at(time)
        events = index.events if index.events is not None else index.timeline.events
        alive = alive_at_peak(events, top=10, at_index=state - 1) if state > 0 else None
        records = [] if alive is None else alive.drop(columns=["stack_id"]).to_dict("records")
        for record in records:
            for key in ("source", "stack"):
                if isinstance(record.get(key), str):
                    record[key] = name_cells(record[key])
        return {
            "time_us": time,
            "total_bytes": int(index.total[state]),
            "by_category": {
                c: int(v) for c, v in zip(index.categories, index.by_category[state], strict=True)
            },
            "alive": records,
        }


def _memory_count_text(index: MemoryIndex) -> str:
    """The timeline's events, as its own length counts them, and those without a time (not drawn)."""
    total = len(index.times) + index.untimed
    note = f" ({index.untimed:,} without a finite time, not drawn)" if index.untimed else ""
    return f"{total:,} events{note}"


def memory_overview_svg(index: MemoryIndex, *, height: int = 160) -> str:
    """The whole memory timeline as an SVG: stacked categories at each pixel's highest total."""
    view = index.view(index.start, max(index.end, index.start + 1e-3), SVG_WIDTH)
    top = max(float(view.max_total.max()), 1.0)
    stacked = np.cumsum(np.maximum(view.at_max, 0), axis=1) / top * (height - 4)
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{SVG_WIDTH}' height='{height}'>"]
    x = np.arange(SVG_WIDTH)
    for j in range(len(index.categories) - 1, -1, -1):  # top of the stack first, lower ones over it
        y = height - stacked[:, j]
        points = " ".join(f"{a},{b:.1f}" for a, b in zip(x.tolist(), y.tolist(), strict=True))
        colour = _CATEGORY_COLOURS.get(index.categories[j], "#888")
        parts.append(f"<polygon fill='{colour}' points='0,{height} {points} {SVG_WIDTH - 1},{height}'/>")
    parts.append("</svg>")
    return "".join(parts)


def memory_widget(source: Any, *, device: int | None = None) -> MemoryTimelineWidget:
    """A zoomable stacked memory timeline of a MemoryTimeline or a CUDA MemorySnapshot.

    Every peak shows at any zoom (per pixel the highest total is drawn, with its categories).
    A click selects an instant: ``w.selected`` has its total, bytes per category and the ten
    largest live allocations. ``device`` picks a snapshot's device (default: the busiest).
    """
    from nbtoolkit.memory.snapshot import MemorySnapshot
    from nbtoolkit.memory.timeline import MemoryTimeline

    timeline: MemoryTimeline
    if isinstance(source, MemorySnapshot):
        timeline = source.timeline(device)
    elif isinstance(source, MemoryTimeline):
        timeline = source
    else:
        raise NbtUsageError(
            "memory_widget() takes a MemoryTimeline (nbt.memory_timeline) or a MemorySnapshot "
            f"(nbt.load_memory_snapshot); got {type(source).__name__}"
        )
    if not len(timeline.events):
        raise NbtUsageError("this memory timeline has no events: nothing to draw")
    return MemoryTimelineWidget(memory_index(timeline))
