"""nbt.load_compile_log on TORCH_TRACE logs this session records itself (no tlparse data needed).

A small function with two graph breaks (a ``print()`` and a ``.item()``) is compiled with
``torch.compile(backend="eager", dynamic=False)`` in a subprocess with ``TORCH_TRACE`` set, then
called with a second input shape (a recompile of every frame). The expected graphs, breaks and
recompiles follow from that program: the break lines come from ``# BREAK`` markers in its source,
and the counts from how Dynamo splits a frame at a break (one graph before each break, one after
the last), once per input shape.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.compile.figures import compile_time_chart, graph_break_explorer, graph_code_view
from nbtoolkit.compile.report import GraphReport
from tests._python import run_module_function

from ._same_report import assert_same_report

pytestmark = pytest.mark.slow  # the recording runs torch.compile in a subprocess

FIRST_SIZE, SECOND_SIZE = 8, 16
SHAPES = 2  # calls with distinct input sizes: the second one recompiles every frame

COMPILED_MODULE = textwrap.dedent(
    f"""\
    import torch


    def step(x):
        x = torch.relu(x) + 1
        print("inside the compiled step")  # BREAK print
        x = x * 2
        scale = x.abs().max().item()  # BREAK scalar
        return x / (scale + 1)


    def run():
        torch.manual_seed(0)  # .item() becomes a constant of the next graph: the same in every run
        compiled = torch.compile(step, backend="eager", dynamic=False)
        compiled(torch.randn({FIRST_SIZE}))
        compiled(torch.randn({SECOND_SIZE}))  # a recompile: new size, dynamic=False
    """
)


def marked_lines(source: str) -> dict[int, str]:
    """Line number (1-based) -> break category, from the ``# BREAK <category>`` markers."""
    return {
        number: line.split("# BREAK ")[1].strip()
        for number, line in enumerate(source.splitlines(), start=1)
        if "# BREAK " in line
    }


def def_line(source: str, name: str) -> int:
    return next(n for n, line in enumerate(source.splitlines(), start=1) if line.startswith(f"def {name}("))


BREAK_LINES = marked_lines(COMPILED_MODULE)
BREAKS_PER_CALL = len(BREAK_LINES)
GRAPHS_PER_CALL = BREAKS_PER_CALL + 1  # each break ends a graph; the rest after the last break is one more


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the compiled module's file, the TORCH_TRACE folder its run wrote), recorded once per module."""
    folder = tmp_path_factory.mktemp("compile_log")
    module_path = folder / "compiled_step.py"
    module_path.write_text(COMPILED_MODULE)
    log_dir = folder / "torch_trace"
    run_module_function(module_path, env={"TORCH_TRACE": str(log_dir), "OMP_NUM_THREADS": "1"})
    return module_path, log_dir


@pytest.fixture(scope="module")
def module_path(recorded: tuple[Path, Path]) -> Path:
    return recorded[0]


@pytest.fixture(scope="module")
def log_file(recorded: tuple[Path, Path]) -> Path:
    logs = sorted(recorded[1].glob("*.log"))
    assert len(logs) == 1, logs  # one process, one log
    return logs[0]


@pytest.fixture(scope="module")
def report(log_file: Path) -> GraphReport:
    return nbt.load_compile_log(log_file, source_roots=log_file.parent.parent)


