"""A plotly figure drawn as a static SVG, from its own data, without plotly.js or a browser.

The static form of every nbtoolkit figure (:mod:`nbtoolkit.core.static_figure` says why it is
drawn here). It draws what the figures of this package use, the way plotly lays it out:

- axes: linear, log and category, several per figure (``make_subplots`` domains, ``matches``
  shared ranges, ``autorange="reversed"``, ``tickvals``/``ticktext``), titles, grid lines;
- traces: see :mod:`nbtoolkit.core.svg_traces` (scatter lines, markers, text, fills and stacked
  areas; bars and histograms in every ``barmode``; heatmaps; icicles);
- shapes (rectangles and lines in data, ``paper`` or ``x domain`` coordinates: ``add_vrect``,
  ``add_hline``, phase bands), annotations (subplot titles, arrows), the title and a legend.

It is a picture, not plotly: no hover, fonts measured by estimate, a legend always below the
plot. Every text (trace names, labels, titles) is plain text escaped again, so markup or script
in a trace's text shows as text. Sizes: a line keeps at most four points per pixel column and a
heatmap is one PNG pixel per cell, so a figure costs tens of kilobytes whatever its data.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from nbtoolkit.core.result import escape
from nbtoolkit.core.svg_axes import Axis, is_categorical, plain_text, text_width
from nbtoolkit.core.svg_marks import Canvas, LegendEntry, Mark, trace_axis_values
from nbtoolkit.core.svg_traces import build_marks, legend_entries

__all__ = ["DEFAULT_WIDTH", "figure_svg"]

DEFAULT_WIDTH = 800  # px, as the timeline widget's static overview; the SVG scales to the page
_COLORWAY = ["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3", "#FF6692", "#B6E880"]
_AXIS_KEY = re.compile(r"^([xy])axis(\d*)$")
_DASHES = {"dash": "6,4", "dot": "2,3", "dashdot": "6,3,2,3", "longdash": "10,5"}
_LEGEND_ROW = 16.0
_CARTESIAN = ("scatter", "scattergl", "bar", "histogram", "heatmap")


def figure_svg(figure: Any) -> str:
    """The SVG of a plotly ``figure`` (a ``go.Figure``), as a string (see the module docstring)."""
    traces = [trace.to_plotly_json() for trace in figure.data]
    layout = figure.layout.to_plotly_json()
    template = (layout.get("template") or {}).get("layout") or {}
    colorway = list(layout.get("colorway") or template.get("colorway") or _COLORWAY)
    width = float(layout.get("width") or DEFAULT_WIDTH)
    height = float(layout.get("height") or 450)

    axes = _axes(layout, traces)
    marks = build_marks(traces, layout, colorway)
    legend = legend_entries(traces, layout, colorway)
    canvas = Canvas(axes=axes, left=0.0, top=0.0, right=width, bottom=height)
    for mark in marks:
        mark.register(canvas)
    _settle_ranges(axes)

    title_lines = [line for line in plain_text(_text_of(layout.get("title"))).split("\n") if line.strip()]
    top = 12.0 + 18.0 * len(title_lines) + (8.0 if title_lines else 0.0) + _room_above(layout)
    left = _left_margin(axes, width)
    right = 16.0 + max((mark.right_px for mark in marks), default=0.0)
    legend_rows = _legend_rows(legend, width - 24)
    label_room = _bottom_labels(axes, width - left - right)
    bottom = label_room + (_LEGEND_ROW * len(legend_rows) + 6 if legend_rows else 0.0) + 6
    height = max(height, top + bottom + 80)  # a plot area of at least 80 px
    canvas.left, canvas.top, canvas.right, canvas.bottom = left, top, width - right, height - bottom
    _place_axes(axes, canvas)

    body: list[str] = [f"<rect width='{width:.0f}' height='{height:.0f}' fill='#fff'/>"]
    pairs = _subplots(axes, marks)
    clips = {pair: f"@ID@c{i}" for i, pair in enumerate(pairs)}
    body.append("<defs>" + "".join(_clip_rect(clips[p], axes[p[0]], axes[p[1]]) for p in pairs) + "</defs>")
    body += [_grid(axes[x], axes[y]) for x, y in pairs]
    shapes = layout.get("shapes") or []
    body += [_shape(s, canvas, clips) for s in shapes if s.get("layer") == "below"]
    for mark in marks:
        drawn = mark.svg(canvas)
        pair = (mark.xref, mark.yref)
        body.append(f"<g clip-path='url(#{clips[pair]})'>{drawn}</g>" if pair in clips and drawn else drawn)
        body.append(mark.svg_outside(canvas))
    body += [_shape(s, canvas, clips) for s in shapes if s.get("layer") != "below"]
    body += [_axis_labels(axis, axes) for axis in axes.values()]
    body += [_annotation(a, canvas) for a in layout.get("annotations") or []]
    body.append(_title(title_lines, layout, left))
    body.append(_legend(legend_rows, height - _LEGEND_ROW * len(legend_rows) - 4))
    content = "".join(body)
    # ids unique per figure in a page, and the same for the same figure (not a security hash)
    uid = "nbt" + hashlib.sha1(content.encode(), usedforsecurity=False).hexdigest()[:10]
    label = escape(" ".join(title_lines) or "figure")
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' class='nbt-figure-svg' role='img' aria-label='{label}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}' width='{width:.0f}' height='{height:.0f}' "
        "style='max-width:100%;height:auto' font-family='sans-serif' font-size='11'>"
        f"{content.replace('@ID@', uid)}</svg>"
    )


def _text_of(title: Any) -> Any:
    return title.get("text") if isinstance(title, dict) else title


def _axes(layout: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Axis]:
    """Every axis of the layout and of the traces, by reference, with its kind and categories."""
    axes: dict[str, Axis] = {}
    for key, spec in layout.items():
        if _AXIS_KEY.match(key):
            axis = Axis(name=key, spec=dict(spec or {}))
            axes[axis.ref] = axis
    for trace in traces:
        if trace.get("type", "scatter") not in _CARTESIAN:
            continue  # an icicle lays itself out on the paper: no axes of its own
        for letter in ("x", "y"):
            ref = str(trace.get(f"{letter}axis") or letter)
            axes.setdefault(ref, Axis(name=f"{letter}axis{ref[1:]}", spec={}))
    if any(ref.startswith("x") for ref in axes) or any(ref.startswith("y") for ref in axes):
        for letter in ("x", "y"):  # an axis always has its partner
            axes.setdefault(letter, Axis(name=f"{letter}axis", spec={}))
    values: dict[str, list[Any]] = {ref: [] for ref in axes}
    for trace in traces:
        for letter, data in trace_axis_values(trace):
            values[str(trace.get(f"{letter}axis") or letter)].append(data)
    for ref, axis in axes.items():
        kind = str(axis.spec.get("type") or "-")
        group = [ref, *_matched(axis, axes)]
        if kind in ("category", "multicategory") or (
            kind not in ("linear", "log") and any(is_categorical(v) for r in group for v in values.get(r, []))
        ):
            axis.kind = "category"
        elif kind == "log":
            axis.kind = "log"
    for ref, axis in axes.items():
        if axis.kind == "category":
            for member in [ref, *_matched(axis, axes)]:
                for data in values.get(member, []):
                    axis.learn_categories(data)
    return axes


def _matched(axis: Axis, axes: dict[str, Axis]) -> list[str]:
    """The axes sharing a range with ``axis`` through ``matches`` (either way round)."""
    target = axis.spec.get("matches")
    return [
        ref
        for ref, other in axes.items()
        if other is not axis
        and (
            ref == target
            or other.spec.get("matches") == axis.ref
            or (target and other.spec.get("matches") == target)
        )
    ]


def _settle_ranges(axes: dict[str, Axis]) -> None:
    for axis in axes.values():
        for ref in _matched(axis, axes):
            other = axes[ref]
            axis._extent += other._extent
            axis.padded = axis.padded or other.padded
    for axis in axes.values():
        axis.settle_range()


def _room_above(layout: dict[str, Any]) -> float:
    """Room above the plot for annotations that sit on its top edge (subplot titles)."""
    above = [
        a
        for a in layout.get("annotations") or []
        if a.get("yref") == "paper" and float(a.get("y", 0) or 0) >= 0.99 and a.get("yanchor") == "bottom"
    ]
    return 18.0 if above else 0.0


def _left_margin(axes: dict[str, Axis], width: float) -> float:
    """Room left of the plot for the tick labels and title of the y axes at the left edge."""
    needed = 20.0
    for axis in axes.values():
        if axis.letter != "y" or _anchor_start(axis, axes) > 0.01:
            continue
        axis.start_px, axis.end_px = 300.0, 0.0  # a provisional length for the tick choice
        labels = [label for _, label in axis.ticks()] if axis.shows_labels() else []
        room = max((text_width(label) for label in labels), default=0.0) + 10
        needed = max(needed, room + (18.0 if axis.title() else 0.0))
    return float(min(needed, 0.35 * width, 260.0))


def _anchor_start(axis: Axis, axes: dict[str, Axis]) -> float:
    anchor = axes.get(str(axis.spec.get("anchor") or ("x" if axis.letter == "y" else "y")))
    return anchor.domain()[0] if anchor is not None else 0.0


def _bottom_labels(axes: dict[str, Axis], plot_width: float) -> float:
    """Room below the plot for the lowest x axes' tick labels and titles; long category labels
    are turned (``Axis.spec['_turn']``) when they would not fit side by side."""
    room = 8.0
    for axis in axes.values():
        if axis.letter != "x" or _anchor_start(axis, axes) > 0.01:
            continue
        need = 0.0
        if axis.shows_labels():
            need = 16.0
            if axis.kind == "category" and axis.categories:
                d0, d1 = axis.domain()
                spacing = plot_width * (d1 - d0) / len(axis.categories)
                widest = max(text_width(c[:28]) for c in axis.categories)
                if widest + 6 > spacing:
                    axis.spec["_turn"] = True
                    need = min(widest * 0.5 + 14, 110.0)
        room = max(room, need + (18.0 if axis.title() else 0.0))
    return room


def _place_axes(axes: dict[str, Axis], canvas: Canvas) -> None:
    width, height = canvas.right - canvas.left, canvas.bottom - canvas.top
    for axis in axes.values():
        d0, d1 = axis.domain()
        if axis.letter == "x":
            axis.start_px, axis.end_px = canvas.left + d0 * width, canvas.left + d1 * width
        else:
            axis.start_px, axis.end_px = canvas.bottom - d0 * height, canvas.bottom - d1 * height


def _subplots(axes: dict[str, Axis], marks: list[Mark]) -> list[tuple[str, str]]:
    """The (x, y) axis pairs that hold a plot: each x axis with its anchor, and those traces use."""
    pairs: list[tuple[str, str]] = []
    for ref, axis in axes.items():
        if axis.letter == "x":
            anchor = str(axis.spec.get("anchor") or "y")
            if anchor in axes and (ref, anchor) not in pairs:
                pairs.append((ref, anchor))
    for mark in marks:
        pair = (mark.xref, mark.yref)
        if pair[0] in axes and pair[1] in axes and pair not in pairs:
            pairs.append(pair)
    return pairs


def _clip_rect(uid: str, x: Axis, y: Axis) -> str:
    left, right = sorted((x.start_px, x.end_px))
    top, bottom = sorted((y.start_px, y.end_px))
    return (
        f"<clipPath id='{uid}'><rect x='{left:.1f}' y='{top:.1f}' width='{right - left:.1f}' "
        f"height='{bottom - top:.1f}'/></clipPath>"
    )


def _grid(x: Axis, y: Axis) -> str:
    """Grid lines of a subplot (none along category axes), zero lines and the axes' base lines."""
    left, right = sorted((x.start_px, x.end_px))
    top, bottom = sorted((y.start_px, y.end_px))
    lines: list[str] = []
    zero: list[str] = []
    if x.kind != "category":
        for value, _ in x.ticks():
            px = float(x.px(value))
            (zero if value == 0 and x.kind == "linear" else lines).append(f"M{px:.1f} {top:.1f}V{bottom:.1f}")
    if y.kind != "category":
        for value, _ in y.ticks():
            py = float(y.px(value))
            (zero if value == 0 and y.kind == "linear" else lines).append(f"M{left:.1f} {py:.1f}H{right:.1f}")
    return (
        f"<path stroke='#ebebeb' fill='none' d='{''.join(lines)}'/>"
        + (f"<path stroke='#bbb' fill='none' d='{''.join(zero)}'/>" if zero else "")
        + f"<path stroke='#999' fill='none' d='M{left:.1f} {top:.1f}V{bottom:.1f}H{right:.1f}'/>"
    )


