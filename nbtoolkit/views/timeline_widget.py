"""Timeline widgets for millions of events: the browser draws, the kernel decides what to draw.

``nbt.timeline_widget(trace)`` shows per-rank / per-stream lanes of a :class:`Trace`;
``nbt.memory_widget(timeline_or_snapshot)`` a stacked memory timeline by category. Both are
anywidgets whose front end is ``widgets/timeline.js``. The browser never holds the events:
on every zoom or pan it sends a custom message ``{"type": "view", t0, t1, width}`` and the
kernel answers with one screen's rectangles (:mod:`nbtoolkit.analysis.timeline_lod`) packed
into binary buffers, a few rectangles per pixel and lane, so data per view stays well under
1 MB whatever the trace size.

Only small state is synced (lane labels, the full time range, the current window, the
selection): saving a notebook with widget state adds kilobytes, not the trace.
A click selects an event (trace) or an instant (memory); ``w.selected`` holds it as a dict.
``w.window`` is the range on screen ([t0, t1], µs from the origin): it follows zooms and pans,
and setting it from the notebook moves the view.

Times on the wire are µs relative to the widget's origin (the first event), as float64.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anywidget
import numpy as np
import traitlets

from nbtoolkit.analysis.timeline_lod_memory import memory_index
from nbtoolkit.analysis.timeline_lod_trace import KINDS, trace_timeline_index
from nbtoolkit.errors import NbtError, NbtUsageError
from nbtoolkit.units import format_bytes, format_seconds
from nbtoolkit.views.timeline_widget_assets import widget_asset

if TYPE_CHECKING:
    from nbtoolkit.analysis.timeline_lod_memory import MemoryIndex
    from nbtoolkit.analysis.timeline_lod_trace import TraceTimelineIndex
    from nbtoolkit.model.memory import MemoryTimeline
    from nbtoolkit.model.trace import Trace

__all__ = ["MemoryTimelineWidget", "TraceTimelineWidget", "memory_widget", "timeline_widget"]

MAX_NAME_CHARS = 300  # longer names (templated C++ kernels) are cut for hover; selection has them whole
DEFAULT_WIDTH = 1200


class _TimelineWidget(anywidget.AnyWidget):
    _esm = widget_asset("timeline.js")
    _css = widget_asset("timeline.css")

    kind = traitlets.Unicode("trace").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    lanes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    span = traitlets.List(traitlets.Float(), default_value=[0.0, 1.0]).tag(sync=True)  # µs from origin
    window = traitlets.List(traitlets.Float(), default_value=[0.0, 1.0]).tag(sync=True)
    selected = traitlets.Dict().tag(sync=True)
    height = traitlets.Int(0).tag(sync=True)  # 0: sized to the lanes

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_msg(self._on_message)
        self.last_view_bytes = 0  # measured: bytes of the last answer (header JSON + buffers)

    # The front end's messages: "view" asks for a window, "select" picks an event or instant.
    def _on_message(self, _widget: Any, content: dict[str, Any], _buffers: list[Any]) -> None:
        try:
            if content.get("type") == "view":
                header, buffers = self.view_payload(
                    float(content["t0"]),
                    float(content["t1"]),
                    int(content["width"]),
                    client=str(content.get("client", "")),
                )
                header["id"] = content.get("id")
                self.last_view_bytes = len(repr(header)) + sum(len(b) for b in buffers)
                self.send(header, buffers)
            elif content.get("type") == "select":
                self.selected = self.select(content)
        except (NbtError, KeyError, TypeError, ValueError) as exc:
            # Shown in the widget's status line: the kernel stays usable.
            self.send({"type": "error", "id": content.get("id"), "message": str(exc)})

    def view_payload(
        self, t0: float, t1: float, width: int, *, client: str = ""
    ) -> tuple[dict[str, Any], list[bytes]]:
        raise NotImplementedError

    def select(self, content: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def summary(self) -> str:
        raise NotImplementedError

    def overview_svg(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The widget view, plus text and a static SVG overview for front ends without widgets."""
        from nbtoolkit.model._result import escape

        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        text = self.summary()
        data["text/plain"] = text
        data["text/html"] = (
            f"<div class='nbt-timeline-static'><p>{escape(text)}</p>{self.overview_svg()}</div>"
        )
        return data, metadata