def import_compiled_module(module_path: Path) -> ModuleType:
    """The recorded program, imported here from the same file (so user files and lines match)."""
    spec = importlib.util.spec_from_file_location("compiled_step_here", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def live_runs(module_path: Path) -> tuple[Any, GraphReport]:
    """torch._dynamo.explain of one call and nbt.capture_graphs of the whole run, in this process.

    Module-scoped: torch's inactive TORCH_TRACE handler removes itself from its logger on the
    first compile record of the process, which the per-test logging check would report.
    """
    module = import_compiled_module(module_path)
    torch._dynamo.reset()
    try:
        live = nbt.capture_graphs(module.run, steps=0)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(module.step)(torch.randn(FIRST_SIZE))
    finally:
        torch._dynamo.reset()
    return explained, live


# ------------------------------------------------------------------------------------ reading
def test_graphs_one_per_piece_of_each_frame_per_shape(report: GraphReport, module_path: Path) -> None:
    """Each shape compiles the step and its resume functions: breaks + 1 graphs, in the user's file."""
    graphs = report.graphs
    assert len(graphs) == SHAPES * GRAPHS_PER_CALL
    assert set(graphs["file"]) == {str(module_path)}
    assert list(graphs["function"]).count("step") == SHAPES
    first = graphs[graphs["function"] == "step"]
    assert set(first["line"]) == {def_line(COMPILED_MODULE, "step")}
    resumed = graphs[graphs["function"] != "step"]
    assert resumed["function"].str.startswith("torch_dynamo_resume_in_step").all()
    assert (graphs["op_count"] >= 1).all()
    assert graphs["fx_code"].str.contains("class GraphModule").all()
    assert list(graphs["graph"]) == list(range(len(graphs)))


def test_breaks_carry_reason_and_the_users_source_line(report: GraphReport, module_path: Path) -> None:
    """Every break names the user's file, the marked line, its source text, a reason and torch's hints."""
    breaks = report.breaks
    assert len(breaks) == SHAPES * BREAKS_PER_CALL
    assert set(breaks["user_file"]) == {str(module_path)}
    assert set(breaks["user_function"]) == {"step"}
    assert sorted(breaks["user_line"]) == sorted(list(BREAK_LINES) * SHAPES)
    source = COMPILED_MODULE.splitlines()
    for row in breaks.itertuples(index=False):
        assert row.source_line == source[row.user_line - 1].strip()
        assert re.search(rf"^>\s*{row.user_line} \|", row.source_context, re.MULTILINE)
        assert row.reason and row.explanation and row.hints
        assert row.gb_id.startswith("GB")
    item_break = breaks[breaks["user_line"] == _line_of("scalar")]
    assert item_break["gb_type"].str.contains("Tensor.item()", regex=False).all()
    assert item_break["hints"].str.contains("capture_scalar_outputs").all()
    print_break = breaks[breaks["user_line"] == _line_of("print")]
    assert print_break["explanation"].str.contains("print").all()


def _line_of(category: str) -> int:
    return next(line for line, marked in BREAK_LINES.items() if marked == category)


def test_break_summary_counts_each_distinct_break_once_per_shape(report: GraphReport) -> None:
    """Two distinct breaks, each hit once per shape, classified with the right fix."""
    summary = report.break_summary()
    assert dict(zip(summary["user_line"], summary["category"], strict=True)) == BREAK_LINES
    assert set(summary["count"]) == {SHAPES}
    fixes = dict(zip(summary["category"], summary["fix"], strict=True))
    assert "capture_scalar_outputs = True" in fixes["scalar"]
    assert "reorderable_logging_functions" in fixes["print"]


def test_recompiles_name_the_failed_size_guard(report: GraphReport) -> None:
    """The second shape recompiles every frame; each recompile names the size guard that failed."""
    recompiles = report.recompiles
    assert len(recompiles) == GRAPHS_PER_CALL  # the step and each resume function
    assert set(recompiles["function"]) == set(report.graphs["function"])
    for row in recompiles.itertuples(index=False):
        frame = row.compile_id.split("/")[0]
        assert row.compile_id == f"{frame}/1" and row.previous_compile_id == f"{frame}/0"
        assert "size mismatch" in row.failed_guard
        assert f"expected {FIRST_SIZE}, actual {SECOND_SIZE}" in row.failed_guard
    assert f"expected {FIRST_SIZE}, actual {SECOND_SIZE}" in repr(report)


def test_every_break_restarts_a_compile_and_nothing_fails(report: GraphReport) -> None:
    """A break restarts the frame's analysis (a 'break' compile); the last piece compiles 'ok'."""
    assert report.restarts == len(report.breaks)
    assert report.compile_failures.empty and report.frames_given_up.empty and report.error is None
    statuses = report.compiles["status"].value_counts().to_dict()
    assert statuses == {"break": SHAPES * BREAKS_PER_CALL, "ok": SHAPES}
    assert report.compile_time_s == pytest.approx(report.compiles["compile_time_s"].sum())
    assert report.compile_time_s > 0
    ids = [c for c in report.compile_ids if c != "-/-"]
    assert set(report.graphs["compile_id"]) <= set(ids)
    assert set(report.recompiles["compile_id"]) <= {c.split("_")[0] for c in ids}


def test_folder_reads_like_its_file_and_skips_stray_files(
    recorded: tuple[Path, Path], log_file: Path, report: GraphReport, tmp_path: Path
) -> None:
    """The TORCH_TRACE folder gives the file's report; non-log and empty files are skipped with a note."""
    roots = recorded[0].parent
    from_folder = nbt.load_compile_log(recorded[1], source_roots=roots)
    messy = tmp_path / "messy"
    messy.mkdir()
    shutil.copy(log_file, messy / log_file.name)
    (messy / "README.txt").write_text("not a log")
    (messy / "empty.log").write_text("")
    from_messy = nbt.load_compile_log(messy, source_roots=[roots])
    for folder_report in (from_folder, from_messy):
        assert folder_report.compile_ids == report.compile_ids
        for name in ("graphs", "breaks", "recompiles", "failures", "compiles"):
            pd.testing.assert_frame_equal(getattr(folder_report, name), getattr(report, name))
    assert any("README.txt" in note for note in from_messy.notes)
    assert any("empty.log" in note for note in from_messy.notes)


def test_save_load_round_trip(report: GraphReport, tmp_path: Path) -> None:
    """GraphReport.save then load gives the same frames, ids, text and HTML."""
    again = GraphReport.load(report.save(tmp_path / "saved"))
    for name in ("graphs", "breaks", "recompiles", "failures", "compiles"):
        pd.testing.assert_frame_equal(getattr(again, name), getattr(report, name))
    assert again.compile_ids == report.compile_ids and again.source == report.source
    assert repr(again) == repr(report)
    assert again._repr_html_() == report._repr_html_()


# -------------------------------------------------------------------------------------- views
def test_compile_time_chart_has_one_bar_per_compile(report: GraphReport) -> None:
    """One bar per finished compile, grouped by status, heights in ms, the total in the title."""
    fig = compile_time_chart(report)
    assert {bar.name for bar in fig.data} == set(report.compiles["status"])
    assert sum(len(bar.x) for bar in fig.data) == len(report.compiles)
    heights = sorted(y for bar in fig.data for y in bar.y)
    assert heights == pytest.approx(sorted(report.compiles["compile_time_s"] * 1e3))
    assert f"{report.compile_time_s:,.2f} s" in fig.layout.title.text
    assert len(report._report_figures()) == 1


def test_explorer_and_code_view_of_the_recorded_breaks(report: GraphReport) -> None:
    """The explorer lists both breaks with their escaped source and fix; the code view every graph."""
    box = graph_break_explorer(report)
    options = box.nbt_select.options
    assert len(options) == BREAKS_PER_CALL
    shown_lines = []
    for label, value in options:
        line = int(label.split(" @ ")[1].split(":")[1].split()[0])
        shown_lines.append(line)
        box.nbt_select.value = value
        page = box.nbt_detail.value
        source_line = COMPILED_MODULE.splitlines()[line - 1].strip()
        assert source_line.replace('"', "&quot;") in page
        assert "Fix:" in page and "graph before the break" in page
    assert sorted(shown_lines) == sorted(BREAK_LINES)
    view = graph_code_view(report)
    assert len(view.nbt_dropdown.options) == len(report.graphs)
    first = view.nbt_code.value
    view.nbt_dropdown.value = view.nbt_dropdown.options[-1][1]
    assert view.nbt_code.value != first and "class GraphModule" in view.nbt_code.value
    bundle = report._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert f"graph breaks: {SHAPES * BREAKS_PER_CALL} ({BREAKS_PER_CALL} distinct)" in bundle["text/plain"]


def test_compile_log_magic_reads_the_recorded_folder(
    shell: InteractiveShell, recorded: tuple[Path, Path], report: GraphReport
) -> None:
    """%nbt compile-log PATH --source-root DIR gives the report load_compile_log gives, under --name.

    Without --source-root no source file is read (the log may come from elsewhere): the breaks
    keep the source line torch logged, and a note says how to get the context.
    """
    shell.run_line_magic(
        "nbt", f"compile-log {recorded[1]} --source-root {recorded[0].parent} --name recorded_log"
    )
    from_magic: Any = shell.user_ns["recorded_log"]
    assert isinstance(from_magic, GraphReport)
    for name in ("graphs", "breaks", "recompiles"):
        pd.testing.assert_frame_equal(getattr(from_magic, name), getattr(report, name))
    shell.run_line_magic("nbt", f"compile-log {recorded[1]} --name no_roots")
    bare: Any = shell.user_ns["no_roots"]
    assert (bare.breaks["source_context"] == "").all()
    assert list(bare.breaks["source_line"]) == list(report.breaks["source_line"])
    assert any("source_roots=" in note for note in bare.notes)


# ------------------------------------------------------------------------- against live torch
def test_graph_and_break_counts_equal_dynamo_explain(
    report: GraphReport, module_path: Path, live_runs: tuple[Any, GraphReport]
) -> None:
    """torch._dynamo.explain of one call gives the graphs and breaks the log has for the first shape."""
    explained, _ = live_runs
    first_shape = report.breaks[report.breaks["frame_compile_id"] == 0]
    assert explained.graph_count == (report.graphs["frame_compile_id"] == 0).sum() == GRAPHS_PER_CALL
    assert explained.graph_break_count == len(first_shape) == BREAKS_PER_CALL
    assert sorted(r.user_stack[-1].lineno for r in explained.break_reasons) == sorted(
        first_shape["user_line"]
    )
    assert {r.user_stack[-1].filename for r in explained.break_reasons} == {str(module_path)}


def test_live_capture_of_the_same_program_gives_the_same_report(
    report: GraphReport, live_runs: tuple[Any, GraphReport]
) -> None:
    """nbt.capture_graphs of the same run in this process equals what TORCH_TRACE wrote."""
    _, live = live_runs
    assert_same_report(live, report)
