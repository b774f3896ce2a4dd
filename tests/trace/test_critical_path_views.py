"""The critical path over the timeline lanes, the roofline chart, the opportunity table, exports."""

from __future__ import annotations

import numpy as np
import pytest

import nbtoolkit as nbt
from nbtoolkit.trace.critical_path_figure import lane_origin


def _lane_segments(fig, lane: int) -> list[tuple[float, float]]:
    """(start, end) ms of the timeline's own segments on one lane (not the path's traces)."""
    out = []
    for trace in fig.data:
        if trace.name in ("critical path", "path order"):
            continue
        xs, ys = list(trace.x), list(trace.y)
        out += [(xs[i], xs[i + 1]) for i in range(0, len(xs) - 1, 3) if ys[i] == lane]
    return out


def test_path_is_drawn_on_the_lanes_it_ran_on(real_data):
    trace = nbt.load_trace(real_data("traces/hta_critical_path_alexnet"))
    window = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
    path = nbt.critical_path(trace, annotation=window, instance=1)
    fig = path.figure(trace)
    band = next(t for t in fig.data if t.name == "critical path")
    xs, ys = list(band.x), list(band.y)
    seg = path.segments
    assert len(xs) == 3 * len(seg)
    origin = lane_origin(trace, path.rank)
    np.testing.assert_allclose(xs[0::3], (seg["start_us"] - origin) / 1e3)
    labels = list(fig.layout.yaxis.ticktext)
    # every kernel on the path sits on its stream's lane, over a segment the timeline drew there
    kernels = seg[seg["kind"] == "kernel"]
    assert len(kernels)
    for i in kernels.index[:10]:
        lane = ys[3 * i]
        assert labels[lane] == f"rank 0 · stream {seg['stream'].iat[i]}"
        a, b = xs[3 * i], xs[3 * i + 1]
        assert any(s <= a + 1e-6 and b <= e + 1e-6 for s, e in _lane_segments(fig, lane))
    assert fig.layout.xaxis.range[1] - fig.layout.xaxis.range[0] == pytest.approx(path.span_us / 1e3)
    assert "Critical path of rank 0" in fig.layout.title.text


def test_cpu_path_figure_and_exports(cpu_trace_file, tmp_path):
    trace = nbt.load_trace(cpu_trace_file)
    path = nbt.critical_path(trace)
    fig = path.figure(trace)
    band = next(t for t in fig.data if t.name == "critical path")
    assert {y for y in band.y if y is not None} <= set(range(len(fig.layout.yaxis.ticktext)))
    frames = path.frames()
    assert set(frames) == {"segments", "opportunities", "by_kind"}
    frames["segments"].to_csv(tmp_path / "segments.csv", index=False)
    assert (tmp_path / "segments.csv").read_text().startswith("kind,name,start_us,dur_us")
    html = path._repr_html_()
    assert "What, shortened, would shorten the step" in html
    top = path.opportunities.iloc[0]
    assert f"{top['share_pct']:.1f} %" in top["advice"]


def test_roofline_chart_has_roofs_and_points(real_data):
    roof = nbt.roofline(nbt.load_trace(real_data("traces/tracelens_h100_bert")))
    fig = roof.figure()
    roofs = [t for t in fig.data if t.name.startswith("roof ")]
    points = next(t for t in fig.data if t.name == "op classes")
    assert roofs and fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    bf16 = next(t for t in roofs if "bf16" in t.name)
    assert max(bf16.y) == pytest.approx(989.5)  # H100 SXM dense bf16 peak
    shown = roof.by_class[(roof.by_class["flops"] > 0) & (roof.by_class["bytes"] > 0)]
    np.testing.assert_allclose(points.y, shown["tflops_per_s"])
    assert set(roof.frames()) >= {"ops", "by_class", "by_module", "collectives"}


def test_errors_and_escaping(cpu_trace_file):
    trace = nbt.load_trace(cpu_trace_file)
    path = nbt.critical_path(trace)
    path.opportunities.loc[0, "advice"] = "<script>x</script>"
    assert "<script>" not in path._repr_html_()
    with pytest.raises(nbt.TraceError, match="no ProfilerStep#42"):
        nbt.roofline(trace, step=42)
