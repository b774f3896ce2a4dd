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
**Static fallback.** A widget's MIME bundle carries, besides the widget view, a ``text/plain``
summary and a ``text/html`` overview: a small SVG of the whole range drawn from the same level
of detail (one column per pixel, 800 wide), so exported HTML, nbval and terminals still show
the timeline's shape. It stays a few tens of kB whatever the trace size; lane labels go
through :func:`escape`.
"""

from __future__ import annotations

from typing import Any

import anywidget
import numpy as np
import traitlets

from nbtoolkit.core.errors import NbtError, NbtUsageError
from nbtoolkit.timeline.assets import widget_asset
from nbtoolkit.timeline.lod import check_window, widen_window

__all__ = ["SVG_WIDTH", "TimelineWidget", "add_column"]

SVG_WIDTH = 800  # the static overview: one column per pixel


class TimelineWidget(anywidget.AnyWidget):
    """The widget both timelines share: synced state, the message loop, the static fallback.

    A subclass answers ``view_payload`` (one window's rectangles), ``select`` (a click),
    ``summary`` (its text) and ``overview_svg`` (its static picture).
    """

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


def add_column(cols: dict[str, list[np.ndarray]], key: str, values: np.ndarray) -> None:
    cols.setdefault(key, []).append(values)
