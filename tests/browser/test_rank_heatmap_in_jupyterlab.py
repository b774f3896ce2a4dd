"""Issue 38: the rank heatmaps in a real JupyterLab; a click on a cell shows that rank's timeline.

A 6-rank scale set made from the recorded 2-rank gloo job; one cell shows
``nbt.rank_heatmaps(tr)``. The test clicks, with the mouse, the cell of rank row 4 and step
column 1 of the first heatmap (its pixel position from the bokeh plot's frame and scales, read
from bokeh's view index in the page), then checks the box shows "rank R, step S" of that cell
and a timeline widget under the heatmaps, and that the kernel's ``view.selected`` and the
widget's rank are that cell's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

import nbtoolkit as nbt
from nbtoolkit.trace.scale_set import write_scale_set
from tests.browser.lab_harness import CHROMIUM, CHROMIUM_ARGS, jupyterlab, open_and_run_all
from tests.browser.test_walkthrough_in_jupyterlab import (  # the chromium fixture: installed or a reason
    _OFFLINE_NOISE,
    SCREENSHOTS,
    chromium,  # noqa: F401
)
from tests.trace.conftest import gloo_trace_folder  # noqa: F401  (the recorded 2-rank job)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROW, COLUMN = 4, 1  # the cell clicked: rank row 4, step column 1 of the first heatmap

# Page position of a data point (x, y) of the first bokeh plot that has a frame: the frame's
# scales give canvas pixels, the canvas element's box gives the page offset.
CELL_POSITION = """([x, y]) => {
  const plots = [...Bokeh.index.query(v => v.frame != null && v.frame.x_scale != null)];
  if (plots.length === 0) return null;
  const plot = plots[0];
  const canvas = (plot.canvas_view ?? plot.canvas).el.getBoundingClientRect();
  return {x: canvas.left + plot.frame.x_scale.compute(x), y: canvas.top + plot.frame.y_scale.compute(y),
          plots: plots.length};
}"""


def _write_notebook(folder: Path, traces: Path) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            # This machine has no internet: bokeh's JS goes inline instead of from its CDN
            # (rank_heatmaps leaves an hv.extension the user already ran as it is).
            "import holoviews as hv\n"
            'hv.extension("bokeh", inline=True, logo=False)\n'
            "import nbtoolkit as nbt\n"
            f"tr = nbt.load_trace({str(traces)!r}, hold_events=False, workers=1)\n"
            "view = nbt.rank_heatmaps(tr)\n"
            "view"
        ),
        nbformat.v4.new_code_cell(
            'print("KERNEL SEES", view.selected, view.timeline.index.ranks if view.timeline else None)\n'
            'print("KERNEL WINDOW", *(view.timeline.window if view.timeline else []))'
        ),
    ]
    nbformat.write(nb, folder / "rank_heatmaps.ipynb")
    return "rank_heatmaps.ipynb"


@pytest.mark.usefixtures("chromium")
def test_clicking_a_heatmap_cell_shows_that_rank_and_step_under_it(
    tmp_path: Path, gloo_trace_folder: Path  # noqa: F811
) -> None:
    pytest.importorskip("holoviews", reason="HoloViews (pip install 'nbtoolkit[views]') is not installed")
    from playwright.sync_api import sync_playwright

    made = write_scale_set(gloo_trace_folder, tmp_path / "set", ranks=6, straggler=3)
    folder_trace = nbt.load_trace(made.path, hold_events=False, workers=1)
    cells = nbt.rank_heatmaps(folder_trace).cells
    rank, step = cells["ranks"][ROW], cells["steps"][COLUMN]
    trace_steps = nbt.timeline_widget(folder_trace, ranks=[rank]).index.steps  # that rank's step spans
    notebook = _write_notebook(tmp_path, made.path)
    console: list[str] = []
    page_errors: list[str] = []
    with jupyterlab(tmp_path) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            open_and_run_all(page, server, notebook, timeout_s=300)
            box = page.locator(".nbt-rank-heatmaps")
            box.wait_for(timeout=60_000)
            page.wait_for_function(
                "() => window.Bokeh != null && [...Bokeh.index.query(v => v.frame != null)].length >= 3",
                timeout=60_000,
            )
            box.scroll_into_view_if_needed()
            page.wait_for_timeout(1000)
            where = page.evaluate(CELL_POSITION, [COLUMN, ROW])
            assert where is not None and where["plots"] == 3, where
            page.mouse.click(where["x"], where["y"])
            line = box.locator(".nbt-heatmap-cell").filter(has_text=f"rank {rank}, step {step}")
            line.wait_for(timeout=60_000)
            timeline = box.locator(".nbt-timeline")
            timeline.wait_for(timeout=60_000)
            # the timeline draws the chosen step's window (show_step), not the whole trace
            page.wait_for_function(
                "() => { const r = document.querySelector('.nbt-timeline');"
                " return r && r.__nbtStats && r.__nbtStats.answered != null; }",
                timeout=60_000,
            )
            drawn = page.evaluate(
                "() => { const s = document.querySelector('.nbt-timeline').__nbtStats;"
                " return {window: s.window, answered: s.answered}; }"
            )
            assert box.locator(".nbt-heatmap-cell").count() == 1
            # the timeline is under the heatmaps and the line, inside the same box
            line_box, timeline_box = line.bounding_box(), timeline.bounding_box()
            assert line_box and timeline_box
            assert where["y"] < line_box["y"] < timeline_box["y"]
            # the kernel sees the same cell, and the widget holds that rank only
            last = page.locator(".jp-CodeCell").last
            last.locator(".jp-InputArea-editor").click()
            page.keyboard.press("Control+Enter")
            seen = last.locator(".jp-OutputArea-output").filter(has_text="KERNEL SEES (")
            seen.wait_for(timeout=30_000)
            kernel_text = seen.text_content()
            shot = tmp_path / "rank_heatmaps.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SCREENSHOTS / shot.name)
    assert f"KERNEL SEES ({rank}, {step}) [{rank}]" in kernel_text
    # the window the page drew is the kernel's, which is the step's (tests/trace/test_rank_heatmap_view.py)
    kernel_window = [float(x) for x in kernel_text.split("KERNEL WINDOW")[1].split()[:2]]
    assert drawn["answered"] == pytest.approx(kernel_window, rel=1e-9, abs=1e-6), (drawn, kernel_window)
    steps = [(a, b) for r, s_, a, b in trace_steps if (r, s_) == (rank, step)]
    assert len(steps) == 1 and kernel_window[0] <= steps[0][0] < steps[0][1] <= kernel_window[1]
    real_console = [m for m in console if not any(n in m for n in _OFFLINE_NOISE)]
    assert page_errors == [], f"JavaScript exceptions on the page: {page_errors}"
    assert real_console == [], f"JavaScript errors in the console: {real_console}"
