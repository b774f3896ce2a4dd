"""Every figure or widget a magic shows also carries a static form (issue 39).

What a magic displays is captured as the kernel would publish it (``display_pub``), with plotly's
renderer set as in a Jupyter kernel (``plotly_mimetype``: JSON only, which nbconvert's HTML cannot
show). Each output holding a plotly figure or a widget view must hold ``text/html`` with a drawn
SVG beside it: that is what nbconvert's HTML, GitHub and a notebook without its kernel show.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import display

FIGURE = "application/vnd.plotly.v1+json"
WIDGET = "application/vnd.jupyter.widget-view+json"
DRAWN = re.compile(r"<(path|polygon|rect|image|circle) ")

FRAMES = [{"name": "forward", "filename": "/home/u/train.py", "line": 3}]
SNAPSHOT: dict[str, Any] = {
    "segments": [
        {"device": 0, "address": 4096, "total_size": 8192, "stream": 0,
         "blocks": [{"address": 4096, "size": 4096, "requested_size": 4000, "state": "active_allocated",
                     "frames": FRAMES},
                    {"address": 8192, "size": 4096, "requested_size": 4096, "state": "inactive",
                     "frames": []}]}
    ],
    "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": 4000, "time_us": 5, "frames": FRAMES},
        {"action": "alloc", "addr": 8192, "size": 4096, "time_us": 9, "frames": FRAMES},
        {"action": "free_requested", "addr": 8192, "size": 4096, "time_us": 20, "frames": FRAMES},
    ]],
}  # fmt: skip


@pytest.fixture(autouse=True)
def kernel_renderer(monkeypatch: pytest.MonkeyPatch) -> None:
    """plotly's renderer as a Jupyter kernel sets it: the figure's JSON and nothing else."""
    import plotly.io as pio

    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")


@contextmanager
def published(shell: InteractiveShell) -> Iterator[list[dict[str, Any]]]:
    """The data of every display the code inside publishes, in order."""
    seen: list[dict[str, Any]] = []
    original = shell.display_pub.publish

    def publish(data: dict[str, Any], metadata: Any = None, **kwargs: Any) -> None:
        seen.append(dict(data))

    shell.display_pub.publish = publish  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        shell.display_pub.publish = original  # type: ignore[method-assign]


def shown(shell: InteractiveShell, run: Callable[[], Any]) -> list[dict[str, Any]]:
    """What a notebook shows for a magic: its own displays, then its result's (the cell's value)."""
    with published(shell) as seen:
        result = run()
        if result is not None:
            display(result)
    return seen


def assert_every_figure_is_static(outputs: list[dict[str, Any]], *, figures: int) -> None:
    pictures = [data for data in outputs if FIGURE in data or WIDGET in data]
    assert len(pictures) == figures, [sorted(d) for d in outputs]
    for data in pictures:
        html = data.get("text/html", "")
        assert html.count("<svg") == html.count("</svg>") >= 1, sorted(data)
        assert DRAWN.search(html), html[:300]  # something drawn, not an empty frame


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
         "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 40},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 60, "dur": 20},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 15, "dur": 30,
         "args": {"stream": 7, "device": 0, "correlation": 1}},
    ]  # fmt: skip
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.fixture
def snapshot_file(tmp_path: Path) -> Path:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(SNAPSHOT))
    return path


STEP = (
    "import torch\n"
    "def step():\n"
    "    weight = torch.ones(64, 32, requires_grad=True)\n"
    "    (torch.ones(16, 64) @ weight).sum().backward()\n"
)


@pytest.mark.parametrize("mode", ["--static", "--widget"])
def test_trace_magic_shows_its_timeline_and_overlap_chart_with_static_forms(
    shell: InteractiveShell, trace_file: Path, mode: str
) -> None:
    outputs = shown(shell, lambda: shell.run_line_magic("nbt", f"trace {trace_file} {mode}"))
    # the static timeline figure, or the widget (with its SVG overview); the overlap chart
    assert_every_figure_is_static(outputs, figures=2)
    assert (WIDGET in outputs[1]) == (mode == "--widget")


@pytest.mark.parametrize("mode", ["--static", "--widget"])
def test_memory_magic_shows_its_timeline_with_a_static_form(shell: InteractiveShell, mode: str) -> None:
    shell.run_cell(STEP).raise_error()
    outputs = shown(shell, lambda: shell.run_cell_magic("nbt", f"memory {mode}", "step()\n"))
    assert_every_figure_is_static(outputs, figures=1)
    assert "text/html" in outputs[-1] and "MemoryTimeline" in outputs[-1]["text/plain"]  # the summary


def test_memory_magic_without_a_figure(shell: InteractiveShell) -> None:
    shell.run_cell(STEP).raise_error()
    outputs = shown(shell, lambda: shell.run_cell_magic("nbt", "memory --static --no-figure", "step()\n"))
    assert_every_figure_is_static(outputs, figures=0)
    assert len(outputs) == 1  # the summary alone


@pytest.mark.parametrize("mode", ["--static", "--widget"])
def test_snapshot_magic_shows_the_history_timeline_with_a_static_form(
    shell: InteractiveShell, snapshot_file: Path, mode: str
) -> None:
    outputs = shown(shell, lambda: shell.run_line_magic("nbt", f"snapshot {snapshot_file} {mode}"))
    assert_every_figure_is_static(outputs, figures=1)


def test_snapshot_magic_without_history_shows_its_summary_only(
    shell: InteractiveShell, snapshot_file: Path
) -> None:
    outputs = shown(shell, lambda: shell.run_line_magic("nbt", f"snapshot {snapshot_file} --no-history"))
    assert_every_figure_is_static(outputs, figures=0)
    assert len(outputs) == 1 and "text/html" in outputs[0]


def test_a_figure_shown_in_a_cell_carries_its_static_form(shell: InteractiveShell, trace_file: Path) -> None:
    """``tr.figure()``-style cells: the figure functions' results display with their SVG too."""
    import nbtoolkit as nbt
    from nbtoolkit.trace.views import overlap_chart

    trace = nbt.load_trace(trace_file)
    outputs = shown(shell, lambda: overlap_chart(trace))
    assert_every_figure_is_static(outputs, figures=1)
    assert FIGURE in outputs[0]  # plotly's own output stays: interactive where plotly.js runs
