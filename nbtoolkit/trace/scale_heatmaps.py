"""``nbt.rank_heatmaps``: ranks x iterations heatmaps for thousands of ranks, drawn with HoloViews.

Three per-rank, per-step numbers of a large job, each as one image (a rank is a row, a step a
column): step time, exposed communication, overlap %. They come from the per-rank summaries
(:func:`~nbtoolkit.trace.scale_views.rank_step_table`), so no event is read.

Why HoloViews, in the ``views`` extra: at thousands of ranks plotly's heatmap sends every cell
as JSON with its hover text and its figure grows with the cells; a HoloViews ``Image`` is one
raster the browser draws at once, and its ``Tap`` stream gives the rank and step of the cell
chosen, which ``on_select`` receives (:func:`cell_timeline` opens that rank's timeline widget).
datashader is not needed: ranks x steps is at most a few hundred
thousand cells, one raster already. plotly stays the default of the small views
(``summary.figures()``).

HoloViews is imported inside the functions; without it the error says which extra to install.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.trace.scale_views import _TITLES, HeatmapValue, rank_step_table

if TYPE_CHECKING:
    from nbtoolkit.trace.summary import TraceSummary
    from nbtoolkit.trace.trace import Trace

__all__ = ["cell_timeline", "rank_heatmaps"]

_DEFAULT_VALUES: tuple[HeatmapValue, ...] = ("step_time_ms", "exposed_comm_ms", "overlap_pct")


def _holoviews() -> Any:
    try:
        import holoviews as hv
    except ImportError:
        raise NbtUsageError(
            "the rank heatmaps need HoloViews: pip install 'nbtoolkit[views]' (or pip install holoviews)"
        ) from None
    if not hv.Store.renderers:  # the bokeh backend once per process (what hv.extension loads)
        hv.extension("bokeh", logo=False)
    return hv


def _summary(trace: Any) -> TraceSummary:
    """The per-rank summary of a RankFolderTrace or TraceSummary; a held Trace is summarized here."""
    from nbtoolkit.trace.rank_folder_trace import RankFolderTrace
    from nbtoolkit.trace.summary import TraceSummary
    from nbtoolkit.trace.trace import Trace

    if isinstance(trace, RankFolderTrace):
        summary: TraceSummary = trace.summary
        return summary
    if isinstance(trace, TraceSummary):
        return trace
    if isinstance(trace, Trace):
        from nbtoolkit.trace.summarize_rank import summarize_trace

        return summarize_trace(trace)
    raise NbtUsageError(
        "rank_heatmaps() takes a Trace (nbt.load_trace(folder)) or a TraceSummary, "
        f"got {type(trace).__name__}"
    )


def rank_heatmaps(
    trace: Trace | TraceSummary,
    *,
    values: Sequence[HeatmapValue] = _DEFAULT_VALUES,
    on_select: Callable[[int, int], Any] | None = None,
) -> Any:
    """Ranks x iterations heatmaps (HoloViews ``Layout`` of ``Image``s, one per value).

    Args:
        trace: a Trace (``nbt.load_trace(folder)``, any number of ranks) or a TraceSummary.
        values: which numbers, among ``step_time_ms``, ``exposed_comm_ms``, ``overlap_pct``.
        on_select: called with ``(rank, step)`` when a cell is clicked (a HoloViews ``Tap``
            stream on each image; the streams are in ``layout.streams``).

    Rows are the ranks in order (row ``i`` is ``ranks[i]``, so missing ranks leave no hole),
    columns the steps; a cell without a value (a step without communication) is empty.
    """
    hv = _holoviews()
    summary = _summary(trace)
    unknown = [v for v in values if v not in _TITLES]
    if unknown or not values:
        raise NbtUsageError(f"values must be among {sorted(_TITLES)}, got {list(values)!r}")
    images = []
    taps = []
    for value in values:
        table = rank_step_table(summary, value)
        ranks = np.asarray(table.index, dtype=np.int64)
        steps = np.asarray(table.columns, dtype=np.int64)
        z = table.to_numpy(dtype=np.float64)
        # one pixel per cell: x = step position, y = rank position (Image rows run top down)
        image = hv.Image(
            z[::-1] if len(z) else np.zeros((1, 1)),
            bounds=(-0.5, -0.5, max(len(steps), 1) - 0.5, max(len(ranks), 1) - 0.5),
            kdims=["step_index", "rank_index"],
            vdims=[value],
            label=_TITLES[value],
        ).opts(
            cmap="Greens" if value == "overlap_pct" else "Reds",
            colorbar=True,
            tools=["hover", "tap"],
            width=420,
            height=min(900, 200 + len(ranks) // 4),
            xlabel="step",
            ylabel="rank",
        )
        images.append(image)
        tap = hv.streams.Tap(source=image, x=None, y=None)
        if on_select is not None:
            tap.add_subscriber(_cell_callback(ranks, steps, on_select))
        taps.append(tap)
    layout = hv.Layout(images).cols(len(images))
    layout.streams = taps  # the Tap stream of each image, in order (tests and users drive them)
    layout.cells = {"ranks": ranks.tolist(), "steps": steps.tolist()}
    return layout


def _cell_callback(ranks: np.ndarray, steps: np.ndarray, on_select: Callable[[int, int], Any]) -> Any:
    def chosen(x: float | None = None, y: float | None = None, **_: Any) -> None:
        if x is None or y is None or not len(ranks) or not len(steps):
            return
        i, j = round(y), round(x)
        if 0 <= i < len(ranks) and 0 <= j < len(steps):
            on_select(int(ranks[i]), int(steps[j]))

    return chosen


def cell_timeline(trace: Trace, shown: list[Any] | None = None) -> Callable[[int, int], Any]:
    """An ``on_select`` that opens the timeline widget of the chosen rank (``nbt.timeline_widget``).

    Only that rank's events are read (a RankFolderTrace reads its file, or the cache). Each widget
    made is appended to ``shown`` when given, and displayed when a notebook is running.
    """

    def open_rank(rank: int, step: int) -> Any:
        from nbtoolkit.trace.timeline_widget import timeline_widget

        widget = timeline_widget(trace, ranks=[rank])
        widget.chosen_step = step  # the step the cell stood for (its band is drawn in the lanes)
        if shown is not None:
            shown.append(widget)
        try:
            from IPython import get_ipython

            if get_ipython() is not None:
                from IPython.display import display

                display(widget)
        except ImportError:
            pass
        return widget

    return open_rank
