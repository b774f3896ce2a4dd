"""Timeline widgets for millions of events: the browser draws, the kernel decides what to draw.

``nbt.timeline_widget(trace)`` shows per-rank / per-stream lanes of a :class:`Trace`;
``nbt.memory_widget(timeline_or_snapshot)`` a stacked memory timeline by category. Both are
anywidgets whose front end is ``widgets/timeline.js``. The browser never holds the events:
on every zoom or pan it sends a custom message ``{"type": "view", t0, t1, width}`` and the
kernel answers with one screen's rectangles (:mod:`nbtoolkit.timeline.lod`) packed
into binary buffers, a few rectangles per pixel and lane, so data per view stays well under
1 MB whatever the trace size.

Only small state is synced (lane labels, the full time range, the current window, the
selection, the folded ranks): saving a notebook with widget state adds kilobytes, not the trace.
A click selects an event (trace) or an instant (memory); ``w.selected`` holds it as a dict.
``w.window`` is the range on screen ([t0, t1], µs from the origin): it follows zooms and pans,
and setting it from the notebook moves the view.

Times on the wire, in the kernel's indexes and in the page are µs relative to the widget's
origin (the first event), as float64: never epoch µs, whose float64 resolves only 0.25 µs
(Kineto's 1.69e15). Windows narrower than 1 ns are widened to 1 ns (the zoom's limit).

Ranks fold (trace widget): ``w.folded`` lists the ranks whose lanes show as one summary lane
(a click on a rank's header toggles it). A trace of more than one rank and more than
:data:`FOLD_ABOVE_LANES` lanes starts with every rank but the first folded, and the lanes area
scrolls past :data:`MAX_PLOT_ROWS` rows (``height`` sets that in pixels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anywidget
import numpy as np
import traitlets

from nbtoolkit.timeline.lod import check_window, widen_window
from nbtoolkit.memory.timeline_index import memory_index
from nbtoolkit.trace.timeline_index import KINDS, trace_timeline_index
from nbtoolkit.core.errors import NbtError, NbtUsageError
from nbtoolkit.core.units import format_bytes, format_seconds
from nbtoolkit.timeline.assets import widget_asset

if TYPE_CHECKING:
    from nbtoolkit.memory.timeline_index import MemoryIndex
    from nbtoolkit.trace.timeline_index import TraceTimelineIndex
    from nbtoolkit.memory.timeline import MemoryTimeline
    from nbtoolkit.trace.trace import Trace

__all__ = ["MemoryTimelineWidget", "TraceTimelineWidget", "memory_widget", "timeline_widget"]

MAX_NAME_CHARS = 300  # longer names (templated C++ kernels) are cut for hover; selection has them whole
DEFAULT_WIDTH = 1200
FOLD_ABOVE_LANES = 16  # more lanes than this (of several ranks): ranks after the first start folded
MAX_PLOT_ROWS = 20  # rows shown before the lanes area scrolls (the front end's default height)
MAX_STEP_BANDS = 2000


class _TimelineWidget(anywidget.AnyWidget):
    _esm = widget_asset("timeline.js")
    _css = widget_asset("timeline.css")

    kind = traitlets.Unicode("trace").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    lanes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    span = traitlets.List(traitlets.Float(), default_value=[0.0, 1.0]).tag(sync=True)  # µs from origin
    window = traitlets.List(traitlets.Float(), default_value=[0.0, 1.0]).tag(sync=True)
    selected = traitlets.Dict().tag(sync=True)
    height = traitlets.Int(0).tag(sync=True)  # px of the plot area; 0: sized to the rows (capped)

    @traitlets.validate("window")
    def _valid_window(self, proposal: Any) -> list[float]:
        """``w.window = [t0, t1]`` from the notebook: finite and in order; narrower than 1 ns widens."""
        value = list(proposal["value"])
        if len(value) != 2:
            raise NbtUsageError(f"w.window is [t0, t1] in µs from the origin; got {value!r}")
        t0, t1 = widen_window(float(value[0]), float(value[1]))
        check_window(t0, t1, 1)
        return [t0, t1]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_msg(self._on_message)
        self.last_view_bytes = 0  # measured: bytes of the last answer (header JSON + buffers)

    # The front end's messages: "view" asks for a window, "select" picks an event or instant.
    def _on_message(self, _widget: Any, content: dict[str, Any], _buffers: list[Any]) -> None:
        try:
            if content.get("type") == "view":
                rows = content.get("rows")
                t0, t1 = widen_window(float(content["t0"]), float(content["t1"]))
                header, buffers = self.view_payload(
                    t0,
                    t1,
                    int(content["width"]),
                    client=str(content.get("client", "")),
                    **({"rows": [int(r) for r in rows]} if isinstance(rows, list) else {}),
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
        self, t0: float, t1: float, width: int, *, client: str = "", rows: list[int] | None = None
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
        from nbtoolkit.core.result import escape

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
    # [rank, step, t0, t1] (µs from origin), every rank shown: drawn behind that rank's rows
    steps: traitlets.List[list[float]] = traitlets.List().tag(sync=True)
    ranks = traitlets.List(traitlets.Int()).tag(sync=True)  # ranks shown, in lane order
    rank_lanes: traitlets.List[list[int]] = traitlets.List().tag(sync=True)  # lane numbers per rank
    folded = traitlets.List(traitlets.Int()).tag(sync=True)  # ranks shown as one summary lane

    def __init__(self, index: TraceTimelineIndex, **kwargs: Any) -> None:
        self.index = index
        span = [0.0, index.duration]
        # Name ids: one global id per (rank, name code); code -1 (no name) gets the rank's last slot.
        self._name_offset: dict[int, int] = {}
        offset = 0
        for rank in index.kinds:
            self._name_offset[rank] = offset
            offset += len(index.categories[rank]) + 1
        self._names_sent: dict[str, set[int]] = {}
        rank_lanes = [index.lanes_of(rank) for rank in index.ranks]
        several = len(index.ranks) > 1
        folded = index.ranks[1:] if several and len(index.lanes) > FOLD_ABOVE_LANES else []
        super().__init__(
            kind="trace",
            title=f"{_lanes_text(index)}, {event_count_text(index)}",
            lanes=[lane.label for lane in index.lanes],
            span=span,
            window=span,
            steps=[list(step) for step in index.steps[:MAX_STEP_BANDS]],
            ranks=list(index.ranks) if several else [],  # one rank: no headers to fold
            rank_lanes=rank_lanes if several else [],
            folded=folded,
            **kwargs,
        )

    @traitlets.validate("folded")
    def _valid_folded(self, proposal: Any) -> list[int]:
        """``w.folded`` from the notebook: ranks this widget shows (in their order), each once."""
        asked = [int(r) for r in proposal["value"]]
        unknown = sorted(set(asked) - set(self.ranks))
        if unknown:
            shown = f"ranks shown: {self.ranks}" if self.ranks else "a one-rank timeline has nothing to fold"
            raise NbtUsageError(f"cannot fold rank(s) {unknown}: {shown}")
        return [r for r in self.ranks if r in asked]

    def view_payload(
        self, t0: float, t1: float, width: int, *, client: str = "", rows: list[int] | None = None
    ) -> tuple[dict[str, Any], list[bytes]]:
        """One window's rectangles of the rows asked for: a JSON header and binary column buffers.

        ``t0``/``t1`` are µs from the origin. ``rows``: lane numbers (``0 .. len(lanes) - 1``)
        and rank summaries (``len(lanes) + i`` for the i-th of ``w.ranks``); default every lane.
        Buffers (little endian), exact events then bins: row u16, start f64 (µs from origin) /
        pixel u16, dur f64 / count u32, event row i32, kind u8, name id u32; bins also busy f32.
        Names not yet sent to ``client`` come in the header's ``names`` ({id: text}).
        """
        index = self.index
        index.check(t0, t1, width)
        n_lanes = len(index.lanes)
        wanted = list(range(n_lanes)) if rows is None else list(dict.fromkeys(rows))
        bad = [r for r in wanted if not 0 <= r < n_lanes + len(index.ranks)]
        if bad:
            raise NbtUsageError(f"no timeline row {bad[0]}; rows are 0..{n_lanes + len(index.ranks) - 1}")
        sent = self._names_sent.setdefault(client, set())
        cols: dict[str, list[np.ndarray]] = {}
        new_names: dict[str, str] = {}
        for row_no in wanted:
            if row_no < n_lanes:
                rank = index.lanes[row_no].rank
                view = index.lanes[row_no].index.view(t0, t1, width)
            else:
                rank = index.ranks[row_no - n_lanes]
                view = index.rank_view(rank, t0, t1, width)
            kinds = index.kinds[rank]
            for prefix, event_rows in (("e", view.exact_row), ("a", view.agg_row)):
                codes = index.name_codes(rank, event_rows)
                base = self._name_offset[rank]
                missing = base + len(index.categories[rank])
                ids = np.where(codes < 0, missing, base + codes)
                unique, first = np.unique(ids, return_index=True)
                fresh = np.array([i not in sent for i in unique.tolist()], dtype=bool)
                if fresh.any():
                    texts = index.name(rank, event_rows[first[fresh]])
                    for i, text in zip(unique[fresh].tolist(), texts, strict=True):
                        new_names[str(i)] = text[:MAX_NAME_CHARS]
                        sent.add(i)
                _add(cols, f"{prefix}_lane", np.full(len(event_rows), row_no, np.uint16))
                _add(cols, f"{prefix}_row", event_rows.astype(np.int32))
                _add(cols, f"{prefix}_kind", kinds[event_rows].astype(np.uint8))
                _add(cols, f"{prefix}_name", ids.astype(np.uint32))
            _add(cols, "e_start", view.exact_start.astype(np.float64))
            # f64: at a 1 ns window a float32 duration of a 10 ms event is off by a whole window.
            _add(cols, "e_dur", view.exact_dur.astype(np.float64))
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
        index = self.index
        first = index.lanes[0].label if index.lanes else "none"
        return (
            f"Timeline widget: {_lanes_text(index)} (first: {first}), {event_count_text(index)} "
            f"over {format_seconds(index.duration / 1e6)}; "
            "wheel zooms, drag pans, click selects (w.selected)"
            + ("; click a rank's header to fold it (w.folded)" if len(index.ranks) > 1 else "")
        )

    def overview_svg(self) -> str:
        from nbtoolkit.timeline.static import trace_overview_svg

        return trace_overview_svg(self.index)

    def select(self, content: dict[str, Any]) -> dict[str, Any]:
        lane, row = int(content["lane"]), int(content["row"])
        n_lanes = len(self.index.lanes)
        if n_lanes <= lane < n_lanes + len(self.index.ranks):  # a folded rank's summary lane
            lane = self.index.lane_of_row(self.index.ranks[lane - n_lanes], row)
        event = self.index.event(lane, row)
        event["correlated"] = _correlated(self.index, lane, row)
        return event


def _lanes_text(index: TraceTimelineIndex) -> str:
    return f"{len(index.lanes)} lane{'' if len(index.lanes) == 1 else 's'}"


def event_count_text(index: TraceTimelineIndex) -> str:
    """The events of the ranks shown, as the trace's summary counts them, and what the lanes leave out."""
    left_out = []
    if index.step_rows:
        left_out.append(
            f"{index.step_rows:,} ProfilerStep annotation{'s' if index.step_rows != 1 else ''} "
            "drawn as step bands"
        )
    if index.untimed_rows:
        left_out.append(f"{index.untimed_rows:,} without a finite time, not drawn")
    note = f" ({'; '.join(left_out)})" if left_out else ""
    return f"{index.trace_events:,} events{note}"


class MemoryTimelineWidget(_TimelineWidget):
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
        from nbtoolkit.timeline.static import memory_overview_svg

        return memory_overview_svg(self.index)

    def select(self, content: dict[str, Any]) -> dict[str, Any]:
        """The state at a time (µs from origin): totals by category and the largest live allocations.

        Frames of this kernel's cells (in ``source`` and ``stack``) are named ``Cell In[N], line L``.
        """
        from nbtoolkit.memory.timeline_analysis import alive_at_peak
        from nbtoolkit.core.cell_names import name_cells

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
    from nbtoolkit.trace.trace import Trace

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
    from nbtoolkit.memory.timeline import MemoryTimeline
    from nbtoolkit.memory.snapshot import MemorySnapshot

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
