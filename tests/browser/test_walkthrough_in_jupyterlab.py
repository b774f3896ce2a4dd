"""A person's view: walkthroughs run in a real JupyterLab in Debian's chromium.

Starts JupyterLab on 127.0.0.1, opens a fresh copy of a walkthrough (outputs cleared, so
everything on screen was rendered now), runs all cells from JupyterLab's Run menu, and checks
that nbtoolkit's tables and plotly figures rendered, that no cell raised, and that the page
logged no JavaScript errors. The screenshots are kept in out/browser/ for a person.

- the quick start, whole;
- the memory walkthrough, whole (its figures, and the 16-bytes-per-parameter line it computes);
- the cluster walkthrough without its DeepSpeed part and without the cell that fails on
  purpose (Run All stops at an error): a local Ray cluster started from the page's kernel,
  rank-prefixed output streamed into the page, per-rank memory and overlap. Ray runs inside
  the test's private network namespace like every cluster test.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest

from .lab_harness import CHROMIUM, PageReport, jupyterlab, run_notebook_in_browser

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


def _fresh_copy(notebook: Path, folder: Path, keep: Callable[[int, Any], bool] | None = None) -> str:
    nb = nbformat.read(notebook, as_version=4)
    if keep is not None:
        nb.cells = [cell for i, cell in enumerate(nb.cells) if keep(i, cell)]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, folder / notebook.name)
    return notebook.name


def _run_in_lab(name: str, folder: Path) -> PageReport:
    """Run the notebook ``folder/name`` in JupyterLab; keep the screenshot in out/browser/."""
    shot = folder / f"{Path(name).stem}.png"
    with jupyterlab(folder) as server:
        page = run_notebook_in_browser(server, name, shot)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SCREENSHOTS / shot.name)
    assert shot.stat().st_size > 20_000  # a real screenshot of a rendered page, not a blank one
    real_console_errors = [m for m in page.console_errors if not any(n in m for n in _OFFLINE_NOISE)]
    assert page.page_errors == [], f"JavaScript exceptions on the page: {page.page_errors}"
    assert real_console_errors == [], f"JavaScript errors in the console: {real_console_errors}"
    assert page.error_outputs == [], f"cells raised: {page.error_outputs}"
    return page


def test_quickstart_renders_tables_and_figures(chromium: str, tmp_path: Path) -> None:
    page = _run_in_lab(_fresh_copy(ROOT / "notebooks" / "00_quickstart.ipynb", tmp_path), tmp_path)
    assert page.plotly_figures >= 1, "no plotly figure rendered"
    assert page.nbt_outputs >= 1, "no nbtoolkit table rendered"


def _cluster_cells_without_deepspeed(notebook: Path) -> Callable[[int, Any], bool]:
    """Keep 04_cluster's cells except the DeepSpeed sections (10 to 12) and cells that raise on purpose."""
    cells = nbformat.read(notebook, as_version=4).cells
    start = next(i for i, c in enumerate(cells) if "## 10. DeepSpeed ZeRO from a cell" in c.source)
    end = next(i for i, c in enumerate(cells) if "## 13. Status and stop" in c.source)

    def keep(i: int, cell: Any) -> bool:
        return not (start <= i < end) and "raises-exception" not in cell.metadata.get("tags", [])

    return keep


@pytest.mark.ray
def test_cluster_walkthrough_streams_rank_output_and_renders_per_rank_results(
    chromium: str, tmp_path: Path
) -> None:
    source = ROOT / "notebooks" / "04_cluster.ipynb"
    page = _run_in_lab(_fresh_copy(source, tmp_path, keep=_cluster_cells_without_deepspeed(source)), tmp_path)
    text = page.output_text
    assert "[rank 0] hello from rank 0 of 2, backend gloo" in text
    assert "[rank 1] hello from rank 1 of 2, backend gloo" in text
    assert "memory timelines of 2 ranks" in text  # the RankMemory table
    assert "highest peak / lowest peak: 1.00" in text  # DDP: the same model and batch size on both ranks
    # hundreds of ranks, read by workers a real kernel starts (forkserver), and on the cluster
    assert "64 ranks, 0 failed to read" in text
    found = re.search(r"the rank made slow on purpose: (\d+) \| the slowest rank found: \1\b", text)
    assert found, text[-2000:]
    assert "same overlap table as the local read: True" in text
    assert "cluster stopped" in text
    assert page.plotly_figures >= 1, "no plotly figure rendered"
    assert page.nbt_outputs >= 2, "nbtoolkit tables (overlap, per-rank memory) did not render"


def test_memory_walkthrough_renders_its_figures(chromium: str, tmp_path: Path) -> None:
    """02_memory, whole: its plotly figures draw in JupyterLab and its computed 16-bytes line shows.

    The real GPU snapshot it reads is found through NBT_DATA where the fixtures exist; without them
    the notebook writes its own CPU step as a snapshot and runs on that, so the test runs either way.
    """
    page = _run_in_lab(_fresh_copy(ROOT / "notebooks" / "02_memory.ipynb", tmp_path), tmp_path)
    # the AdamW arithmetic, computed in the page's kernel: 16 bytes per parameter plus the step counters
    assert "= 16 x 1,307,088 + 204 bytes" in page.output_text
    assert page.plotly_figures >= 3, f"only {page.plotly_figures} plotly figures rendered"
    assert page.nbt_outputs >= 1, "no nbtoolkit table rendered"
