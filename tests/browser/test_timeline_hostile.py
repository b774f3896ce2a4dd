"""Careless and hostile inputs to the timeline widgets, in JupyterLab and chromium (issue 32, own cases).

One notebook, every trace written by the test (Kineto JSON with epoch-µs timestamps, or saved
results); what a person would see is checked on the page:

1. names and a thread name made of HTML that runs script when parsed: shown as text, no element
   made, no script run;
2. a 100,000-character event name: its tooltip stays inside the widget, the selection line is cut,
   ``w.selected`` keeps the name whole;
3. a trace of a single event: wheel out far past the whole trace, drag far past its start, and
   zoom in to 1 ns: held at the trace's ends, no error;
4. a trace of one zero-duration event (a zero-length trace): drawn, hover works, zoom is a no-op;
5. a saved result whose durations are NaN and ±inf: a trace of the right length, no error;
6. a widget squeezed to 140 px: no horizontal overflow, the axis still has distinct labels, the
   tooltip stays inside;
7. a trace whose rank has no events: "no events to draw", no error;
8. a memory timeline of one event: drawn, hover inside the widget;
9. ``%%nbt memory --widget`` in the page's kernel, allocating in a function defined in an earlier
   cell: the selected instant's allocations and the magic's own table name that cell as a
   traceback does ("Cell In[9], line 1: make"; the profiler gives a function's ``def`` line), not
   ipykernel's temporary file (``/tmp/ipykernel_N/123.py(1): make``);
10. the notebook sets ``w.window`` to a zero-width window (widened to 1 ns), to NaN, and
    ``w.folded`` to a rank that is not shown: one clear error each, the page keeps working;
11. the same widget displayed twice: a rank folded in one view folds in the other.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import pytest

from tests.browser.lab_harness import CHROMIUM, CHROMIUM_ARGS, jupyterlab, open_and_run_all
from tests.browser.test_walkthrough_in_jupyterlab import (  # the chromium fixture: installed or a reason
    _OFFLINE_NOISE,
    SCREENSHOTS,
    chromium,  # noqa: F401
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
XSS = '<img src=x onerror="window.__pwned=2">'
SETUP = f'''import json
from pathlib import Path
import numpy as np
import nbtoolkit as nbt
from timeline_data import EPOCH_ORIGIN_US as O, synthetic_memory_events, write_epoch_traces
XSS = {XSS!r}
LONG = "x" * 100_000

def kineto(name, events):
    folder = Path(name)
    folder.mkdir(exist_ok=True)
    meta = [{{"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {{"name": XSS}}}}]
    (folder / "rank0.json").write_text(json.dumps({{"traceEvents": meta + events}}))
    return nbt.load_trace(folder)

def ev(name, ts, dur):
    return {{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}}

saved = kineto("three", [ev("a", O, 5), ev("b", O + 10, 5), ev("c", O + 20, 5)])
frame = saved.events[0].copy()
frame.loc[0, "dur"], frame.loc[1, "dur"], frame.loc[2, "dur"] = np.inf, np.nan, -np.inf
saved.events[0] = frame
saved.save("saved_nan")
empty = kineto("empty_rank", [ev("gone", O, 5)])
empty.events[0] = empty.events[0].iloc[:0]
write_epoch_traces("tiny", ranks=2, streams=1, per_lane=200)
import torch
%load_ext nbtoolkit'''
CELLS = [
    SETUP,
    "w_xss = nbt.timeline_widget(kineto('xss', [ev(XSS, O, 50), ev(LONG, O + 60, 40)]))\nw_xss",
    "w_one = nbt.timeline_widget(kineto('one', [ev('only', O, 5)]))\nw_one",
    "w_instant = nbt.timeline_widget(kineto('instant', [ev('instant', O, 0)]))\nw_instant",
    (  # a saved Trace with such times is refused at load (nbt.Trace.load); in memory it is drawn
        "try:\n    nbt.Trace.load('saved_nan')\nexcept nbt.NbtError as exc:\n    print('LOAD REFUSED', exc)\n"
        "w_saved = nbt.timeline_widget(saved)\nw_saved"
    ),
    "w_tiny = nbt.timeline_widget(nbt.load_trace('tiny'))\nw_tiny",
    "w_empty = nbt.timeline_widget(empty)\nw_empty",
    "mw_one = nbt.memory_widget(nbt.MemoryTimeline(events=synthetic_memory_events(2).iloc[:1]))\nmw_one",
    "def make(rows):\n    made = torch.ones(rows, 1024)\n    return made",  # In[9]: a function of a cell
    "%%nbt memory --widget --name mem\nkeep = make(1024)\nalso = make(512)\n",
    (
        "sel = mem_widget.select({'time': mem_widget.peak[0]})\n"
        "print('SOURCE', [a['source'] for a in sel['alive']][:3])"
    ),
    "from IPython.display import display\ndisplay(w_tiny)  # a second view of the same widget",
    # run by the test after its clicks and zooms
    (
        "w_one.window = [3.0, 3.0]\n"
        "for bad in ('w_tiny.folded = [99]', 'w_instant.window = [float(\"nan\"), 1.0]'):\n"
        "    try:\n"
        "        exec(bad)\n"
        "    except nbt.NbtError as exc:\n"
        "        print('REFUSED', exc)\n"
        "print('KERNEL', len(w_xss.selected.get('name', '')), w_one.window, w_saved.span)"
    ),
]
N_WIDGETS = 9
XSS_, ONE, INSTANT, SAVED, TINY, EMPTY, MEMORY_ONE, MEMORY_MAGIC, TINY_AGAIN = range(N_WIDGETS)


def _write_notebook(folder: Path) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nbformat.write(nb, folder / "hostile.ipynb")
    shutil.copy(HERE.parent / "trace" / "timeline_data.py", folder / "timeline_data.py")
    return "hostile.ipynb"


def _stats(page: Any, n: int) -> dict[str, Any]:
    return page.evaluate(
        """(n) => { const r = document.querySelectorAll('.nbt-timeline')[n]; const s = r.__nbtStats;
                    const tip = r.querySelector('.nbt-tl-tip');
                    return {views: s.views, ticks: s.ticks.slice(), window: s.window,
                            errors: s.errors.slice(),
                            status: r.querySelector('.nbt-tl-status').textContent,
                            title: r.querySelector('.nbt-tl-title').textContent,
                            selection: r.querySelector('.nbt-tl-selection').textContent,
                            tip: tip.style.display === 'none' ? null : tip.textContent,
                            box: r.getBoundingClientRect().toJSON(),
                            tipBox: tip.getBoundingClientRect().toJSON(),
                            scrollWidth: r.scrollWidth, clientWidth: r.clientWidth,
                            canvasWidth: r.querySelector('canvas').getBoundingClientRect().width}; }""",
        n,
    )


def _labels(page: Any, n: int) -> list[str]:
    return page.evaluate(
        "(n) => [...document.querySelectorAll('.nbt-timeline')[n].querySelectorAll('.nbt-tl-label')]"
        ".map(e => e.textContent)",
        n,
    )


def _inside(inner: dict[str, float], outer: dict[str, float]) -> bool:
    return (
        inner["left"] >= outer["left"] - 0.5
        and inner["top"] >= outer["top"] - 0.5
        and inner["right"] <= outer["right"] + 0.5
        and inner["bottom"] <= outer["bottom"] + 0.5
    )


def _canvas_box(page: Any, n: int) -> dict[str, float]:
    root = page.locator(".nbt-timeline").nth(n)
    root.scroll_into_view_if_needed()
    box = root.locator("canvas.nbt-tl-canvas").bounding_box()
    assert box is not None
    return box


def _wheel(page: Any, n: int, times: int, delta: int, fraction: float = 0.5) -> None:
    box = _canvas_box(page, n)
    page.mouse.move(box["x"] + fraction * box["width"], box["y"] + 11)
    for _ in range(times):
        page.mouse.wheel(0, delta)
        page.wait_for_timeout(20)
    page.wait_for_timeout(600)


def _hover(page: Any, n: int, fraction: float, y: float = 11) -> dict[str, Any]:
    box = _canvas_box(page, n)
    page.mouse.move(box["x"] + fraction * box["width"] + 1, box["y"] + y)
    page.mouse.move(box["x"] + fraction * box["width"], box["y"] + y)
    page.wait_for_timeout(150)
    return _stats(page, n)


@pytest.mark.usefixtures("chromium")
def test_hostile_and_careless_inputs_in_jupyterlab(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    notebook = _write_notebook(tmp_path)
    console: list[str] = []
    page_errors: list[str] = []
    seen: dict[str, Any] = {}
    with jupyterlab(tmp_path) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            open_and_run_all(page, server, notebook, timeout_s=300)
            page.wait_for_function(
                """(n) => { const r = document.querySelectorAll('.nbt-timeline');
                            return r.length === n
                                   && [...r].every(x => Number(x.dataset.views || 0) >= 1); }""",
                arg=N_WIDGETS,
                timeout=120_000,
            )
            seen["first"] = [_stats(page, n) for n in range(N_WIDGETS)]

            # 1, 2: HTML names as text; the 100k-character name's tooltip inside the widget
            seen["xss_tip"] = _hover(page, XSS_, 0.25)["tip"]
            seen["pwned"] = page.evaluate("() => window.__pwned === undefined ? null : window.__pwned")
            seen["xss_elements"] = page.locator(".nbt-timeline img").count()
            seen["long_tip"] = _hover(page, XSS_, 0.8)
            shots = [tmp_path / "timeline_hostile_long_name.png", tmp_path / "timeline_hostile_tiny.png"]
            page.locator(".nbt-timeline").nth(XSS_).screenshot(path=str(shots[0]))
            box = _canvas_box(page, XSS_)
            page.mouse.click(box["x"] + 0.8 * box["width"], box["y"] + 11)
            page.locator(".nbt-timeline").nth(XSS_).locator(".nbt-tl-selection").filter(
                has_text="xxxx"
            ).wait_for(timeout=30_000)
            seen["long_selection"] = _stats(page, XSS_)["selection"]

            # 3: one event: far out, then in to 1 ns
            _wheel(page, ONE, 30, 500)
            seen["one_out"] = _stats(page, ONE)
            _wheel(page, ONE, 3, -500, fraction=0.02)  # a little in, near the start, then drag far right
            box = _canvas_box(page, ONE)
            page.mouse.move(box["x"] + 50, box["y"] + 11)
            page.mouse.down()
            for k in range(1, 11):
                page.mouse.move(box["x"] + 50 + 70 * k, box["y"] + 11)
                page.wait_for_timeout(20)
            page.mouse.up()
            page.wait_for_timeout(500)
            seen["one_dragged"] = _stats(page, ONE)
            _wheel(page, ONE, 30, -500, fraction=0.3)
            seen["one_in"] = _stats(page, ONE)

            # 4: one zero-duration event
            seen["instant_tip"] = _hover(page, INSTANT, 0.0)
            _wheel(page, INSTANT, 5, 500)
            _wheel(page, INSTANT, 5, -500)
            seen["instant_zoomed"] = _stats(page, INSTANT)

            # 6: squeezed to 140 px
            page.evaluate(
                "(n) => { document.querySelectorAll('.nbt-timeline')[n].style.width = '140px'; }", TINY
            )
            page.wait_for_timeout(1000)
            seen["tiny"] = _hover(page, TINY, 0.5, y=LANE_Y_FIRST_LANE)
            page.locator(".nbt-timeline").nth(TINY).screenshot(path=str(shots[1]))

            # 8: memory timeline of one event
            seen["memory_one_tip"] = _hover(page, MEMORY_ONE, 0.05, y=200)

            # 9: the magic's memory widget: a click at the peak names the cell
            box = _canvas_box(page, MEMORY_MAGIC)
            page.mouse.click(box["x"] + 0.97 * box["width"], box["y"] + 250)  # the peak: both alive
            page.locator(".nbt-timeline").nth(MEMORY_MAGIC).locator(".nbt-tl-selection").filter(
                has_text="selected"
            ).wait_for(timeout=30_000)
            seen["memory_selection"] = _stats(page, MEMORY_MAGIC)["selection"]
            source = page.locator(".jp-OutputArea-output").filter(has_text=re.compile(r"^SOURCE \[")).first
            seen["source_cell"] = source.text_content()
            refused = page.locator(".jp-OutputArea-output").filter(has_text=re.compile(r"^LOAD REFUSED "))
            seen["load_refused"] = refused.first.text_content()
            report = page.locator(".jp-OutputArea-output").filter(has_text="Largest allocations alive")
            seen["memory_report"] = report.first.text_content()

            # 11: two views of one widget: a fold clicked in one folds the other
            again = page.locator(".nbt-timeline").nth(TINY_AGAIN)
            again.scroll_into_view_if_needed()
            seen["views_before_fold"] = [_labels(page, n) for n in (TINY, TINY_AGAIN)]
            again.locator(".nbt-tl-rank[data-rank='1']").click()
            page.wait_for_timeout(1000)
            seen["views_after_fold"] = [_labels(page, n) for n in (TINY, TINY_AGAIN)]

            # 10: the notebook sets nonsense windows and folds
            last = page.locator(".jp-CodeCell").last
            last.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Control+Enter")
            out = last.locator(".jp-OutputArea-output").filter(has_text=re.compile(r"KERNEL \d"))
            out.wait_for(timeout=30_000)
            page.wait_for_timeout(1000)
            seen["kernel"] = out.text_content()
            seen["after_notebook"] = [_stats(page, n) for n in (ONE, TINY)]
            seen["final"] = [_stats(page, n) for n in range(N_WIDGETS)]
            shot = tmp_path / "timeline_hostile.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for path in (shot, *shots):
        shutil.copy(path, SCREENSHOTS / path.name)
    print("hostile widget cases:", seen)

    # every widget drew, said no error, and labelled its axis with distinct ticks
    for n, state in enumerate(seen["final"]):
        assert state["views"] >= 1 and state["errors"] == [] and "kernel:" not in state["status"], (n, state)
        assert len(state["ticks"]) == len(set(state["ticks"])), (n, state["ticks"])
    # a saved Trace whose times are NaN/inf is refused at load, naming the damage (drawn from memory)
    assert "infinite or negative time or duration" in seen["load_refused"]
    # 1: HTML as text only
    assert XSS in seen["xss_tip"] and seen["pwned"] is None and seen["xss_elements"] == 0
    assert XSS in seen["first"][XSS_]["title"] or "2 events" in seen["first"][XSS_]["title"]
    # 2: the long name: tooltip cut and inside the widget; selection line cut; the kernel has it whole
    long_tip = seen["long_tip"]
    assert long_tip["tip"] and "x" * 300 in long_tip["tip"] and "x" * 301 not in long_tip["tip"]
    assert _inside(long_tip["tipBox"], long_tip["box"]), long_tip
    assert len(seen["long_selection"]) < 500
    assert "KERNEL 100000 " in seen["kernel"]
    # 3: one event: zoomed out, the whole (5 µs) trace; zoomed in, 1 ns
    one_out, one_in = seen["one_out"], seen["one_in"]
    assert one_out["window"] == [0, 5] and len(one_out["ticks"]) >= 3
    assert one_in["window"][1] - one_in["window"][0] == pytest.approx(1e-3, rel=1e-6)
    dragged = seen["one_dragged"]["window"]  # panned past the start: held at 0, same width
    assert dragged[0] == 0 and dragged[1] == pytest.approx(5 * np.exp(-3), rel=0.05)
    assert one_in["status"].startswith("1.0 ns shown")
    # 4: the zero-length trace: 1 ns wide, hover names its event
    assert seen["instant_tip"]["tip"] and "events: 1" in seen["instant_tip"]["tip"]
    assert seen["instant_zoomed"]["window"][1] == pytest.approx(1e-3)
    # 5: NaN / ±inf durations in a saved result: 3 instants over 20 µs (the last start), not 1e308
    assert seen["first"][SAVED]["title"].startswith("1 lane, 3 events")
    assert "[0.0, 20.0]" in seen["kernel"]
    # 6: squeezed: nothing sticks out, still a canvas, the tooltip inside
    tiny = seen["tiny"]
    assert tiny["box"]["width"] <= 141 and tiny["scrollWidth"] <= tiny["clientWidth"] + 1, tiny
    assert tiny["canvasWidth"] >= 20 and len(tiny["ticks"]) >= 1
    assert tiny["tip"] and _inside(tiny["tipBox"], tiny["box"]), tiny
    # 7: no events
    assert seen["first"][EMPTY]["status"] == "no events to draw"
    # 8: one memory event
    memory_tip = seen["memory_one_tip"]
    assert memory_tip["tip"] and _inside(memory_tip["tipBox"], memory_tip["box"]), memory_tip
    # 9: the cell, named as a traceback names it
    assert "Cell In[9], line 1: make" in seen["source_cell"], seen["source_cell"]  # the profiler: def line
    assert "ipykernel_" not in seen["source_cell"]
    assert "Cell In[9], line 1: make" in seen["memory_report"] and "ipykernel_" not in seen["memory_report"]
    assert "Cell In[9], line" in seen["memory_selection"], seen["memory_selection"]
    # 10: a zero-width window from the notebook: 1 ns at 3 µs; an unknown rank folds nothing
    assert "REFUSED cannot fold rank(s) [99]: ranks shown: [0, 1]" in seen["kernel"]
    assert "REFUSED timeline window must satisfy t0 < t1 (finite µs); got t0=nan" in seen["kernel"]
    one_after, tiny_after = seen["after_notebook"]
    assert one_after["window"][1] - one_after["window"][0] == pytest.approx(1e-3, rel=1e-6)
    assert tiny_after["errors"] == []
    # 11: both views of w_tiny: 2 rank headers and 4 lanes, then rank 1 folded in both
    assert [len(v) for v in seen["views_before_fold"]] == [6, 6]
    assert [len(v) for v in seen["views_after_fold"]] == [4, 4]
    assert all(v[-1].startswith("▸ rank 1 · 2 lanes") for v in seen["views_after_fold"])
    real_console = [m for m in console if not any(n in m for n in _OFFLINE_NOISE)]
    assert page_errors == [], f"JavaScript exceptions on the page: {page_errors}"
    assert real_console == [], f"JavaScript errors in the console: {real_console}"


LANE_Y_FIRST_LANE = 33  # two ranks: rank 0's header row, then its first lane
