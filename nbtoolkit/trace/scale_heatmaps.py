"""``nbt.rank_heatmaps``: ranks x iterations heatmaps for thousands of ranks, drawn with HoloViews.

Three per-rank, per-step numbers of a large job, each as one image (a rank is a row, a step a
column): step time, exposed communication, overlap %. They come from the per-rank summaries
(:func:`~nbtoolkit.trace.scale_views.rank_step_table`), so no event is read.

Why HoloViews, in the ``views`` extra: at thousands of ranks plotly's heatmap sends every cell
as JSON with its hover text and its figure grows with the cells; a HoloViews ``Image`` is one
raster the browser draws at once, and its ``Tap`` stream gives the rank and step of the cell
chosen, which ``on_select`` receives.

What the notebook shows is one widget box (an ipywidgets ``VBox``, made by :func:`_view_class`): the
heatmaps, a line naming the chosen cell ("rank R, step S") and, under it, that rank's timeline
widget. A click replaces the box's children from the kernel (widget state, no output capture),
so the timeline appears under the heatmaps whichever cell or callback the click arrives in.
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

__all__ = ["cell_timeline", "heatmap_layout", "rank_heatmaps"]

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
    """Ranks x iterations heatmaps as one widget box; a click on a cell shows that rank and step.

    Args:
        trace: a Trace (``nbt.load_trace(folder)``, any number of ranks) or a TraceSummary.
        values: which numbers, among ``step_time_ms``, ``exposed_comm_ms``, ``overlap_pct``.
        on_select: also called with ``(rank, step)`` on each click (after the box shows it).

    The box shows the heatmaps, then "rank R, step S" of the last cell clicked and that rank's
    timeline widget, zoomed to that step (only that rank's events are read). From a TraceSummary
    (no events) the line says so instead. ``view.hv_layout`` is the HoloViews layout, ``view.streams`` its Tap
    streams, ``view.selected`` the last ``(rank, step)``, ``view.timeline`` the widget shown.
    """
    from nbtoolkit.trace.trace import Trace

    layout = heatmap_layout(trace, values=values)
    opener = cell_timeline(trace, display_it=False) if isinstance(trace, Trace) else None
    view = _new_view(layout, opener, on_select)
    # each image has its own rows and columns (a step without communication has no overlap column)
    for tap, cells in zip(layout.streams, layout.cells_per_image, strict=True):
        ranks, steps = np.asarray(cells["ranks"]), np.asarray(cells["steps"])
        tap.add_subscriber(_cell_callback(ranks, steps, view.show_cell))
    return view


def heatmap_layout(
    trace: Trace | TraceSummary,
    *,
    values: Sequence[HeatmapValue] = _DEFAULT_VALUES,
    on_select: Callable[[int, int], Any] | None = None,
) -> Any:
    """The HoloViews ``Layout`` of the heatmaps (one ``Image`` per value), each with a ``Tap`` stream.

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
    cells_per_image = []
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
            # the image's axes run over cell positions; label them with the steps and ranks they stand for
            xticks=_ticks(steps),
            yticks=_ticks(ranks),
        )
        images.append(image)
        tap = hv.streams.Tap(source=image, x=None, y=None)
        if on_select is not None:
            tap.add_subscriber(_cell_callback(ranks, steps, on_select))
        taps.append(tap)
        cells_per_image.append({"ranks": ranks.tolist(), "steps": steps.tolist()})
    layout = hv.Layout(images).cols(min(2, len(images)))  # three 420-px plots in a row overflow a notebook
    layout.streams = taps  # the Tap stream of each image, in order (tests and users drive them)
    layout.cells_per_image = cells_per_image  # the ranks (rows) and steps (columns) of each image
    layout.cells = cells_per_image[-1] if cells_per_image else {"ranks": [], "steps": []}
    return layout


def _ticks(labels: np.ndarray, most: int = 12) -> list[tuple[int, str]]:
    """At most ``most`` ticks, evenly over the cell positions, each labelled with its step or rank."""
    if not len(labels):
        return []
    positions = np.unique(np.linspace(0, len(labels) - 1, min(len(labels), most)).round().astype(int))
    return [(int(position), str(int(labels[position]))) for position in positions]


