"""A real JupyterLab server on loopback and a real Debian chromium driven by Playwright.

Used by the browser tests: start ``jupyter lab`` on 127.0.0.1 with a random token in a
temporary root, open a notebook, run all its cells through JupyterLab's own menu, and
report what the page shows (rendered plotly figures, widgets, errors in the console).
Never lets Playwright download a browser: it launches /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Flags for a root, headless, offline chromium (see the machine notes: without the
# background-networking flags it keeps trying to reach Google's hosts).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LabServer:
    url: str
    token: str
    root: Path
    process: subprocess.Popen[bytes]
    log: Path


@contextlib.contextmanager
def jupyterlab(root: Path, timeout_s: float = 90.0) -> Iterator[LabServer]:
    """A JupyterLab server serving ``root`` on 127.0.0.1; stopped on exit."""
    port, token = _free_port(), secrets.token_hex(16)
    log = root / "jupyterlab.log"
    # Private settings and workspaces: no "get Jupyter news?" popup over the screenshot,
    # and nothing written into the user's own JupyterLab state.
    settings = root / ".lab-settings"
    notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True, exist_ok=True)
    notification.write_text('{"fetchNews": "false", "checkForUpdates": false}')
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--ServerApp.open_browser=False", "--allow-root",
        f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={root / '.lab-workspaces'}",
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited early:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer in {timeout_s} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield LabServer(url=url, token=token, root=root, process=process, log=log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class PageReport:
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    plotly_figures: int = 0
    widgets: int = 0
    error_outputs: list[str] = field(default_factory=list)
    nbt_outputs: int = 0
    output_text: str = ""  # the text of every cell output, as the page shows it
    screenshot: Path | None = None


def open_and_run_all(page: Any, server: LabServer, notebook: str, timeout_s: float = 600.0) -> None:
    """Open ``notebook`` in JupyterLab on ``page``, Run All Cells, and wait until every cell ran."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{server.url}/lab/tree/{notebook}?token={server.token}", timeout=120_000)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=120_000)
    # JupyterLab may ask which kernel to start (when a session of the notebook exists):
    # accept its preselected choice, then wait until the kernel is connected and idle.
    accept = page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
    try:
        accept.wait_for(timeout=5_000)
        accept.click()
    except PlaywrightTimeout:
        pass
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    page.click("li.lm-MenuBar-item:has-text('Run')")
    page.click("li.lm-Menu-item[data-command='runmenu:run-all']")
    # Every code cell gets an execution count once it ran; "[*]" means still running.
    deadline = time.monotonic() + timeout_s
    while True:
        pending = page.evaluate(
            """() => Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'))
                      .filter(p => p.textContent.trim() === '[ ]:' || p.textContent.includes('*'))
                      .length"""
        )
        if pending == 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{pending} cells still pending after {timeout_s} s")
        time.sleep(1.0)


def run_notebook_in_browser(
    server: LabServer, notebook: str, screenshot: Path, timeout_s: float = 600.0
) -> PageReport:
    """Open ``notebook`` in JupyterLab, Run All Cells, wait for the kernel, and inspect the page."""
    from playwright.sync_api import sync_playwright

    report = PageReport()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.on("console", lambda m: report.console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: report.page_errors.append(str(e)))
            open_and_run_all(page, server, notebook, timeout_s)
            page.wait_for_timeout(3000)  # let figures and widgets finish rendering
            report.plotly_figures = page.locator(
                ".jp-OutputArea-output:has(svg.main-svg)"
            ).count()
            report.widgets = page.locator(".jp-OutputArea-output .jupyter-widgets").count()
            report.nbt_outputs = page.locator(".jp-OutputArea-output .nbt-table").count()
            # textContent, not innerText: JupyterLab hides cells scrolled out of view (windowed
            # notebook), and a hidden element's innerText is empty although its output is there.
            report.output_text = "\n".join(page.locator(".jp-OutputArea-output").all_text_contents())
            stderr = page.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']")
            report.error_outputs = [
                text for text in (stderr.nth(i).inner_text() for i in range(stderr.count()))
                if "Traceback" in text or "Error" in text
            ]
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
            report.screenshot = screenshot
        finally:
            browser.close()
    return report
