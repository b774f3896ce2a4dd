"""A person's view: the quick-start walkthrough run in a real JupyterLab in Debian's chromium.

Starts JupyterLab on 127.0.0.1, opens a fresh copy of notebooks/00_quickstart.ipynb (outputs
cleared, so everything on screen was rendered now), runs all cells from JupyterLab's Run menu,
and checks that nbtoolkit's tables and plotly figures rendered, that no cell raised, and that
the page logged no JavaScript errors. The screenshot is kept in out/browser/ for a person.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest

from .lab_harness import CHROMIUM, jupyterlab, run_notebook_in_browser

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "out" / "browser"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Messages chromium logs when an offline page cannot reach a network resource (JupyterLab
# asks PyPI for its extension manager). They say nothing about what nbtoolkit rendered.
_OFFLINE_NOISE = ("net::ERR_", "Failed to load resource", "ERR_NAME_NOT_RESOLVED", "pypi")


@pytest.fixture(scope="module")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        message = f"Debian's chromium is not installed at {CHROMIUM}: `apt-get install chromium`"
        if os.geteuid() == 0:  # make test installs it as root: missing here is a broken setup
            pytest.fail(message + " (make test's setup should have installed it)")
        pytest.skip(message + " (needs root, which make test's setup does not have here)")
    return CHROMIUM


def _fresh_copy(notebook: Path, folder: Path) -> str:
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, folder / notebook.name)
    return notebook.name


def test_quickstart_renders_tables_and_figures(chromium: str, tmp_path: Path) -> None:
    name = _fresh_copy(ROOT / "notebooks" / "00_quickstart.ipynb", tmp_path)
    shot = tmp_path / "quickstart.png"
    with jupyterlab(tmp_path) as server:
        page = run_notebook_in_browser(server, name, shot)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SCREENSHOTS / "00_quickstart.png")

    real_console_errors = [m for m in page.console_errors if not any(n in m for n in _OFFLINE_NOISE)]
    assert page.page_errors == [], f"JavaScript exceptions on the page: {page.page_errors}"
    assert real_console_errors == [], f"JavaScript errors in the console: {real_console_errors}"
    assert page.error_outputs == [], f"cells raised: {page.error_outputs}"
    assert page.plotly_figures >= 1, "no plotly figure rendered"
    assert page.nbt_outputs >= 1, "no nbtoolkit table rendered"
    assert shot.stat().st_size > 20_000  # a real screenshot of a rendered page, not a blank one