def _axis_labels(axis: Axis, axes: dict[str, Axis]) -> str:
    """Tick labels and the title of one axis, on the side of its anchor's domain start."""
    anchor = axes.get(str(axis.spec.get("anchor") or ("y" if axis.letter == "x" else "x")))
    if anchor is None:
        return ""
    out = []
    if axis.letter == "x":
        base = max(anchor.start_px, anchor.end_px)
        if axis.shows_labels():
            turn = bool(axis.spec.get("_turn"))
            for value, label in axis.ticks():
                px = float(axis.px(value))
                text = escape(label if len(label) <= 28 else label[:27] + "…")
                if turn:
                    out.append(
                        f"<text transform='translate({px + 3:.1f} {base + 8:.1f}) rotate(-35)' "
                        f"text-anchor='end' font-size='10'>{text}</text>"
                    )
                else:
                    out.append(f"<text x='{px:.1f}' y='{base + 14:.1f}' text-anchor='middle'>{text}</text>")
        if axis.title():
            room = (
                16.0
                if not axis.spec.get("_turn")
                else min(max((text_width(c[:28]) for c in axis.categories), default=0) * 0.5 + 14, 110.0)
            )
            middle = (axis.start_px + axis.end_px) / 2
            out.append(
                f"<text x='{middle:.1f}' y='{base + room + 14:.1f}' text-anchor='middle' "
                f"fill='#444'>{escape(axis.title())}</text>"
            )
        return "".join(out)
    edge = min(anchor.start_px, anchor.end_px)
    room = edge - _left_neighbour(anchor, axes) - (20.0 if axis.title() else 6.0)
    widest = 0.0
    if axis.shows_labels():
        for value, label in axis.ticks():
            chars = max(int(room / text_width("m")), 3)
            text = label if len(label) <= chars else label[: chars - 1] + "…"
            widest = max(widest, text_width(text))
            out.append(
                f"<text x='{edge - 5:.1f}' y='{float(axis.px(value)) + 4:.1f}' "
                f"text-anchor='end'>{escape(text)}</text>"
            )
    if axis.title():
        middle = (axis.start_px + axis.end_px) / 2
        x = edge - widest - 12
        out.append(
            f"<text transform='translate({x:.1f} {middle:.1f}) rotate(-90)' text-anchor='middle' "
            f"fill='#444'>{escape(axis.title())}</text>"
        )
    return "".join(out)


