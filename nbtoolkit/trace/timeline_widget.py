"""The trace timeline widget: per-rank / per-stream lanes of a Trace (:mod:`nbtoolkit.timeline.widget`
explains the widget); its static overview; ``%nbt trace``'s report with the widget."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import traitlets

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.result import escape
from nbtoolkit.core.units import format_seconds
from nbtoolkit.timeline.widget import SVG_WIDTH, TimelineWidget, add_column
from nbtoolkit.trace.timeline_index import KINDS, trace_timeline_index
from nbtoolkit.trace.views import TraceReport, overlap_chart

if TYPE_CHECKING:
    from nbtoolkit.trace.timeline_index import TraceTimelineIndex
    from nbtoolkit.trace.trace import Trace

__all__ = [
    "TraceReportWithWidget",
    "TraceTimelineWidget",
    "event_count_text",
    "timeline_widget",
    "trace_overview_svg",
]

MAX_NAME_CHARS = 300  # longer names (templated C++ kernels) are cut for hover; selection has them whole
FOLD_ABOVE_LANES = 16  # more lanes than this (of several ranks): ranks after the first start folded
MAX_PLOT_ROWS = 20  # rows shown before the lanes area scrolls (the front end's default height)
MAX_STEP_BANDS = 2000
_MAX_SVG_LANES = 48
_KIND_COLOURS = ("#4C78A8", "#E45756", "#54A24B", "#9D9D9D", "#72B7B2")  # timeline_index.KINDS order


class TraceTimelineWidget(TimelineWidget):
    """Per-rank / per-stream lanes of a Trace; see the module docstring."""

    kinds = traitlets.List(traitlets.Unicode(), default_value=list(KINDS)).tag(sync=True)
    # [rank, step, t0, t1] (µs from origin), every rank shown: drawn behind that rank's rows
    steps: traitlets.List[list[float]] = traitlets.List().tag(sync=True)
    ranks = traitlets.List(traitlets.Int()).tag(sync=True)  # ranks shown, in lane order
    rank_lanes: traitlets.List[list[int]] = traitlets.List().tag(sync=True)  # lane numbers per rank
    folded = traitlets.List(traitlets.Int()).tag(sync=True)  # ranks shown as one summary lane
    chosen_step: int | None = None  # the ProfilerStep show_step zoomed to (a heatmap cell's)

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
                add_column(cols, f"{prefix}_lane", np.full(len(event_rows), row_no, np.uint16))
                add_column(cols, f"{prefix}_row", event_rows.astype(np.int32))
                add_column(cols, f"{prefix}_kind", kinds[event_rows].astype(np.uint8))
                add_column(cols, f"{prefix}_name", ids.astype(np.uint32))
            add_column(cols, "e_start", view.exact_start.astype(np.float64))
            # f64: at a 1 ns window a float32 duration of a 10 ms event is off by a whole window.
            add_column(cols, "e_dur", view.exact_dur.astype(np.float64))
            add_column(cols, "a_px", view.agg_px.astype(np.uint16))
            add_column(cols, "a_count", np.minimum(view.agg_count, 2**32 - 1).astype(np.uint32))
            add_column(cols, "a_busy", view.agg_busy.astype(np.float32))
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

    def show_step(self, rank: int, step: int, *, margin: float = 0.02) -> bool:
        """Zoom to ProfilerStep ``step`` of ``rank`` (with ``margin`` of its length each side).

        What a click on a rank heatmap's cell opens (:func:`~nbtoolkit.trace.scale_heatmaps.cell_timeline`).
        ``self.chosen_step`` becomes ``step``. False (and the window left as it is) when this
        widget holds no such step: a rank not shown, or a trace without ProfilerStep marks.
        """
        self.chosen_step = step
        spans = [(a, b) for r, s, a, b in self.index.steps if r == rank and s == step]
        if not spans:
            return False
        start, end = spans[0]
        pad = (end - start) * margin
        # not clamped to the events' span: a ProfilerStep mark can start before the first event shown
        self.window = [start - pad, end + pad]
        return True

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


def trace_overview_svg(index: TraceTimelineIndex) -> str:
    """The whole trace as an SVG: one row per lane, a bar per pixel that holds events."""
    lanes = index.lanes[:_MAX_SVG_LANES]
    row, label_w = 14, 170
    height = row * len(lanes) + 4
    svg_width = SVG_WIDTH + label_w
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{svg_width}' height='{height}'>"]
    for i, lane in enumerate(lanes):
        y = i * row + 2
        parts.append(f"<text x='2' y='{y + 10}'>{escape(lane.label[:32])}</text>")
        if not len(lane.index):
            continue
        view = lane.index.view(0.0, index.duration, SVG_WIDTH)
        kinds = index.kinds[lane.rank][view.agg_row]
        for kind in np.unique(kinds):
            px = view.agg_px[kinds == kind] + label_w
            path = "".join(f"M{x} {y}h1v{row - 3}h-1z" for x in px.tolist())
            parts.append(f"<path fill='{_KIND_COLOURS[int(kind)]}' d='{path}'/>")
    if len(index.lanes) > len(lanes):
        parts.append(f"<text x='2' y='{height - 2}'>… {len(index.lanes) - len(lanes)} more lanes</text>")
    parts.append("</svg>")
    return "".join(parts)


@dataclass(repr=False, eq=False)
class TraceReportWithWidget(TraceReport):
    """``%nbt trace`` in a widget front end: the summary, the timeline widget, the overlap chart.

    It stays a TraceReport (same tables; ``_report_figures`` stays static for ``nbt.report``);
    the widget is its ``widget`` attribute, so ``_nbt.widget.selected`` reads a click.
    """

    widget: Any = field(default=None)

    @classmethod
    def of_report(cls, report: TraceReport, widget: Any) -> TraceReportWithWidget:
        return cls(**{f.name: getattr(report, f.name) for f in fields(report)}, widget=widget)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)
        display(self.widget)
        display(overlap_chart(self.overlap))


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
