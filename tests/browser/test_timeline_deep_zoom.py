"""Deep zoom, axis ticks, tooltips and folded ranks of the trace widget in JupyterLab (issue 32).

Traces whose timestamps are epoch µs (Kineto's: 1.69e15, where a float64 resolves 0.25 µs) once
ended a deep zoom in "timeline window must satisfy t0 < t1" and a stale canvas, with seven axis
ticks reading "4.012 s". Here a person's mouse zooms with the wheel until the window stops
shrinking (1 ns), on:

- the real 8-rank DLRM set (``param_dlrm_8rank``: 48 lanes; skipped, naming it, where the
  artifact cannot be had), and
- a trace this test writes itself, Kineto JSON with epoch-µs timestamps, 8 ranks of 6 lanes
  (runs on a fresh clone without fixtures).

Each run checks: the window reached 1 ns and the kernel answered that window (no error in the
status line, no exception on the page), the axis labels are distinct (with an origin label),
the tooltip of the bottom row stays inside the widget's box, one event count in the title
(the trace's), folding and unfolding ranks by clicking their headers, a default height far
below 48 lanes × 22 px, and the kernel's ``w.window`` / ``w.folded`` afterwards. Screenshots
of the widget go to out/browser/.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import pytest

import nbtoolkit as nbt
from tests.browser.lab_harness import CHROMIUM, CHROMIUM_ARGS, jupyterlab, open_and_run_all
from tests.browser.test_walkthrough_in_jupyterlab import (  # the chromium fixture: installed or a reason
    _OFFLINE_NOISE,
    SCREENSHOTS,
    chromium,  # noqa: F401
)
from tests.conftest import locate_or_skip

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
LANE_HEIGHT = 22  # widgets/timeline.js
MIN_WINDOW_US = 1e-3


def _notebook(folder: Path, load: str) -> str:
    """A notebook that loads a trace (``load``: code setting ``tr``), shows its widget, then reports."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"import nbtoolkit as nbt\n{load}\nw = nbt.timeline_widget(tr)\nw"),
        nbformat.v4.new_code_cell(
            'print("KERNEL WINDOW", repr(w.window[1] - w.window[0]), "FOLDED", w.folded, '
            '"SELECTED", repr(w.selected.get("name")))'
        ),
    ]
    nbformat.write(nb, folder / "deep_zoom.ipynb")
    shutil.copy(HERE.parent / "trace" / "timeline_data.py", folder / "timeline_data.py")
    return "deep_zoom.ipynb"


def _stats(page: Any) -> dict[str, Any]:
    return page.evaluate(
        """() => { const r = document.querySelector('.nbt-timeline'); const s = r.__nbtStats;
                   return {views: s.views, ticks: s.ticks.slice(), base: s.axisBase, window: s.window,
                           answered: s.answered, errors: s.errors.slice(),
                           status: r.querySelector('.nbt-tl-status').textContent,
                           title: r.querySelector('.nbt-tl-title').textContent,
                           labels: [...r.querySelectorAll('.nbt-tl-label')].map(e => e.textContent),
                           height: r.getBoundingClientRect().height}; }"""
    )


def _wait_views(page: Any, more_than: int) -> None:
    page.wait_for_function(
        "(n) => { const r = document.querySelector('.nbt-timeline');"
        " return r && r.__nbtStats.views > n; }",
        arg=more_than,
        timeout=60_000,
    )


def _box(locator: Any) -> dict[str, float]:
    box = locator.bounding_box()
    assert box is not None
    return box


def _inside(inner: dict[str, float], outer: dict[str, float]) -> bool:
    return (
        inner["x"] >= outer["x"] - 0.5
        and inner["y"] >= outer["y"] - 0.5
        and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 0.5
        and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 0.5
    )


