"""The static SVG every nbtoolkit figure carries (issue 39): drawn to scale, escaped, small, exported.

The SVG is drawn from the figure's own data (nbtoolkit.core.figure_svg), so these tests read the
geometry back from it: bar heights in proportion to their values, stacks on top of each other,
heatmap cells in the axis order, the peak of a long line kept. nbconvert's real HTML exporter
shows it, and no figure module builds a plain plotly figure that would lack it.
"""

from __future__ import annotations

import ast
import base64
import re
import struct
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

import nbtoolkit as nbt
from nbtoolkit.core.figure_svg import figure_svg
from nbtoolkit.core.static_figure import StaticFigure, static_figure, static_html

PACKAGE = Path(nbt.__file__).resolve().parent
BAR = re.compile(r"M([\d.]+) ([\d.]+)h([-\d.]+)v([-\d.]+)h[-\d.]+z")


def _bars(svg: str, colour: str) -> list[tuple[float, float, float, float]]:
    """(x, y, width, height) of the bars painted in ``colour``."""
    path = re.search(rf"<path fill='{re.escape(colour)}'[^>]* d='([^']*)'", svg)
    assert path, f"no bars in {colour}"
    return [tuple(float(v) for v in m) for m in BAR.findall(path.group(1))]  # type: ignore[misc]


def _png(svg: str, index: int = 0) -> np.ndarray:
    """The ``index``-th embedded PNG of the SVG as an RGBA array (our encoder: filter 0, RGBA)."""
    uri = re.findall(r"href='data:image/png;base64,([^']+)'", svg)[index]
    data = base64.b64decode(uri)
    width, height = struct.unpack(">II", data[16:24])
    idat = b"".join(
        data[i + 8 : i + 8 + struct.unpack(">I", data[i : i + 4])[0]]
        for i in [m.start() - 4 for m in re.finditer(b"IDAT", data)]
    )
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + 4 * width)
    return raw[:, 1:].reshape(height, width, 4)


def test_bars_are_drawn_to_scale_and_stack() -> None:
    fig = StaticFigure()
    fig.add_bar(x=["a", "b"], y=[1.0, 2.0], name="low", marker_color="#111111")
    fig.add_bar(x=["a", "b"], y=[3.0, 3.0], name="high", marker_color="#222222")
    fig.update_layout(barmode="stack")
    svg = figure_svg(fig)
    low, high = _bars(svg, "#111111"), _bars(svg, "#222222")
    assert low[1][3] == pytest.approx(2 * low[0][3], rel=0.02)  # b is twice a
    for below, above in zip(low, high, strict=True):
        assert above[1] + above[3] == pytest.approx(below[1], abs=0.15)  # sits on the lower bar
        assert above[3] == pytest.approx(3 * low[0][3], rel=0.02)
    assert "<text" in svg and ">a</text>" in svg and ">low</text>" in svg  # categories, legend


def test_grouped_bars_stand_side_by_side() -> None:
    fig = StaticFigure()
    fig.add_bar(x=["a"], y=[1.0], marker_color="#111111")
    fig.add_bar(x=["a"], y=[1.0], marker_color="#222222")
    svg = figure_svg(fig)  # plotly's default barmode: group
    (left,), (right,) = _bars(svg, "#111111"), _bars(svg, "#222222")
    assert left[0] + left[2] == pytest.approx(right[0], abs=0.15)


