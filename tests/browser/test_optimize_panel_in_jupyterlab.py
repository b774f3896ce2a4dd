"""The optimize panel used as a person would, in JupyterLab 4.6 (default settings: widget messages
over a kernel subshell) and Debian's chromium (issue 41).

One notebook, one kernel, a 5-block transformer trained with AdamW:

- ``%nbt optimize ... --budget 1MiB`` (under the floor): the panel says why no plan fits (the
  PlanError's floor and what to do), the button is off; a budget typed into the box re-plans;
- a double click on "Apply and measure", and at once a training cell: one measurement, on the
  kernel's main thread; the cell waits and runs after it (no crash, no error blaming the step);
  the result (headline with the device-total peak and the budget verdict, the table) is
  written as an output of the panel's cell; moving the budget to another plan marks it stale;
- Kernel → Interrupt in the middle of a long measurement: the panel says "interrupted" within a
  second, the progress stops, and the model is as it was (weights, no compiled forward);
- saved, kernel shut down, page reloaded: the result table is still there, and nbconvert's HTML
  export has it; torch's "Memory block of unknown size" line is nowhere.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.browser.lab_harness import CHROMIUM, CHROMIUM_ARGS, jupyterlab
from tests.browser.test_walkthrough_in_jupyterlab import (  # the chromium fixture: installed or a reason
    _OFFLINE_NOISE,
    SCREENSHOTS,
    chromium,  # noqa: F401
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
NOISE = "Memory block of unknown size"
SETUP, PANEL, ROUTE, TRAIN, SAVE, LONG_PANEL, CHECK = range(7)
CELLS = [
    (
        "import threading, time\n"
        "import torch\n"
        "import nbtoolkit as nbt\n"
        "import nbtoolkit.recompute.optimize as optimize_module\n"
        "from _models import make_gpt\n"
        "model, step = make_gpt(hidden=[64, 256, 128, 384, 128])\n"
        "runs = []  # (thread, start, end) of every nbt.optimize call the panels make\n"
        "measure = optimize_module.optimize\n"
        "def counted(*args, **kwargs):\n"
        "    start = time.time()\n"
        "    try:\n"
        "        return measure(*args, **kwargs)\n"
        "    finally:\n"
        "        runs.append((threading.current_thread().name, start, time.time()))\n"
        "optimize_module.optimize = counted\n"
        "def weights():\n"
        "    return {k: v.detach().clone() for k, v in model.state_dict().items()}\n"
        "def as_before(saved):\n"
        "    same = all(torch.equal(saved[k], v) for k, v in model.state_dict().items())\n"
        "    return same and all('forward' not in m.__dict__ for m in model.modules())\n"
        "p = nbt.plan_recompute(model, step, None, steps=2)\n"
        "%load_ext nbtoolkit"
    ),
    "%nbt optimize model step --plan p --steps 10 --budget 1MiB",
    (
        "panel, clicks = _nbt, []\n"
        "panel.button.on_run(lambda: clicks.append(threading.current_thread().name))\n"
        "# ipykernel 7.4 sends a comm's messages to the thread that last published on it (the main\n"
        "# thread, which made the panel); without that memory (ipykernel 7.0-7.3) JupyterLab's clicks\n"
        "# run on the widgets' subshell, a second thread: the case the panel must be safe in\n"
        "vars(panel.button.comm).pop('_reply_subshell_id', None)\n"
        "print('ROUTED')"
    ),
    (
        "started = time.time()\n"
        "for _ in range(40):\n"
        "    step()\n"
        "waited = bool(runs) and started >= runs[-1][2]\n"
        "print('TRAINED on', threading.current_thread().name, 'after the measurement:', waited)\n"
        "print('CLICKED on', clicks, 'MEASURED on', runs[-1][0])"
    ),
    "saved = weights(); print('SAVED')",
    "%nbt optimize model step --plan p --steps 30 --compile --backend eager",
    "print('RESTORED', as_before(saved), 'RUNS', len(runs), sorted({r[0] for r in runs}))",
]


def _write_notebook(folder: Path) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "optimize_panel.ipynb")
    shutil.copy(HERE.parent / "optimize" / "_models.py", folder / "_models.py")
    return "optimize_panel.ipynb"


def _open(page: Any, url: str) -> None:
    """Open the notebook; accept the kernel JupyterLab proposes if it asks; wait for an idle kernel."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(url, timeout=120_000)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
    accept = page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
    try:
        accept.wait_for(timeout=5_000)
        accept.click()
    except PlaywrightTimeout:
        pass
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)