def _left_neighbour(x_axis: Axis, axes: dict[str, Axis]) -> float:
    """Pixel where the room for a y axis's labels begins: the end of the x domain to its left."""
    start = min(x_axis.start_px, x_axis.end_px)
    ends = [
        max(a.start_px, a.end_px)
        for a in axes.values()
        if a.letter == "x" and max(a.start_px, a.end_px) < start - 1
    ]
    return max(ends, default=0.0)


def _position(ref: Any, value: Any, letter: str, canvas: Canvas) -> float | None:
    """Pixel of a shape's or annotation's coordinate in its reference (an axis, its domain, the paper)."""
    ref = str(ref or letter)
    low, high = (canvas.left, canvas.right) if letter == "x" else (canvas.bottom, canvas.top)
    if ref == "paper":
        return low + float(value) * (high - low)
    if ref.endswith(" domain"):
        axis = canvas.axes.get(ref.split(maxsplit=1)[0])
        if axis is None:
            return None
        return axis.start_px + float(value) * (axis.end_px - axis.start_px)
    axis = canvas.axes.get(ref)
    if axis is None or value is None:
        return None
    coded = axis.code([value])
    return float(axis.px(coded[0])) if math.isfinite(coded[0]) else None


def _shape(shape: dict[str, Any], canvas: Canvas, clips: dict[tuple[str, str], str]) -> str:
    kind = shape.get("type", "rect")
    if kind not in ("rect", "line") or shape.get("visible") is False:
        return ""
    xref, yref = str(shape.get("xref") or "x"), str(shape.get("yref") or "y")
    x0, x1 = (_position(xref, shape.get(k, 0), "x", canvas) for k in ("x0", "x1"))
    y0, y1 = (_position(yref, shape.get(k, 0), "y", canvas) for k in ("y0", "y1"))
    if None in (x0, x1, y0, y1):
        return ""
    assert x0 is not None and x1 is not None and y0 is not None and y1 is not None
    line = shape.get("line") or {}
    width = float(line.get("width", 2) if line.get("width") is not None else 2)
    stroke = (
        f" stroke='{escape(line.get('color') or '#444')}' stroke-width='{width:g}'"
        + (f" stroke-dasharray='{_DASHES[line['dash']]}'" if line.get("dash") in _DASHES else "")
        if width > 0
        else ""
    )
    opacity = shape.get("opacity")
    fade = f" opacity='{float(opacity):.2f}'" if isinstance(opacity, (int, float)) and opacity < 1 else ""
    if kind == "line":
        drawn = f"<path fill='none'{stroke}{fade} d='M{x0:.1f} {y0:.1f}L{x1:.1f} {y1:.1f}'/>"
    else:
        fill = escape(shape.get("fillcolor") or "none")
        drawn = (
            f"<rect x='{min(x0, x1):.1f}' y='{min(y0, y1):.1f}' width='{abs(x1 - x0):.1f}' "
            f"height='{abs(y1 - y0):.1f}' fill='{fill}'{stroke}{fade}/>"
        )
    pair = (xref.split(maxsplit=1)[0], yref.split(maxsplit=1)[0])
    return f"<g clip-path='url(#{clips[pair]})'>{drawn}</g>" if pair in clips else drawn