@pytest.mark.parametrize("reversed_rows", [False, True])
def test_heatmap_cells_follow_the_axes(reversed_rows: bool) -> None:
    fig = StaticFigure(go.Heatmap(z=[[0, 1], [2, 3]], x=["s0", "s1"], y=["r0", "r1"], colorscale="Greys"))
    if reversed_rows:
        fig.update_yaxes(autorange="reversed")
    svg = figure_svg(fig)
    image = _png(svg)
    assert image.shape == (2, 2, 4)  # a pixel per cell
    assert _png(svg, 1).shape == (64, 1, 4) and "</g><image" in svg  # the colour bar, outside the clip
    brightness = image[..., 0].astype(int)
    top_row = 0 if reversed_rows else 1  # the image's top row is the data's last row unless reversed
    assert (brightness[0, 0] > brightness[0, 1]) and (brightness[1, 0] > brightness[1, 1])  # x: 0 then 1
    darker_on_top = brightness[0, 0] < brightness[1, 0]  # Greys: higher z is darker
    assert darker_on_top == (top_row == 1)


def test_a_long_line_stays_small_and_keeps_its_peak() -> None:
    n = 200_000
    x = np.arange(n, dtype=float)
    y = np.sin(x / 5000.0)
    y[123_457] = 5.0  # one spike, a single point
    fig = StaticFigure(go.Scatter(x=x, y=y, mode="lines"))
    started = time.perf_counter()
    svg = figure_svg(fig)
    elapsed = time.perf_counter() - started
    assert len(svg) < 40_000, len(svg)
    path = re.search(r"stroke-linejoin='round' d='M([^']*)'", svg)
    assert path
    ys = [float(v) for v in re.findall(r"[\d.]+ ([\d.]+)", path.group(1))]
    top_tick = re.findall(r"<text x='[\d.]+' y='([\d.]+)' text-anchor='end'>5</text>", svg)
    assert top_tick and min(ys) == pytest.approx(float(top_tick[0]) - 4, abs=1.0)  # the spike reaches 5
    assert elapsed < 5.0  # well under a second in practice: per-pixel thinning in numpy


def test_a_memory_timeline_of_many_events_stays_small() -> None:
    from tests.trace.timeline_data import synthetic_memory_events

    timeline = nbt.MemoryTimeline(events=synthetic_memory_events(200_000))
    html = static_html(timeline.figure())
    assert len(html) < 120_000, len(html)
    assert html.count("<polygon") == 4  # one stacked area per category


def test_foreign_text_is_escaped() -> None:
    fig = StaticFigure()
    fig.add_bar(x=["<script>alert(1)</script>", "a&b"], y=[1, 2], name="bars <img src=x onerror=alert(2)>")
    fig.add_scatter(x=[0], y=[1], name="&lt;lambda&gt;", text=["<b>bold</b>"], mode="markers+text")
    fig.update_layout(title="<script>alert(3)</script>&lt;module&gt;")
    svg = figure_svg(fig)
    assert "<script" not in svg and "<img" not in svg and "<b>" not in svg
    assert "&lt;lambda&gt;" in svg and "&lt;module&gt;" in svg and "a&amp;b" in svg
    assert ">bold</text>" in svg  # plotly's markup becomes plain text


def test_the_same_figure_gives_the_same_svg_and_ids_differ_between_figures() -> None:
    def make(value: float) -> StaticFigure:
        return StaticFigure(go.Scatter(x=[0, 1], y=[0, value]))

    assert figure_svg(make(1.0)) == figure_svg(make(1.0))
    clip = re.compile(r"clipPath id='([^']+)'")
    assert clip.findall(figure_svg(make(1.0))) != clip.findall(figure_svg(make(2.0)))


def test_log_axes_subplots_shapes_and_annotations() -> None:
    fig = make_subplots(rows=1, cols=2, subplot_titles=("left title", "right title"), figure=StaticFigure())
    fig.add_scatter(x=[1, 10, 1000], y=[1, 2, 3], row=1, col=1)
    fig.add_bar(x=["p", "q"], y=[1, 2], row=1, col=2)
    fig.update_xaxes(type="log", row=1, col=1)
    fig.add_hline(y=1.5, line_dash="dash", annotation_text="budget", row=1, col=2)
    fig.add_vrect(x0=0.5, x1=1.5, fillcolor="#abcdef", annotation_text="step 1", row=1, col=1)
    svg = figure_svg(fig)
    for label in (">1</text>", ">10</text>", ">100</text>", ">1000</text>", "left title", "right title"):
        assert label in svg
    assert "stroke-dasharray" in svg and "fill='#abcdef'" in svg and ">budget<" in svg and ">step 1<" in svg