def _cell(page: Any, i: int) -> Any:
    return page.locator(".jp-Notebook .jp-CodeCell").nth(i)


def _run_cell(page: Any, i: int) -> None:
    _cell(page, i).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def _wait_cell(page: Any, i: int, timeout_s: float = 300) -> None:
    prompt = _cell(page, i).locator(".jp-InputPrompt")
    deadline = time.monotonic() + timeout_s
    while re.search(r"\[\s*[*]?\s*\]", prompt.text_content() or "[ ]"):
        assert time.monotonic() < deadline, f"cell {i} did not finish in {timeout_s} s"
        page.wait_for_timeout(200)


def _text(page: Any, i: int) -> str:
    return "\n".join(_cell(page, i).locator(".jp-OutputArea-output").all_text_contents())


def _wait_text(page: Any, i: int, pattern: str, timeout_s: float = 300) -> str:
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, text := _text(page, i)):
        assert time.monotonic() < deadline, f"cell {i} never showed {pattern!r}; it shows:\n{text[-2000:]}"
        page.wait_for_timeout(100)
    return text


def _wait_enabled(button: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while button.is_disabled():
        assert time.monotonic() < deadline, f"the button stayed disabled for {timeout_s} s"
        time.sleep(0.1)


def _set_budget(page: Any, i: int, text: str) -> None:
    box = _cell(page, i).locator(".widget-text input")
    box.fill(text)
    box.press("Enter")


def _progress(page: Any, i: int) -> tuple[float, float]:
    bar = _cell(page, i).locator(".progress .progress-bar")
    width = bar.evaluate("b => b.style.width || getComputedStyle(b).width")
    return float(str(width).rstrip("%px") or 0), time.monotonic()


def _mib(text: str, what: str) -> float:
    found = re.search(rf"{what} ([0-9.,]+) MiB", text)
    assert found, f"no {what!r} in {text[-1500:]}"
    return float(found.group(1).replace(",", ""))


def _menu(page: Any, menu: str, command: str) -> None:
    page.click(f"li.lm-MenuBar-item:has-text('{menu}')")
    page.click(f"li.lm-Menu-item[data-command='{command}']")


@pytest.mark.usefixtures("chromium")
def test_optimize_panel_measures_on_the_main_thread_interrupts_and_keeps_its_result(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    notebook = _write_notebook(tmp_path)
    console: list[str] = []
    page_errors: list[str] = []
    with jupyterlab(tmp_path) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2200})
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            # cell by cell, as a person runs them (Run All would not wait for the clicks)
            _open(page, f"{server.url}/lab/tree/{notebook}?token={server.token}")
            _run_cell(page, SETUP)
            _wait_cell(page, SETUP)

            # 1. a budget under the floor: the PlanError's content, the button off; then a real budget
            _run_cell(page, PANEL)
            text = _wait_text(page, PANEL, r"No plan fits")
            assert "checkpointing every candidate still peaks at" in text
            assert "Recomputation cannot lower what the step holds regardless" in text
            button = _cell(page, PANEL).locator("button.nbt-run-button")
            assert button.is_disabled()
            floor, baseline = _mib(text, "still peaks at"), _mib(text, "without recomputation it is")
            middle = f"{(floor + baseline) / 2:.2f}"
            _set_budget(page, PANEL, middle)
            # the typed budget, exactly, and a plan for it (a summary of an earlier value may show first)
            _wait_text(page, PANEL, rf"budget {re.escape(middle)} MiB[\s\S]*checkpoint [1-9]\d* of 5 blocks")
            _wait_enabled(button)  # a separate widget message: it can follow the summary's under load

            # 2. clicks on the widgets' subshell thread; a double click and, as soon as the measurement
            #    runs, a training cell: one measurement, on the main thread; the cell waits its turn
            _run_cell(page, ROUTE)
            _wait_text(page, ROUTE, "ROUTED")
            button.dblclick()
            assert button.is_disabled()  # in the page, before the kernel answered
            _wait_text(page, PANEL, r"measuring on the kernel's main thread")
            _run_cell(page, TRAIN)
            _wait_cell(page, TRAIN)
            trained = _text(page, TRAIN)
            assert "TRAINED on MainThread after the measurement: True" in trained
            clicked = re.search(r"CLICKED on \['([^']+)'\] MEASURED on (\w+)", trained)
            assert clicked and clicked.group(1) != "MainThread" and clicked.group(2) == "MainThread", trained
            text = _wait_text(page, PANEL, r"done in")
            result = _cell(page, PANEL).locator(".nbt-optimize-result")
            assert result.count() == 1
            result_text = result.text_content() or ""
            verdict = r"device total peak .* -> .*, (within the budget|over the budget .* by )"
            assert re.search(verdict, result_text)
            assert "step time (median)" in result_text
            assert "StepError" not in text and "Error" not in result_text.split("metric")[0]
            assert not button.is_disabled()

            # 3. the controls move to another plan: the kept result is marked stale, and unmarked
            _set_budget(page, PANEL, f"{baseline + 1:.2f}")
            _wait_text(page, PANEL, r"stale: this result was made for another plan")
            _set_budget(page, PANEL, middle)
            deadline = time.monotonic() + 30
            while "stale" in (result.text_content() or ""):
                assert time.monotonic() < deadline, "the result stayed marked stale"
                page.wait_for_timeout(100)

            # 4. Kernel → Interrupt in the middle of a long measurement
            _run_cell(page, SAVE)
            _wait_cell(page, SAVE)
            _run_cell(page, LONG_PANEL)
            _wait_cell(page, LONG_PANEL)
            _cell(page, LONG_PANEL).locator("button.nbt-run-button").click()
            deadline = time.monotonic() + 240
            while True:  # into the second half: the model compiled, steps timed
                done, _ = _progress(page, LONG_PANEL)
                status = _text(page, LONG_PANEL)
                if done >= 60 and re.search(r"measuring|\(after\)", status):
                    break
                assert time.monotonic() < deadline, f"the long measurement never got to 60%: {status[-800:]}"
                page.wait_for_timeout(50)
            asked = time.monotonic()
            _menu(page, "Kernel", "kernelmenu:interrupt")
            text = _wait_text(page, LONG_PANEL, r"interrupted", timeout_s=30)
            took = time.monotonic() - asked
            print(f"interrupt to 'interrupted' shown: {took:.2f} s")  # the number the issue asks about
            assert took < 1.0, f"the measurement took {took:.2f} s to stop"
            assert "Measured so far:" in text
            stopped_at, _ = _progress(page, LONG_PANEL)
            page.wait_for_timeout(1500)
            assert _progress(page, LONG_PANEL)[0] == stopped_at  # the progress stopped
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "optimize_panel_live.png"), full_page=True)
            _run_cell(page, CHECK)
            _wait_cell(page, CHECK)
            assert "RESTORED True RUNS 2 ['MainThread']" in _text(page, CHECK)

            # 5. saved, kernel gone, page reloaded: the result is still there
            page.keyboard.press("Control+s")
            page.wait_for_timeout(1500)
            _menu(page, "Kernel", "kernelmenu:shutdown")
            accept = page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
            if accept.count():
                accept.click()
            page.wait_for_timeout(1500)
            page.reload()
            page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=120_000)
            page.wait_for_timeout(2000)
            kept = page.locator(".jp-Notebook .nbt-optimize-result")
            assert kept.count() == 1 and "step time (median)" in (kept.text_content() or "")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "optimize_panel.png"), full_page=True)
            all_text = "\n".join(page.locator(".jp-OutputArea-output").all_text_contents())
            assert NOISE not in all_text
        except BaseException:
            page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
            shutil.copy(tmp_path / "failed.png", Path("/tmp/optimize_panel_failed.png"))
            raise
        finally:
            browser.close()
    real_errors = [m for m in console if not any(n in m for n in _OFFLINE_NOISE)]
    assert page_errors == [], page_errors
    # after the kernel is gone, the widget views fail to find their models: that is expected
    assert [m for m in real_errors if "model not found" not in m and "Kernel" not in m] == [], real_errors

    saved = nbformat.read(tmp_path / notebook, as_version=4)
    kept_outputs = [o for o in saved.cells[PANEL].outputs if "nbt-optimize-result" in o.get("data", {}).get(
        "text/html", "")]
    assert len(kept_outputs) == 1 and "OptimizePanel result" in kept_outputs[0]["data"]["text/plain"]
    html = tmp_path / "optimize_panel.html"
    subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", str(tmp_path / notebook)],
                   check=True, capture_output=True, timeout=180)
    exported = html.read_text()
    assert "step time (median)" in exported and "nbt-optimize-result" in exported
    assert re.search(r"within the budget|over the budget", exported)
    assert NOISE not in exported and NOISE not in (tmp_path / notebook).read_text()