def _deep_zoom_in_lab(tmp_path: Path, load: str, trace: Any, label: str) -> dict[str, Any]:
    """Run the notebook, zoom to 1 ns over the last rank's middle, hover, fold; return what was seen."""
    from playwright.sync_api import sync_playwright

    widget = nbt.timeline_widget(trace)
    index = widget.index
    # Where the last rank has an event under the pointer: the middle of its longest lane event.
    last_rank = index.ranks[-1]
    best = (-1.0, 0.0, "")
    for lane_no in index.lanes_of(last_rank):
        lane = index.lanes[lane_no].index
        i = int(np.argmax(lane.durs))
        if lane.durs[i] > best[0]:
            name = str(trace.events[last_rank]["name"].iloc[int(lane.rows[i])])
            best = (float(lane.durs[i]), float(lane.starts[i] + lane.durs[i] / 2), name)
    _, middle, name_there = best
    fraction = middle / widget.span[1]
    folded_rows = len(index.ranks) + len(index.lanes_of(index.ranks[0]))  # default: all but the first folded
    assert widget.folded == index.ranks[1:]

    notebook = _notebook(tmp_path, load)
    console: list[str] = []
    page_errors: list[str] = []
    seen: dict[str, Any] = {"label": label, "events_in_title": f"{index.trace_events:,} events"}
    with jupyterlab(tmp_path) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1200})
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            open_and_run_all(page, server, notebook, timeout_s=300)
            _wait_views(page, 0)
            root = page.locator(".nbt-timeline").first
            root.scroll_into_view_if_needed()
            first = _stats(page)
            seen["first"] = first
            assert len(first["labels"]) == folded_rows  # rank headers and rank 0's lanes
            seen["default_height_px"] = first["height"]

            # ---- zoom with the wheel over the bottom row (the last rank, folded) until 1 ns
            canvas = root.locator("canvas.nbt-tl-canvas")
            box = _box(canvas)
            x = box["x"] + fraction * box["width"]
            y_last = box["y"] + (folded_rows - 0.5) * LANE_HEIGHT
            page.mouse.move(x, y_last)
            for _ in range(40):  # each wheel step divides the window by e: 20 ms -> 1 ns in 17
                page.mouse.wheel(0, -500)
                page.wait_for_timeout(25)
            page.wait_for_function(
                """(w) => { const s = document.querySelector('.nbt-timeline').__nbtStats;
                            return s.answered && Math.abs((s.answered[1] - s.answered[0]) - w) < 1e-9; }""",
                arg=MIN_WINDOW_US,
                timeout=60_000,
            )
            page.wait_for_timeout(300)
            deep = _stats(page)
            seen["deep"] = deep
            # Four more wheel steps: the window stays at 1 ns, still without an error.
            for _ in range(4):
                page.mouse.wheel(0, -500)
                page.wait_for_timeout(40)
            page.wait_for_timeout(400)
            clamped = _stats(page)
            seen["clamped"] = clamped

            # ---- hover the bottom row at 1 ns: a tooltip naming the event, inside the widget
            tip = root.locator(".nbt-tl-tip")
            page.mouse.move(x + 1, y_last)
            page.mouse.move(x, y_last)
            tip.wait_for(state="visible", timeout=10_000)
            seen["tooltip"] = tip.text_content()
            seen["hover"] = page.evaluate("() => document.querySelector('.nbt-timeline').__nbtStats.hover")
            seen["tooltip_box"], seen["widget_box"] = _box(tip), _box(root)
            shot = tmp_path / f"timeline_deep_zoom_{label}.png"
            root.screenshot(path=str(shot))

            # ---- fold rank 0 and unfold the last rank by clicking their headers
            before = _stats(page)["views"]
            root.locator(f".nbt-tl-rank[data-rank='{index.ranks[0]}']").click()
            _wait_views(page, before)
            seen["after_fold"] = _stats(page)
            before = seen["after_fold"]["views"]
            root.locator(f".nbt-tl-rank[data-rank='{last_rank}']").click()
            _wait_views(page, before)
            page.wait_for_timeout(300)
            seen["after_unfold"] = _stats(page)
            page.mouse.move(5, 5)
            shot_folded = tmp_path / f"timeline_folded_{label}.png"
            root.screenshot(path=str(shot_folded))

            # ---- what the kernel saw
            last = page.locator(".jp-CodeCell").last
            last.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Control+Enter")
            out = last.locator(".jp-OutputArea-output").filter(has_text="KERNEL WINDOW")
            out.wait_for(timeout=30_000)
            seen["kernel"] = out.text_content()
        finally:
            browser.close()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for path in (shot, shot_folded):
        shutil.copy(path, SCREENSHOTS / path.name)
    seen["page_errors"] = page_errors
    seen["console_errors"] = [m for m in console if not any(n in m for n in _OFFLINE_NOISE)]
    seen["name_there"] = name_there
    seen["middle"] = middle
    seen["expected_rows"] = {"folded": folded_rows}
    (SCREENSHOTS / f"timeline_deep_zoom_{label}.json").write_text(json.dumps(seen, indent=1, default=str))
    return seen


def names_of_steps(frame: Any) -> list[str]:
    return [str(n) for n in frame["name"].cat.categories if str(n).startswith("ProfilerStep#")]


