"""The timeline widgets' kernel side: payloads, selection, static fallback, magics, asset locator.

The browser side (drawing, zoom, hover, escaping on the page) is tests/browser/test_timeline_widget.py.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtError, NbtUsageError
from nbtoolkit.core.magic_display import widgets_enabled
from nbtoolkit.memory.schema import CATEGORIES
from nbtoolkit.memory.timeline_widget import MemoryTimelineWidget
from nbtoolkit.timeline.assets import widget_asset, widget_dirs
from nbtoolkit.trace.timeline_widget import TraceReportWithWidget, TraceTimelineWidget
from nbtoolkit.trace.views import TraceReport
from tests._python import run_python

from .timeline_data import synthetic_memory_events, synthetic_trace

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "<script>window.__pwned = 1</script>"
BOLD = "<b>bold</b>"
DTYPES = {
    "e_lane": np.uint16, "e_start": np.float64, "e_dur": np.float64, "e_row": np.int32, "e_kind": np.uint8,
    "e_name": np.uint32, "a_lane": np.uint16, "a_px": np.uint16, "a_count": np.uint32, "a_busy": np.float32,
    "a_row": np.int32, "a_kind": np.uint8, "a_name": np.uint32,
}  # fmt: skip


def _decode(header: dict[str, Any], buffers: list[bytes]) -> dict[str, np.ndarray]:
    return {name: np.frombuffer(b, DTYPES[name]) for name, b in zip(header["columns"], buffers, strict=True)}


@pytest.fixture(scope="module")
def trace() -> Any:
    return synthetic_trace(60_000, ranks=2, streams=2, special=(SCRIPT, BOLD))


def test_trace_widget_sends_one_screen_with_names_once(trace: Any) -> None:
    w = nbt.timeline_widget(trace)
    assert w.lanes[:3] == ["rank 0 · stream 7", "rank 0 · stream 8", "rank 0 · thread 1"]
    assert len(w.lanes) == 6
    header, buffers = w.view_payload(w.span[0], w.span[1], 800, client="a")
    cols = _decode(header, buffers)
    assert len(cols["e_lane"]) == header["exact"] and len(cols["a_lane"]) == header["bins"]
    assert header["bins"] <= 6 * 800  # at most one bin per pixel and lane
    assert sum(len(b) for b in buffers) < 200_000
    names = header["names"]
    assert SCRIPT in names.values() and BOLD in names.values()  # raw: the page escapes (textContent)
    shown = {names[str(i)] for i in np.r_[cols["e_name"], cols["a_name"]]}
    assert shown <= set(names.values())
    # a second view for the same client sends no name again; another client gets them all
    again, _ = w.view_payload(w.span[0], w.span[1], 800, client="a")
    assert again["names"] == {}
    assert w.view_payload(w.span[0], w.span[1], 800, client="b")[0]["names"] == names
    # every bin's count adds up to the lane's events at full zoom-out
    total = sum(len(f) for f in trace.events.values())
    assert int(cols["a_count"].sum()) == total


def test_zooming_in_gives_exact_events_of_the_window(trace: Any) -> None:
    w = nbt.timeline_widget(trace)
    frame = trace.events[0]
    special = int(np.flatnonzero(frame["name"].astype(str).to_numpy() == SCRIPT)[0])
    ts = float(frame["ts"].iloc[special]) - w.index.origin
    header, buffers = w.view_payload(ts, ts + 50.0, 500, client="z")
    cols = _decode(header, buffers)
    assert special in cols["e_row"][cols["e_lane"] == 0].tolist()  # the long event, reaching in from before
    starts = cols["e_start"]
    ends = starts + cols["e_dur"]
    assert ((ends > ts) & (starts < ts + 50.0)).all()


def test_click_selects_the_event_with_its_correlated_launch(trace: Any) -> None:
    w = nbt.timeline_widget(trace)
    sent: list[Any] = []
    w.send = lambda content, buffers=None: sent.append((content, buffers))  # type: ignore[method-assign]
    frame = trace.events[0]
    row = int(np.flatnonzero(frame["name"].astype(str).to_numpy() == BOLD)[0])
    w._on_message(w, {"type": "select", "lane": 0, "row": row}, [])
    assert w.selected["name"] == BOLD and w.selected["rank"] == 0 and w.selected["stream"] == 7
    assert w.selected["dur_us"] == pytest.approx(float(frame["dur"].iloc[row]))
    w._on_message(w, {"type": "view", "t0": 5, "t1": 1, "width": 100, "id": 3}, [])
    assert sent[-1][0]["type"] == "error" and "t0 < t1" in sent[-1][0]["message"]
    w._on_message(w, {"type": "select", "lane": 99, "row": 0}, [])
    assert "no lane 99" in sent[-1][0]["message"]


def test_widget_state_stays_small_for_a_million_events() -> None:
    big = synthetic_trace(1_000_000, ranks=1, streams=3)
    w = nbt.timeline_widget(big)
    state = json.dumps(w.get_state(), default=str)
    esm = len(w._esm) + len(w._css)  # the front end's source is part of the saved state
    assert len(state) - esm < 20_000
    header, buffers = w.view_payload(w.span[0], w.span[1], 1500, client="x")
    assert len(json.dumps(header)) + sum(len(b) for b in buffers) < 1_000_000


def test_mime_bundle_has_text_and_an_escaped_static_overview(trace: Any) -> None:
    trace.info[0].thread_names["100:1"] = SCRIPT
    try:
        w = nbt.timeline_widget(trace)
        data, _ = w._repr_mimebundle_()
    finally:
        del trace.info[0].thread_names["100:1"]
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/plain"].startswith("Timeline widget: 6 lanes")
    html = data["text/html"]
    assert "<svg" in html and "&lt;script&gt;" in html and "<script" not in html
    assert len(html) < 300_000


def test_exported_html_shows_the_static_overview(trace: Any) -> None:
    """nbconvert's HTML (no widget state) renders the bundle's text/html: the SVG overview."""
    import nbformat
    from nbconvert import HTMLExporter

    data, metadata = nbt.timeline_widget(trace)._repr_mimebundle_()
    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("w")
    cell.outputs = [nbformat.v4.new_output("display_data", data=data, metadata=metadata)]
    notebook.cells = [cell]
    body, _ = HTMLExporter().from_notebook_node(notebook)
    shown = body[body.index("nbt-timeline-static") :]
    assert shown.index("<svg") < shown.index("</svg>")
    assert "Timeline widget: 6 lanes" in shown


def test_memory_widget_views_and_selection() -> None:
    timeline = nbt.MemoryTimeline(events=synthetic_memory_events(200_000))
    w = nbt.memory_widget(timeline)
    assert isinstance(w, MemoryTimelineWidget)
    used = {"parameter", "activation", "gradient", "temporary"}
    assert w.categories == [c for c in CATEGORIES if c in used]  # torch's order: a stable stack
    _header, buffers = w.view_payload(w.span[0], w.span[1], 1000)
    max_total = np.frombuffer(buffers[0], np.float64)
    assert max_total.max() == timeline.peak_bytes
    assert sum(len(b) for b in buffers) == 1000 * (3 * 8 + 4 * len(w.categories))
    w._on_message(w, {"type": "select", "time": w.peak[0]}, [])
    assert w.selected["total_bytes"] == timeline.peak_bytes
    assert sum(w.selected["by_category"].values()) == timeline.peak_bytes
    assert w.selected["alive"] and w.selected["alive"][0]["bytes"] >= w.selected["alive"][-1]["bytes"]
    assert "Memory timeline widget" in w._repr_mimebundle_()[0]["text/plain"]
    with pytest.raises(NbtUsageError, match="MemoryTimeline"):
        nbt.memory_widget("not a timeline")


def test_memory_widget_on_a_real_cuda_snapshot(real_data: Any) -> None:
    snapshot = nbt.load_memory_snapshot(real_data("memory/kk_memory_files_memory_ctx128_fullstep.pickle"))
    w = nbt.memory_widget(snapshot)
    timeline = snapshot.timeline()
    assert w.index.timeline.device == timeline.device
    _header, buffers = w.view_payload(w.span[0], w.span[1], 600)
    assert np.frombuffer(buffers[0], np.float64).max() == timeline.peak_bytes


def test_trace_widget_on_the_mtia_trace(real_data: Any) -> None:
    trace = nbt.load_trace(real_data("traces/hta_mtia_single_rank"))
    w = nbt.timeline_widget(trace)
    n_events = sum(len(f) for f in trace.events.values())
    header, buffers = w.view_payload(w.span[0], w.span[1], 1500, client="m")
    assert sum(len(b) for b in buffers) + len(json.dumps(header)) < 1_000_000
    steps_excluded = w.index.events
    assert 0 < steps_excluded <= n_events
    assert int(_decode(header, buffers)["a_count"].sum()) == steps_excluded


def test_widgets_enabled_rule() -> None:
    class Kernel:
        kernel = object()

    assert widgets_enabled({"NBT_WIDGETS": "1"}, shell=None) is True
    assert widgets_enabled({"NBT_WIDGETS": "off"}, shell=Kernel()) is False
    assert widgets_enabled({}, shell=Kernel()) is False  # a kernel nbval/nbconvert started
    assert widgets_enabled({"JPY_SESSION_NAME": "/a.ipynb"}, shell=Kernel()) is True  # JupyterLab
    assert widgets_enabled({"JPY_SESSION_NAME": "/a.ipynb"}, shell=object()) is False  # terminal IPython
    with pytest.raises(NbtUsageError, match="NBT_WIDGETS"):
        widgets_enabled({"NBT_WIDGETS": "maybe"}, shell=None)


def test_trace_magic_static_widget_and_default(shell: InteractiveShell, trace: Any) -> None:
    shell.user_ns["tr"] = trace
    default = shell.run_line_magic("nbt", "trace tr")
    assert type(default) is TraceReport  # a plain shell has no widget front end
    assert type(shell.run_line_magic("nbt", "trace tr --static")) is TraceReport
    live = shell.run_line_magic("nbt", "trace tr --widget --name live")
    assert isinstance(live, TraceReportWithWidget) and isinstance(live.widget, TraceTimelineWidget)
    assert shell.user_ns["live"] is live
    assert live._repr_mimebundle_() == default._repr_mimebundle_()  # same tables
    with pytest.raises(NbtUsageError, match="exclude"):
        shell.run_line_magic("nbt", "trace tr --widget --static")


def test_snapshot_magic_with_widget_keeps_it_beside_the_result(shell: InteractiveShell) -> None:
    from tests.magics.test_magic_api_memory import SNAPSHOT

    shell.user_ns["raw"] = SNAPSHOT
    result = shell.run_line_magic("nbt", "snapshot raw --widget --name snap")
    assert isinstance(result, nbt.MemorySnapshot)
    assert isinstance(shell.user_ns["snap_widget"], MemoryTimelineWidget)
    shell.user_ns.pop("snap_widget")
    shell.run_line_magic("nbt", "snapshot raw --name snap")
    assert "snap_widget" not in shell.user_ns  # static: no widget made


def test_memory_magic_with_widget_returns_the_timeline_and_keeps_the_widget(shell: InteractiveShell) -> None:
    shell.run_cell("import torch").raise_error()
    cell = "w1 = torch.ones(256, 256)\nw2 = torch.ones(512, 256)\ndel w1\n"
    result = shell.run_cell_magic("nbt", "memory --widget --name mem", cell)
    assert isinstance(result, nbt.MemoryTimeline) and shell.user_ns["mem"] is result
    widget = shell.user_ns["mem_widget"]
    assert isinstance(widget, MemoryTimelineWidget)
    assert widget.peak[1] == result.peak_bytes > 0


def test_assets_found_in_the_checkout_and_in_a_package(tmp_path: Path) -> None:
    assert widget_asset("timeline.js") == ROOT / "widgets" / "timeline.js"
    package = tmp_path / "site" / "nbtoolkit"
    (package / "_widgets").mkdir(parents=True)
    (package / "_widgets" / "timeline.js").write_text("export default {}")
    assert widget_asset("timeline.js", package_dir=package) == package / "_widgets" / "timeline.js"
    assert widget_dirs(package)[0] == package / "_widgets"
    with pytest.raises(NbtError, match="reinstall"):
        widget_asset("nope.js", package_dir=package)


@pytest.mark.slow
def test_the_wheel_ships_the_widget_sources(tmp_path: Path) -> None:
    """pip builds the wheel from this checkout (hatchling, from the package index, in an isolated
    build environment); the sources are at nbtoolkit/_widgets, and the locator finds them there."""
    run_python("-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT))
    wheel = next(tmp_path.glob("nbtoolkit-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert {"nbtoolkit/_widgets/timeline.js", "nbtoolkit/_widgets/timeline.css"} <= names
        archive.extractall(tmp_path / "site")
    found = widget_asset("timeline.js", package_dir=tmp_path / "site" / "nbtoolkit")
    assert found == tmp_path / "site" / "nbtoolkit" / "_widgets" / "timeline.js"
    assert found.read_text() == (ROOT / "widgets" / "timeline.js").read_text()


# ------------------------------------------------------------------ issue 32: epoch µs, folding, counts
def _epoch_trace(tmp_path: Path, **kwargs: Any) -> Any:
    from .timeline_data import write_epoch_traces

    write_epoch_traces(tmp_path / "epoch", **kwargs)
    return nbt.load_trace(tmp_path / "epoch")


def _deep_zoom_answers(trace: Any) -> None:
    """A 1 ns window at an event's start, sent as the page sends it: a view of that event, no error."""
    w = nbt.timeline_widget(trace)
    assert w.index.origin > 1e15  # epoch µs: a float64 there resolves only 0.25 µs
    sent: list[Any] = []
    w.send = lambda content, buffers=None: sent.append((content, buffers))  # type: ignore[method-assign]
    rank = w.index.ranks[-1]
    lane_no = w.index.lanes_of(rank)[0]
    lane = w.index.lanes[lane_no].index
    i = len(lane) // 2 + int(np.argmax(lane.durs[len(lane) // 2 :] >= 1.0))
    at = float(lane.starts[i]) + 2e-4  # inside an event at least 1 µs long, off the µs grid
    # the old arithmetic: the window's ends, added back to the epoch, fell on the same double
    assert at + w.index.origin == at + 1e-3 + w.index.origin
    for t0, t1 in [(at, at + 1e-3), (at, at), (at, at + 4e-4)]:
        w._on_message(w, {"type": "view", "t0": t0, "t1": t1, "width": 1200, "rows": [lane_no], "id": 1}, [])
        header, buffers = sent[-1]
        assert header["type"] == "view", header
        assert header["t1"] - header["t0"] == pytest.approx(1e-3, rel=1e-6)  # 1 ns, widened if narrower
        cols = _decode(header, buffers)
        starts, ends = cols["e_start"], cols["e_start"] + cols["e_dur"]
        assert len(starts) >= 1 and ((starts <= header["t1"]) & (ends >= header["t0"])).all()
        assert set(cols["e_lane"].tolist()) == {lane_no}
    w._on_message(w, {"type": "view", "t0": at, "t1": at - 1.0, "width": 100, "id": 2}, [])
    assert sent[-1][0]["type"] == "error" and "t0 < t1" in sent[-1][0]["message"]  # reversed: still an error


