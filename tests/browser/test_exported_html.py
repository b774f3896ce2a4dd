"""A person's view of exported notebooks: nbconvert's HTML, opened offline in Debian's chromium.

Every output that holds a figure (plotly's JSON) or a widget view must show a static form in the
exported page (issue 39): an SVG or image with something drawn in it, visible on the page, where
nbconvert would otherwise print nothing ("not able to be represented"). The page is opened with
the network cut (every non-file request aborted), as a reader offline or behind a proxy sees it.

- a notebook written here runs in a real kernel (nbclient, as ``make demo`` runs the
  walkthroughs, and exported as it exports them: without the saved widget state, which would
  make nbconvert's page fetch widget JavaScript from a CDN) with every magic that draws:
  ``%nbt trace`` and ``%%nbt memory`` (static and widget), figures in cells, the timeline widget
  and the graph-break explorer;
- the walkthroughs ``make demo`` executed and exported (out/notebooks, out/html), when present.

Screenshots are kept in out/browser/ for a person.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .lab_harness import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "out" / "browser"
FIGURE = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# For each code cell, for each output: what the page shows of it.
_INSPECT = """() => Array.from(document.querySelectorAll('.jp-Cell.jp-CodeCell')).map(cell =>
  Array.from(cell.querySelectorAll('.jp-OutputArea-child')).map(child => {
    const box = child.getBoundingClientRect();
    const pictures = Array.from(child.querySelectorAll('svg, img')).map(el => {
      const r = el.getBoundingClientRect();
      const marks = el.tagName.toLowerCase() === 'img' ? (el.naturalWidth > 0 ? 1 : 0) :
        Array.from(el.querySelectorAll('path, rect, polygon, image, circle')).filter(m => {
          const b = m.getBoundingClientRect();
          return b.width > 0 || b.height > 0;
        }).length;
      return {width: r.width, height: r.height, marks: marks};
    });
    return {height: box.height, text: child.textContent.trim().length, pictures: pictures};
  }))"""

CELLS = [
    "%load_ext nbtoolkit",
    """import torch
from torch import nn
import nbtoolkit as nbt
from nbtoolkit.memory.figures import module_figure

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 64)

def step():
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()""",
    "%%nbt profile --steps 2 --name tr\nstep()",
    "%nbt trace tr",
    "%nbt trace tr --widget",
    "%%nbt memory --model model --optimizer opt --name mem\nstep()",
    "%%nbt memory --model model --optimizer opt --widget\nstep()",
    "module_figure(mem)",
    "nbt.timeline_widget(tr)",
    """def broken(t):
    t = t + 1
    print("<script>alert(1)</script>")
    return t * t.sum().item()

graphs = nbt.capture_graphs(torch.compile(broken, backend="eager"), torch.randn(8), steps=1)
graphs.explorer()""",
    "graphs.compile_time_chart()",
]


@pytest.fixture(scope="module")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        message = f"Debian's chromium is not installed at {CHROMIUM}: `apt-get install chromium`"
        if os.geteuid() == 0:  # make test installs it as root: missing here is a broken setup
            pytest.fail(message + " (make test's setup should have installed it)")
        pytest.skip(message + " (needs root, which make test's setup does not have here)")
    return CHROMIUM


def _pictures_expected(notebook: Any) -> list[list[str]]:
    """Per code cell, per output: "figure", "widget" or "" (an output with nothing to draw)."""
    return [
        ["figure" if FIGURE in out.get("data", {}) else "widget" if WIDGET in out.get("data", {}) else ""
         for out in cell.get("outputs", [])]
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]  # fmt: skip


def _export(notebook: Any, folder: Path, name: str) -> Path:
    """nbconvert's HTML of ``notebook`` as ``make demo`` writes it (no widget state), with no
    'not able to be represented' output allowed."""
    from nbconvert import HTMLExporter

    notebook.metadata.pop("widgets", None)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        body, _ = HTMLExporter().from_notebook_node(notebook)
    unshown = [str(w.message) for w in caught if "not able to be represented" in str(w.message)]
    assert unshown == [], f"{name}: outputs nbconvert cannot show: {unshown}"
    path = folder / f"{name}.html"
    path.write_text(body, encoding="utf-8")
    return path


def _open_offline(chromium: str, page_path: Path, screenshot: Path) -> list[list[dict[str, Any]]]:
    """What the page shows, per code cell and output, with every network request refused."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1200})
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                       else route.abort())  # fmt: skip
            page.goto(page_path.as_uri(), wait_until="load", timeout=60_000)
            page.wait_for_timeout(500)
            shown: list[list[dict[str, Any]]] = page.evaluate(_INSPECT)
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return shown


def _missing_pictures(name: str, expected: list[list[str]], shown: list[list[dict[str, Any]]]) -> list[str]:
    """Each figure or widget output the page does not show as a drawn, visible picture."""
    assert len(shown) == len(expected), f"{name}: {len(shown)} code cells on the page, {len(expected)} in it"
    missing = []
    for cell, (kinds, outputs) in enumerate(zip(expected, shown, strict=True)):
        assert len(outputs) == len(kinds), f"{name} code cell {cell}: outputs {len(outputs)} != {len(kinds)}"
        for index, (kind, output) in enumerate(zip(kinds, outputs, strict=True)):
            drawn = [
                p for p in output["pictures"] if p["width"] > 100 and p["height"] > 20 and p["marks"] >= 1
            ]
            # The explorer's static form is HTML text (every break, folded), not a picture.
            readable = kind == "widget" and output["text"] > 200 and output["height"] > 40
            if kind and not (drawn or readable):
                missing.append(f"{name} code cell {cell} output {index} ({kind}): {output}")
    return missing


def test_magics_figures_and_widgets_show_in_exported_html(chromium: str, tmp_path: Path) -> None:
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    env_widgets = os.environ.pop("NBT_WIDGETS", None)  # the kernel decides as nbconvert's would
    try:
        NotebookClient(notebook, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()  # fmt: skip
    finally:
        if env_widgets is not None:
            os.environ["NBT_WIDGETS"] = env_widgets
    expected = _pictures_expected(notebook)
    figures = sum(kinds.count("figure") for kinds in expected)
    widgets = sum(kinds.count("widget") for kinds in expected)
    # trace: 2 x (timeline + overlap); memory: figure; module figure; compile chart / 3 widgets
    assert (figures, widgets) == (6, 4), expected
    page = _export(notebook, tmp_path, "magics")
    shown = _open_offline(chromium, page, SCREENSHOTS / "exported_magics.png")
    assert _missing_pictures("magics", expected, shown) == []
    html = page.read_text()
    assert "<script>alert(1)</script>" not in html  # the user's printed text, escaped in every form


def _demo_exports() -> list[str]:
    html = ROOT / "out" / "html"
    return sorted(p.stem for p in html.glob("[0-9]*.html")) if html.is_dir() else []


@pytest.mark.parametrize("name", _demo_exports() or ["(none)"])
def test_make_demo_html_shows_every_figure(chromium: str, tmp_path: Path, name: str) -> None:
    executed = ROOT / "out" / "notebooks" / f"{name}.ipynb"
    if not executed.exists():
        pytest.skip("no walkthrough exports in out/: run `make demo` first (out/notebooks, out/html)")
    notebook = nbformat.read(executed, as_version=4)
    copied = tmp_path / f"{name}.html"
    shutil.copy(ROOT / "out" / "html" / f"{name}.html", copied)
    shown = _open_offline(chromium, copied, SCREENSHOTS / f"exported_{name}.png")
    assert _missing_pictures(name, _pictures_expected(notebook), shown) == []