class TraceTimelineWidget(_TimelineWidget):
    """Per-rank / per-stream lanes of a Trace; see the module docstring."""

    kinds = traitlets.List(traitlets.Unicode(), default_value=list(KINDS)).tag(sync=True)
    steps: traitlets.List[list[float]] = traitlets.List().tag(
        sync=True
    )  # [step, t0, t1] (µs from origin), first rank

    def __init__(self, index: TraceTimelineIndex, **kwargs: Any) -> None:
        self.index = index
        span = [0.0, index.end - index.origin]
        # Name ids: one global id per (rank, name code); code -1 (no name) gets the rank's last slot.
        self._name_offset: dict[int, int] = {}
        offset = 0
        for rank in index.kinds:
            self._name_offset[rank] = offset
            offset += len(index.categories[rank]) + 1
        self._names_sent: dict[str, set[int]] = {}
        super().__init__(
            kind="trace",
            title=f"{len(index.lanes)} lanes, {index.events:,} events",
            lanes=[lane.label for lane in index.lanes],
            span=span,
            window=span,
            steps=[[s, a - index.origin, b - index.origin] for s, a, b in index.steps[:2000]],
            **kwargs,
        )

    def view_payload(
        self, t0: float, t1: float, width: int, *, client: str = ""
    ) -> tuple[dict[str, Any], list[bytes]]:
        """One window's rectangles of every lane: a JSON header and binary column buffers.

        ``t0``/``t1`` are µs from the origin. Buffers (little endian), exact events then bins:
        lane u16, start f64 (µs from origin) / pixel u16, dur f32 / count u32, row i32,
        kind u8, name id u32; bins also busy f32. Names not yet sent to ``client`` come in
        the header's ``names`` ({id: text}).
        """
        index = self.index
        index.check(t0, t1, width)
        origin = index.origin
        sent = self._names_sent.setdefault(client, set())
        cols: dict[str, list[np.ndarray]] = {}
        new_names: dict[str, str] = {}
        for lane_no, lane in enumerate(index.lanes):
            view = lane.index.view(t0 + origin, t1 + origin, width)
            kinds = index.kinds[lane.rank]
            for prefix, rows in (("e", view.exact_row), ("a", view.agg_row)):
                codes = index.name_codes(lane.rank, rows)
                base = self._name_offset[lane.rank]
                missing = base + len(index.categories[lane.rank])
                ids = np.where(codes < 0, missing, base + codes)
                unique, first = np.unique(ids, return_index=True)
                fresh = np.array([i not in sent for i in unique.tolist()], dtype=bool)
                if fresh.any():
                    texts = index.name(lane.rank, rows[first[fresh]])
                    for i, text in zip(unique[fresh].tolist(), texts, strict=True):
                        new_names[str(i)] = text[:MAX_NAME_CHARS]
                        sent.add(i)
                _add(cols, f"{prefix}_lane", np.full(len(rows), lane_no, np.uint16))
                _add(cols, f"{prefix}_row", rows.astype(np.int32))
                _add(cols, f"{prefix}_kind", kinds[rows].astype(np.uint8))
                _add(cols, f"{prefix}_name", ids.astype(np.uint32))
            _add(cols, "e_start", (view.exact_start - origin).astype(np.float64))
            _add(cols, "e_dur", view.exact_dur.astype(np.float32))
            _add(cols, "a_px", view.agg_px.astype(np.uint16))
            _add(cols, "a_count", np.minimum(view.agg_count, 2**32 - 1).astype(np.uint32))
            _add(cols, "a_busy", view.agg_busy.astype(np.float32))
        order = [
            "e_lane", "e_start", "e_dur", "e_row", "e_kind", "e_name",
            "a_lane", "a_px", "a_count", "a_busy", "a_row", "a_kind", "a_name",
        ]  # fmt: skip
        arrays = {k: np.concatenate(cols[k]) if k in cols else np.zeros(0, np.uint8) for k in order}
        header = {
            "type": "view",
            "t0": t0,
            "t1": t1,
            "width": width,
            "columns": order,
            "exact": len(arrays["e_lane"]),
            "bins": len(arrays["a_lane"]),
            "names": new_names,
        }
        return header, [arrays[k].tobytes() for k in order]

    def summary(self) -> str:
        first = self.index.lanes[0].label if self.index.lanes else "none"
        return (
            f"Timeline widget: {len(self.index.lanes)} lanes (first: {first}), {self.index.events:,} events "
            f"over {format_seconds((self.index.end - self.index.origin) / 1e6)}; "
            "wheel zooms, drag pans, click selects (w.selected)"
        )

    def overview_svg(self) -> str:
        from nbtoolkit.views.timeline_widget_static import trace_overview_svg

        return trace_overview_svg(self.index)

    def select(self, content: dict[str, Any]) -> dict[str, Any]:
        lane, row = int(content["lane"]), int(content["row"])
        event = self.index.event(lane, row)
        event["correlated"] = _correlated(self.index, lane, row)
        return event