def _annotation(note: dict[str, Any], canvas: Canvas) -> str:
    if note.get("visible") is False:
        return ""
    x = _position(note.get("xref"), note.get("x", 0.5), "x", canvas)
    y = _position(note.get("yref"), note.get("y", 0.5), "y", canvas)
    lines = [line for line in plain_text(note.get("text")).split("\n") if line]
    if x is None or y is None or not lines:
        return ""
    size = min(float((note.get("font") or {}).get("size") or 12), 14.0)
    arrow = ""
    if note.get("showarrow", True) is not False:
        tx, ty = x + float(note.get("ax", -10) or 0), y + float(note.get("ay", -30) or 0)
        arrow = f"<path stroke='#444' fill='none' d='M{tx:.1f} {ty:.1f}L{x:.1f} {y:.1f}'/>"
        x, y = tx, ty - 2
        anchor_y = "bottom"
    else:
        anchor_y = str(note.get("yanchor") or "middle")
    anchor = {"left": "start", "right": "end"}.get(str(note.get("xanchor")), "middle")
    block = size * 1.2 * len(lines)
    first = (
        y + size * 0.85
        if anchor_y == "top"
        else y - block + size * 0.85
        if anchor_y == "bottom"
        else (y - block / 2 + size * 0.85)
    )
    spans = "".join(
        f"<tspan x='{x:.1f}' y='{first + i * size * 1.2:.1f}'>{escape(line)}</tspan>"
        for i, line in enumerate(lines)
    )
    return f"{arrow}<text text-anchor='{anchor}' font-size='{size:g}' fill='#333'>{spans}</text>"