def _check(seen: dict[str, Any], trace: Any) -> None:
    index = nbt.timeline_widget(trace).index
    for key in ("first", "deep", "clamped", "after_fold", "after_unfold"):
        state = seen[key]
        assert state["errors"] == [] and "kernel:" not in state["status"], (key, state)
    # one event count: the title says what the trace's own summary says
    assert seen["events_in_title"] in seen["first"]["title"]
    assert f"{sum(len(f) for f in trace.events.values()):,} events" in repr(trace)
    assert seen["events_in_title"] in repr(trace)
    # default height: the 48 lanes no longer make a 1,078 px widget
    assert seen["default_height_px"] < 0.5 * (len(index.lanes) * LANE_HEIGHT + LANE_HEIGHT)
    # deep zoom: the window and the kernel's answer are 1 ns, and it stays there
    deep, clamped = seen["deep"], seen["clamped"]
    assert deep["window"][1] - deep["window"][0] == pytest.approx(MIN_WINDOW_US, rel=1e-6)
    assert clamped["window"][1] - clamped["window"][0] == pytest.approx(MIN_WINDOW_US, rel=1e-6)
    assert deep["answered"][1] - deep["answered"][0] == pytest.approx(MIN_WINDOW_US, rel=1e-6)
    assert clamped["status"].startswith("1.0 ns shown")
    # distinct ticks, at full view and at 1 ns (with the origin written once at the left)
    for state in (seen["first"], deep, clamped):
        assert len(state["ticks"]) >= 3 and len(set(state["ticks"])) == len(state["ticks"]), state["ticks"]
    assert deep["base"] and all(t.startswith("+") and t.endswith(" ns") for t in deep["ticks"])
    # the tooltip of the bottom row names the event under the pointer, inside the widget's box
    hover = seen["hover"]
    assert hover["rank"] == index.ranks[-1] and abs(hover["t"] - seen["middle"]) < 20.0
    frame = trace.events[hover["rank"]]
    starts = frame["ts"].to_numpy() - index.origin
    covering = (starts <= hover["t"] + 1e-6) & (starts + frame["dur"].to_numpy() >= hover["t"] - 1e-6)
    names = set(frame["name"].astype(str).to_numpy()[covering]) - set(names_of_steps(frame))
    assert names and any(f"name: {n[:300]}" in seen["tooltip"] for n in names), (seen["tooltip"], names)
    assert _inside(seen["tooltip_box"], seen["widget_box"]), (seen["tooltip_box"], seen["widget_box"])
    # folding: rank 0 folded leaves one row per rank; unfolding the last rank adds its lanes
    ranks = len(index.ranks)
    assert len(seen["after_fold"]["labels"]) == ranks
    assert seen["after_fold"]["labels"][0].startswith(f"▸ rank {index.ranks[0]} · ")
    last_lanes = len(index.lanes_of(index.ranks[-1]))
    assert len(seen["after_unfold"]["labels"]) == ranks + last_lanes
    assert seen["after_unfold"]["height"] > seen["after_fold"]["height"]
    # the kernel: w.window is the 1 ns window, w.folded the clicks
    kernel = seen["kernel"]
    width = float(kernel.split("KERNEL WINDOW")[1].split()[0])
    assert width == pytest.approx(MIN_WINDOW_US, rel=1e-6)
    assert f"FOLDED {index.ranks[:-1]}" in kernel
    assert seen["page_errors"] == [] and seen["console_errors"] == [], seen


@pytest.mark.usefixtures("chromium")
def test_deep_zoom_on_the_8_rank_dlrm_set(tmp_path: Path) -> None:
    folder = locate_or_skip("traces/param_dlrm_8rank")
    trace = nbt.load_trace(folder)
    assert trace.ranks == list(range(8)) and min(float(f["ts"].min()) for f in trace.events.values()) > 1e15
    seen = _deep_zoom_in_lab(tmp_path, f"tr = nbt.load_trace({str(folder)!r})", trace, "dlrm")
    _check(seen, trace)


@pytest.mark.usefixtures("chromium")
def test_deep_zoom_on_an_epoch_trace_written_here(tmp_path: Path) -> None:
    from tests.trace.timeline_data import EPOCH_ORIGIN_US, write_epoch_traces

    write_epoch_traces(tmp_path / "epoch", ranks=8, streams=5)
    trace = nbt.load_trace(tmp_path / "epoch")
    assert min(float(f["ts"].min()) for f in trace.events.values()) == EPOCH_ORIGIN_US
    load = (
        "from timeline_data import write_epoch_traces\n"
        "write_epoch_traces('epoch', ranks=8, streams=5)\n"
        "tr = nbt.load_trace('epoch')"
    )
    seen = _deep_zoom_in_lab(tmp_path, load, trace, "epoch")
    _check(seen, trace)