def test_icicle_and_histogram_are_drawn_and_other_types_say_they_are_not() -> None:
    icicle = StaticFigure(
        go.Icicle(ids=["r", "a", "b"], labels=["root", "alpha", "beta"], parents=["", "r", "r"],
                  values=[3, 2, 1], branchvalues="total", tiling={"orientation": "v"})
    )  # fmt: skip
    svg = figure_svg(icicle)
    widths = {m[1]: float(m[0]) for m in re.findall(r"width='([\d.]+)'[^>]*/><text[^>]*>(\w+)</text>", svg)}
    assert widths["alpha"] == pytest.approx(2 * widths["beta"], rel=0.03)
    histogram = figure_svg(StaticFigure(go.Histogram(x=[1, 1, 1, 2, 3], nbinsx=3)))
    assert len(BAR.findall(histogram)) == 3
    pie = figure_svg(StaticFigure(go.Pie(values=[1, 2])))
    assert "pie trace: not drawn in the static copy" in pie


def test_display_bundle_keeps_plotly_and_adds_the_static_form(monkeypatch: pytest.MonkeyPatch) -> None:
    import plotly.io as pio

    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")  # a Jupyter kernel's renderer
    bundle = StaticFigure(go.Bar(x=["a"], y=[1]))._repr_mimebundle_()
    assert set(bundle) == {"application/vnd.plotly.v1+json", "text/html"}
    assert bundle["text/html"].startswith("<div class='nbt-figure-static'><svg")
    # A renderer the user chose that gives its own HTML is left alone (here plotly's CDN one).
    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype+notebook_connected")
    theirs = static_figure(go.Figure(go.Bar(x=["a"], y=[1])))._repr_mimebundle_()
    assert "nbt-figure-static" not in theirs["text/html"]


def test_nbconvert_html_shows_the_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    import plotly.io as pio
    from nbconvert import HTMLExporter

    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")
    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    data = StaticFigure(go.Scatter(x=[0, 1, 2], y=[1, 3, 2], name="only"))._repr_mimebundle_()
    cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
    notebook.cells = [cell]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        body, _ = HTMLExporter().from_notebook_node(notebook)
    assert not [w for w in caught if "not able to be represented" in str(w.message)]
    shown = body[body.index("nbt-figure-static") :]
    # nbconvert re-serialises the HTML (attribute quotes and case change; a browser's HTML parser
    # restores viewBox and clipPath inside <svg>): look for the drawing, not for our exact bytes.
    line = re.search(r"stroke-linejoin=.round.", shown)
    assert line and shown.index("<svg") < line.start() < shown.index("</svg>")


# Figure modules build StaticFigure (directly, or make_subplots(figure=StaticFigure())), so that
# every figure the package returns carries its static form. Exceptions name their reason.
PLAIN_FIGURES_ALLOWED = {
    "core/static_figure.py": "defines StaticFigure",
    "recompute/panel.py": "the optimize panel's module (another owner); its sharded_recompute_figure is "
    "shown through static_figure() by the ZeRO and FSDP2 recompute results (integrations/*/recompute.py)",
}


def test_no_figure_module_builds_a_plain_plotly_figure() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in PLAIN_FIGURES_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name in ("go.Figure", "plotly.graph_objects.Figure", "Figure"):
                offenders.append(f"{relative}:{node.lineno} {name}(...)")
            if name.endswith("make_subplots") and not any(k.arg == "figure" for k in node.keywords):
                offenders.append(f"{relative}:{node.lineno} make_subplots without figure=StaticFigure()")
    assert offenders == []