class MemoryTimelineWidget(_TimelineWidget):
    """A stacked memory timeline by category; see the module docstring."""

    categories = traitlets.List(traitlets.Unicode()).tag(sync=True)
    peak = traitlets.List(traitlets.Float(), default_value=[0.0, 0.0]).tag(sync=True)  # [µs, bytes]

    def __init__(self, index: MemoryIndex, **kwargs: Any) -> None:
        self.index = index
        span = [0.0, max(index.end - index.start, 1e-3)]
        peak_at = int(np.argmax(index.total))
        peak_time = float(index.times[peak_at - 1] - index.start) if peak_at > 0 else 0.0
        super().__init__(
            kind="memory",
            title=f"memory on {index.timeline.device}, {len(index.times):,} events",
            lanes=[],
            categories=list(index.categories),
            span=span,
            window=span,
            peak=[peak_time, float(index.total[peak_at])],
            **kwargs,
        )

    def view_payload(
        self, t0: float, t1: float, width: int, *, client: str = ""
    ) -> tuple[dict[str, Any], list[bytes]]:
        """Per pixel: max total f64, min total f64, time of the max f64 (µs from origin), and the
        bytes of each category at the max, f32, pixel-major."""
        start = self.index.start
        view = self.index.view(t0 + start, t1 + start, width)
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
            (view.max_time - start).astype(np.float64).tobytes(),
            np.ascontiguousarray(view.at_max, dtype=np.float32).tobytes(),
        ]
        return header, buffers

    def summary(self) -> str:
        index = self.index
        return (
            f"Memory timeline widget: {index.timeline.device}, {len(index.times):,} events, "
            f"peak {format_bytes(int(index.total.max()))} at {format_seconds(self.peak[0] / 1e6)}; "
            "wheel zooms, drag pans, click selects an instant (w.selected)"
        )

    def overview_svg(self) -> str:
        from nbtoolkit.views.timeline_widget_static import memory_overview_svg

        return memory_overview_svg(self.index)

    def select(self, content: dict[str, Any]) -> dict[str, Any]:
        """The state at a time (µs from origin): totals by category and the largest live allocations."""
        from nbtoolkit.analysis.memory import alive_at_peak

        index = self.index
        state = index.state_at(float(content["time"]) + index.start)
        alive = alive_at_peak(index.timeline.events, top=10, at_index=state - 1) if state > 0 else None
        return {
            "time_us": float(content["time"]),
            "total_bytes": int(index.total[state]),
            "by_category": {
                c: int(v) for c, v in zip(index.categories, index.by_category[state], strict=True)
            },
            "alive": [] if alive is None else alive.drop(columns=["stack_id"]).to_dict("records"),
        }


def _add(cols: dict[str, list[np.ndarray]], key: str, values: np.ndarray) -> None:
    cols.setdefault(key, []).append(values)


def _correlated(index: TraceTimelineIndex, lane: int, row: int) -> list[dict[str, Any]]:
    """The events of the same rank sharing the selected one's correlation id (kernel <-> launch)."""
    frame = index.trace.events[index.lanes[lane].rank]
    correlation = int(frame["correlation"].iloc[row])
    if correlation < 0:
        return []
    rows = np.flatnonzero(frame["correlation"].to_numpy() == correlation)
    rows = rows[rows != row][:4]
    return [
        {
            "name": str(frame["name"].iloc[r]),
            "stream": int(frame["stream"].iloc[r]),
            "ts_us": float(frame["ts"].iloc[r]),
        }
        for r in rows
    ]


def timeline_widget(trace: Trace, *, ranks: list[int] | None = None) -> TraceTimelineWidget:
    """A zoomable lane timeline of ``trace`` (all ranks, or ``ranks``) for the notebook.

    Zoom with the wheel, pan by dragging, hover for name/duration/stream/rank, click to select:
    ``w.selected`` is then the event (lane, rank, stream, name, cat, ts_us, dur_us, row and the
    events sharing its correlation id). Needs a front end with Jupyter widgets (JupyterLab,
    Notebook 7, VS Code); elsewhere its text and a static overview show.
    """
    from nbtoolkit.model.trace import Trace

    if not isinstance(trace, Trace):
        raise NbtUsageError(
            f"timeline_widget() takes a Trace (nbt.load_trace(path)); got {type(trace).__name__}"
        )
    # The lanes' pyramids finish in a background thread: the first view does not wait for them.
    return TraceTimelineWidget(trace_timeline_index(trace, ranks=ranks, background=True))


def memory_widget(source: Any, *, device: int | None = None) -> MemoryTimelineWidget:
    """A zoomable stacked memory timeline of a MemoryTimeline or a CUDA MemorySnapshot.

    Every peak shows at any zoom (per pixel the highest total is drawn, with its categories).
    A click selects an instant: ``w.selected`` has its total, bytes per category and the ten
    largest live allocations. ``device`` picks a snapshot's device (default: the busiest).
    """
    from nbtoolkit.model.memory import MemoryTimeline
    from nbtoolkit.model.snapshot import MemorySnapshot

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