def test_deep_zoom_kernel_side_on_an_epoch_trace_written_here(tmp_path: Path) -> None:
    _deep_zoom_answers(_epoch_trace(tmp_path, ranks=2, streams=2))


def test_deep_zoom_kernel_side_on_the_8_rank_dlrm_set(real_data: Any) -> None:
    _deep_zoom_answers(nbt.load_trace(real_data("traces/param_dlrm_8rank")))


def test_one_event_count_in_title_summary_and_the_trace(tmp_path: Path) -> None:
    trace = _epoch_trace(tmp_path, ranks=3, streams=2, per_lane=50)
    w = nbt.timeline_widget(trace)
    total = sum(len(f) for f in trace.events.values())
    assert f"{total:,} events" in repr(trace)
    assert f"{total:,} events (3 ProfilerStep annotations drawn as step bands)" in w.title
    assert f"{total:,} events (3 ProfilerStep annotations" in w.summary()
    assert w.index.events == total - 3 and w.index.trace_events == total
    # step bands for every rank shown, not only the first
    assert sorted({int(s[0]) for s in w.steps}) == [0, 1, 2]
    # an untimed event (a damaged saved result) is counted and said, not drawn
    frame = trace.events[1].copy()
    frame.loc[5, "ts"] = np.nan
    trace.events[1] = frame
    w = nbt.timeline_widget(trace)
    note = "3 ProfilerStep annotations drawn as step bands; 1 without a finite time, not drawn"
    assert f"{total:,} events ({note})" in w.title
    assert w.index.events == total - 4


