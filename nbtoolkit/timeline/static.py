"""What a timeline widget shows where no widget can run, and when the magics choose the widget.

**Static fallback.** A widget's MIME bundle carries, besides the widget view, a ``text/plain``
summary and a ``text/html`` overview: a small SVG of the whole range drawn from the same level
of detail (one column per pixel, 800 wide), so exported HTML, nbval and terminals still show
the timeline's shape. It stays a few tens of kB whatever the trace size; lane labels go
through :func:`escape`.

**Widget or static, in the magics** (``%nbt trace``, ``%%nbt memory``, ``%nbt snapshot``):
``--widget`` / ``--static`` decide for one call; otherwise :func:`widgets_enabled` does:

- ``NBT_WIDGETS=1`` (or ``on``) always, ``NBT_WIDGETS=0`` (or ``off``) never;
- ``NBT_WIDGETS`` unset or ``auto``: a widget only in a kernel that a widget-capable front end
  started: an IPython *kernel* (not terminal IPython) that Jupyter Server started for a notebook
  (it sets ``JPY_SESSION_NAME``: JupyterLab, Notebook 7), or VS Code (``VSCODE_PID``) or Colab.
  Kernels started by nbval, nbconvert or papermill have none of these, so walkthroughs
  validated by nbval and exported reports keep their static figures and text unchanged.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.result import escape
from nbtoolkit.trace.views import TraceReport, overlap_chart

if TYPE_CHECKING:
    from nbtoolkit.memory.timeline_index import MemoryIndex
    from nbtoolkit.trace.timeline_index import TraceTimelineIndex

__all__ = [
    "WIDGETS_ENV",
    "TraceReportWithWidget",
    "memory_overview_svg",
    "trace_overview_svg",
    "widgets_enabled",
]

WIDGETS_ENV = "NBT_WIDGETS"
_ON = {"1", "on", "yes", "true", "widget"}
_OFF = {"0", "off", "no", "false", "static"}
_SVG_WIDTH = 800
_MAX_SVG_LANES = 48
_KIND_COLOURS = ("#4C78A8", "#E45756", "#54A24B", "#9D9D9D", "#72B7B2")  # analysis KINDS order
_CATEGORY_COLOURS = {
    "parameter": "#4C78A8",
    "optimizer_state": "#F58518",
    "input": "#B279A2",
    "temporary": "#EECA3B",
    "activation": "#54A24B",
    "gradient": "#E45756",
    "autograd_detail": "#72B7B2",
    "unknown": "#BAB0AC",
}


def widgets_enabled(environ: dict[str, str] | None = None, shell: Any = None) -> bool:
    """Whether the magics show a widget (see the module docstring for the rule)."""
    env = os.environ if environ is None else environ
    mode = env.get(WIDGETS_ENV, "auto").strip().lower() or "auto"
    if mode in _ON:
        return True
    if mode in _OFF:
        return False
    if mode != "auto":
        raise NbtUsageError(f"{WIDGETS_ENV}={mode!r} is not one of auto, 1/on, 0/off")
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:  # plain Python, terminal IPython
        return False
    return bool(env.get("JPY_SESSION_NAME") or env.get("VSCODE_PID") or "google.colab" in sys.modules)


def trace_overview_svg(index: TraceTimelineIndex) -> str:
    """The whole trace as an SVG: one row per lane, a bar per pixel that holds events."""
    lanes = index.lanes[:_MAX_SVG_LANES]
    row, label_w = 14, 170
    height = row * len(lanes) + 4
    svg_width = _SVG_WIDTH + label_w
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{svg_width}' height='{height}'>"]
    for i, lane in enumerate(lanes):
        y = i * row + 2
        parts.append(f"<text x='2' y='{y + 10}'>{escape(lane.label[:32])}</text>")
        if not len(lane.index):
            continue
        view = lane.index.view(0.0, index.duration, _SVG_WIDTH)
        kinds = index.kinds[lane.rank][view.agg_row]
        for kind in np.unique(kinds):
            px = view.agg_px[kinds == kind] + label_w
            path = "".join(f"M{x} {y}h1v{row - 3}h-1z" for x in px.tolist())
            parts.append(f"<path fill='{_KIND_COLOURS[int(kind)]}' d='{path}'/>")
    if len(index.lanes) > len(lanes):
        parts.append(f"<text x='2' y='{height - 2}'>… {len(index.lanes) - len(lanes)} more lanes</text>")
    parts.append("</svg>")
    return "".join(parts)


def memory_overview_svg(index: MemoryIndex, *, height: int = 160) -> str:
    """The whole memory timeline as an SVG: stacked categories at each pixel's highest total."""
    view = index.view(index.start, max(index.end, index.start + 1e-3), _SVG_WIDTH)
    top = max(float(view.max_total.max()), 1.0)
    stacked = np.cumsum(np.maximum(view.at_max, 0), axis=1) / top * (height - 4)
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{_SVG_WIDTH}' height='{height}'>"]
    x = np.arange(_SVG_WIDTH)
    for j in range(len(index.categories) - 1, -1, -1):  # top of the stack first, lower ones over it
        y = height - stacked[:, j]
        points = " ".join(f"{a},{b:.1f}" for a, b in zip(x.tolist(), y.tolist(), strict=True))
        colour = _CATEGORY_COLOURS.get(index.categories[j], "#888")
        parts.append(f"<polygon fill='{colour}' points='0,{height} {points} {_SVG_WIDTH - 1},{height}'/>")
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