def _title(lines: list[str], layout: dict[str, Any], left: float) -> str:
    if not lines:
        return ""
    given = layout.get("title")
    title: dict[str, Any] = given if isinstance(given, dict) else {}
    size = min(float((title.get("font") or {}).get("size") or 15), 16.0)
    spans = "".join(
        f"<tspan x='{max(left, 8.0):.1f}' y='{20 + 18 * i:.1f}' font-size='{size if i == 0 else 11:g}'>"
        f"{escape(line)}</tspan>"
        for i, line in enumerate(lines)
    )
    return f"<text fill='#222'>{spans}</text>"


def _legend_rows(entries: list[LegendEntry], room: float) -> list[list[tuple[float, LegendEntry]]]:
    """Entries laid out in rows below the plot: (x, entry) per row, wrapped at ``room`` px."""
    rows: list[list[tuple[float, LegendEntry]]] = []
    x = room + 1
    for entry in entries[:60]:
        span = 26 + text_width(entry.name[:40]) + 14
        if x + span > room and (not rows or rows[-1]):
            rows.append([])
            x = 0.0
        rows[-1].append((x, entry))
        x += span
    return rows


def _legend(rows: list[list[tuple[float, LegendEntry]]], top: float) -> str:
    out = []
    for r, row in enumerate(rows):
        y = top + r * _LEGEND_ROW + 8
        for offset, entry in row:
            x = offset + 12
            colour = escape(entry.color)
            if entry.symbol == "box":
                fade = f" fill-opacity='{entry.opacity:g}'" if entry.opacity < 1 else ""
                out.append(
                    f"<rect x='{x:.1f}' y='{y - 5:.1f}' width='18' height='10' fill='{colour}'{fade}/>"
                )
            elif entry.symbol == "marker":
                out.append(f"<circle cx='{x + 9:.1f}' cy='{y:.1f}' r='4' fill='{colour}'/>")
            else:
                dash = f" stroke-dasharray='{_DASHES[entry.dash]}'" if entry.dash in _DASHES else ""
                out.append(f"<path stroke='{colour}' stroke-width='2'{dash} d='M{x:.1f} {y:.1f}h18'/>")
            name = entry.name if len(entry.name) <= 40 else entry.name[:39] + "…"
            out.append(f"<text x='{x + 24:.1f}' y='{y + 4:.1f}'>{escape(name)}</text>")
    return "".join(out)