def test_ranks_fold_into_one_summary_lane(tmp_path: Path) -> None:
    trace = _epoch_trace(tmp_path, ranks=4, streams=4, per_lane=300)
    w = nbt.timeline_widget(trace)
    index = w.index
    assert len(w.lanes) == 4 * 5 > 16 and w.folded == [1, 2, 3]  # past 16 lanes: all but the first fold
    assert w.ranks == [0, 1, 2, 3] and w.rank_lanes[1] == index.lanes_of(1)
    n = len(w.lanes)
    header, buffers = w.view_payload(0.0, w.span[1], 900, rows=[*range(5), n + 1])
    cols = _decode(header, buffers)
    assert set(cols["a_lane"].tolist()) == {0, 1, 2, 3, 4, n + 1}  # only the rows asked for
    # the summary lane of rank 1 counts every event of its lanes, once
    summary = cols["a_count"][cols["a_lane"] == n + 1].sum()
    assert summary == sum(len(index.lanes[i].index) for i in index.lanes_of(1))
    # zoomed in, its exact events are those of its lanes in the window
    t0, t1 = 0.45 * w.span[1], 0.46 * w.span[1]
    merged = index.rank_view(1, t0, t1, 500)
    separate = np.concatenate([index.lanes[i].index.view(t0, t1, 500).exact_row for i in index.lanes_of(1)])
    assert sorted(merged.exact_row.tolist()) == sorted(separate.tolist())
    # a click on the summary lane selects the event in its own lane
    row = int(merged.exact_row[-1])
    w._on_message(w, {"type": "select", "lane": n + 1, "row": row}, [])
    assert w.selected["rank"] == 1 and w.selected["row"] == row
    assert w.selected["lane"] == index.lanes[index.lane_of_row(1, row)].label
    with pytest.raises(NbtUsageError, match="no timeline row"):
        w.view_payload(0.0, 1.0, 100, rows=[n + 4])
    # one rank: nothing to fold, no headers
    single = nbt.timeline_widget(trace, ranks=[2])
    assert single.ranks == [] and single.folded == []
    with pytest.raises(NbtUsageError, match="selects no rank"):
        nbt.timeline_widget(trace, ranks=[])