def _cell_callback(ranks: np.ndarray, steps: np.ndarray, on_select: Callable[[int, int], Any]) -> Any:
    def chosen(x: float | None = None, y: float | None = None, **_: Any) -> None:
        if x is None or y is None or not len(ranks) or not len(steps):
            return
        i, j = round(y), round(x)
        if 0 <= i < len(ranks) and 0 <= j < len(steps):
            on_select(int(ranks[i]), int(steps[j]))

    return chosen


def _notebook_front_end() -> bool:
    """True in a running kernel (JupyterLab, Notebook, VS Code): widgets and HoloViews' JS can show."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _load_holoviews_js(hv: Any) -> None:
    """hv.extension once per kernel: it displays the bokeh JS the heatmaps need in the page.

    Skipped when the user already ran ``hv.extension(...)`` in this kernel, so their choice
    stands (``hv.extension("bokeh", inline=True)`` on a machine that cannot reach the CDN).
    """
    from holoviews.ipython import notebook_extension

    if not notebook_extension._loaded:
        hv.extension("bokeh", logo=False)


def _new_view(
    layout: Any, opener: Callable[[int, int], Any] | None, on_select: Callable[[int, int], Any] | None
) -> Any:
    """The widget box of :func:`rank_heatmaps` (see :func:`_view_class`)."""
    return _view_class()(layout, opener, on_select)


_VIEW_CLASS: Any = None


def _view_class() -> Any:
    """The ipywidgets ``VBox`` subclass, defined on first use so importing this module stays light."""
    global _VIEW_CLASS
    if _VIEW_CLASS is not None:
        return _VIEW_CLASS
    import ipywidgets

    class _RankHeatmapView(ipywidgets.VBox):
        """Heatmaps, the chosen cell's line, and that rank's timeline widget, in one box."""

        def __init__(
            self,
            layout: Any,
            opener: Callable[[int, int], Any] | None,
            on_select: Callable[[int, int], Any] | None,
        ) -> None:
            self.hv_layout = layout  # not .layout: that is the ipywidgets Layout trait
            self.streams = layout.streams
            self.cells = layout.cells
            self.selected: tuple[int, int] | None = None
            self.timeline: Any = None
            self._opener, self._on_select = opener, on_select
            self.heatmaps = ipywidgets.Output()
            if _notebook_front_end():
                hv = _holoviews()
                _load_holoviews_js(hv)
                with self.heatmaps:  # the HoloViews plot, its Tap comm back to this kernel included
                    from IPython.display import display

                    display(layout)
            self.cell_line = ipywidgets.HTML(
                "<span class='nbt-heatmap-cell'>click a cell to see that rank's timeline</span>"
            )
            super().__init__(children=[self.heatmaps, self.cell_line])
            self.add_class("nbt-rank-heatmaps")

        def show_cell(self, rank: int, step: int) -> None:
            """Name the cell, open that rank's timeline under the heatmaps, then call on_select."""
            from nbtoolkit.core.result import escape

            self.selected = (rank, step)
            text = f"rank {rank}, step {step}"
            children: list[Any] = [self.heatmaps]
            if self._opener is None:
                text += " (a TraceSummary holds no events: nbt.load_trace(folder) for the timeline)"
                self.timeline = None
            else:
                self.timeline = self._opener(rank, step)
            self.cell_line.value = f"<span class='nbt-heatmap-cell'>{escape(text)}</span>"
            children.append(self.cell_line)
            if self.timeline is not None:
                children.append(self.timeline)
            self.children = children
            if self._on_select is not None:
                self._on_select(rank, step)

    _VIEW_CLASS = _RankHeatmapView
    return _VIEW_CLASS


def cell_timeline(
    trace: Trace, shown: list[Any] | None = None, *, display_it: bool = True
) -> Callable[[int, int], Any]:
    """An ``on_select`` that opens the timeline widget of the chosen rank, zoomed to the chosen step.

    Only that rank's events are read (a RankFolderTrace reads its file, or the cache). Each widget
    made is appended to ``shown`` when given, and displayed when a notebook is running and
    ``display_it`` (rank_heatmaps' box puts it under the heatmaps itself: ``display_it=False``).
    """

    def open_rank(rank: int, step: int) -> Any:
        from nbtoolkit.trace.timeline_widget import timeline_widget

        widget = timeline_widget(trace, ranks=[rank])
        widget.show_step(rank, step)  # opens zoomed to the step the cell stood for
        if shown is not None:
            shown.append(widget)
        if display_it and _notebook_front_end():
            from IPython.display import display

            display(widget)
        return widget

    return open_rank