def test_nan_and_inf_durations_draw_as_instants(tmp_path: Path) -> None:
    trace = _epoch_trace(tmp_path, ranks=1, streams=1, per_lane=100)
    frame = trace.events[0].copy()
    frame.loc[3, "dur"], frame.loc[4, "dur"], frame.loc[5, "dur"] = np.inf, np.nan, -np.inf
    trace.events[0] = frame
    w = nbt.timeline_widget(trace)
    assert w.span[1] < 25_000  # not stretched to 1e308 µs
    header, buffers = w.view_payload(0.0, w.span[1], 600)
    assert np.isfinite(_decode(header, buffers)["e_dur"]).all()


def test_memory_widget_on_epoch_times_zooms_to_a_nanosecond() -> None:
    events = synthetic_memory_events(20_000)
    events["time_us"] = events["time_us"] + 1.694128201421221e15
    w = nbt.memory_widget(nbt.MemoryTimeline(events=events))
    assert w.span[0] == 0.0 and w.span[1] < 6e6 and w.index.origin > 1e15
    at = float(w.index.times[len(w.index.times) // 2])
    sent: list[Any] = []
    w.send = lambda content, buffers=None: sent.append((content, buffers))  # type: ignore[method-assign]
    w._on_message(w, {"type": "view", "t0": at, "t1": at, "width": 300, "id": 1}, [])
    header, buffers = sent[-1]
    assert header["type"] == "view" and header["t1"] - header["t0"] == pytest.approx(1e-3)
    state = int(w.index.total[w.index.state_at(at)])
    assert np.frombuffer(buffers[0], np.float64).max() >= state
    w._on_message(w, {"type": "select", "time": at}, [])
    assert w.selected["total_bytes"] == state
    w._on_message(w, {"type": "select", "time": float("nan")}, [])
    assert sent[-1][0]["type"] == "error"
    # events without a finite time (a damaged saved timeline) are counted and said, not drawn
    events.loc[5, "time_us"], events.loc[6, "time_us"] = np.nan, np.inf
    w = nbt.memory_widget(nbt.MemoryTimeline(events=events))
    assert w.title.endswith("20,000 events (2 without a finite time, not drawn)")
    assert np.isfinite(w.span).all() and w.span[1] < 6e6


def test_cells_of_this_kernel_are_named_like_tracebacks() -> None:
    from ipykernel.compiler import XCachingCompiler

    from nbtoolkit.core.cell_names import name_cells

    compiler = XCachingCompiler()
    name = compiler.cache("import torch\nx = torch.ones(3)\n", 7)  # ipykernel's temp file of cell 7
    assert name.endswith(".py") and "ipykernel_" in name

    class Kernel:
        kernel = object()
        compile = compiler

    tail = "/".join(name.split("/")[-2:])
    profiler_frame = f"{name}(2): <module>"
    snapshot_frame = f"{tail}:2 in <module>"
    assert name_cells(profiler_frame, Kernel()) == "Cell In[7], line 2: <module>"
    assert name_cells(snapshot_frame, Kernel()) == "Cell In[7], line 2 in <module>"
    stack = f"train.py(10): step\n{profiler_frame}"
    assert name_cells(stack, Kernel()) == "train.py(10): step\nCell In[7], line 2: <module>"
    other = "/tmp/ipykernel_1/999999.py(2): <module>"  # another kernel's cell: its number means nothing here
    assert name_cells(other, Kernel()) == other

    class Terminal:  # terminal IPython or plain Python: paths stay
        compile = compiler

    assert name_cells(profiler_frame, Terminal()) == profiler_frame
    assert name_cells(profiler_frame, None) == profiler_frame  # no IPython running in pytest


def test_memory_selection_names_the_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    from ipykernel.compiler import XCachingCompiler

    compiler = XCachingCompiler()
    name = compiler.cache("a = torch.ones(1 << 20)\n", 3)
    events = synthetic_memory_events(2_000)
    events["source"] = f"{name}(1): <module>"

    class Kernel:
        kernel = object()
        compile = compiler

    import IPython

    monkeypatch.setattr(IPython, "get_ipython", Kernel)
    w = nbt.memory_widget(nbt.MemoryTimeline(events=events))
    w._on_message(w, {"type": "select", "time": w.peak[0]}, [])
    sources = {a["source"] for a in w.selected["alive"]}
    assert w.selected["alive"] and sources == {"Cell In[3], line 1: <module>"}
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    w._on_message(w, {"type": "select", "time": w.peak[0]}, [])
    assert {a["source"] for a in w.selected["alive"]} == {f"{name}(1): <module>"}


def test_memory_capture_in_a_kernel_names_the_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function defined in cell 5 allocates: the recorded source reads as a traceback names the cell."""
    import IPython
    import torch
    from ipykernel.compiler import XCachingCompiler

    compiler = XCachingCompiler()
    code = "def make():\n    return torch.ones(256, 256)\n"
    name = compiler.cache(code, 5)  # what ipykernel does with cell 5 before running it
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(code, name, "exec"), namespace)  # the cell, run as the kernel runs it

    class Kernel:
        kernel = object()
        compile = compiler

    monkeypatch.setattr(IPython, "get_ipython", Kernel)
    timeline = nbt.memory_timeline(namespace["make"])
    sources = set(timeline.events["source"]) - {""}
    assert sources == {"Cell In[5], line 1: make"}, sources
    assert not any(name in stack for stack in timeline.stacks)
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # outside a kernel: the path stays
    assert set(nbt.memory_timeline(namespace["make"]).events["source"]) - {""} == {f"{name}(1): make"}


def test_window_and_folded_set_from_the_notebook_are_checked(tmp_path: Path) -> None:
    w = nbt.timeline_widget(_epoch_trace(tmp_path, ranks=2, streams=1, per_lane=20))
    w.window = [3.0, 3.0]  # zero width: the 1 ns the page would clamp to
    assert w.window[1] - w.window[0] == pytest.approx(1e-3) and sum(w.window) / 2 == pytest.approx(3.0)
    for bad in ([float("nan"), 1.0], [5.0, 1.0], [1.0]):
        with pytest.raises(NbtUsageError):
            w.window = bad
    w.folded = [1, 0, 1]
    assert w.folded == [0, 1]
    with pytest.raises(NbtUsageError, match=r"cannot fold rank\(s\) \[99\]: ranks shown: \[0, 1\]"):
        w.folded = [99]
