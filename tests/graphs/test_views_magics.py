"""Graph views (break explorer, FX code, compile-time chart) and %%nbt graphs / %nbt compile-log."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.compile.figures import compile_time_chart, graph_break_explorer, graph_code_view
from nbtoolkit.compile.report import GraphReport


def step_evil(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    print("<script>alert(1)</script>")
    x = x * 2
    y = x.sum().item()
    return x * y


@pytest.fixture(scope="module")
def evil_report() -> GraphReport:
    torch._dynamo.reset()
    report = nbt.capture_graphs(torch.compile(step_evil, backend="eager"), torch.randn(8), steps=1)
    torch._dynamo.reset()
    return report


def test_explorer_shows_ranked_breaks_and_escapes_user_source(evil_report: GraphReport) -> None:
    box = graph_break_explorer(evil_report)
    options = box.nbt_select.options
    assert len(options) == 2
    pages = []
    for _, value in options:
        box.nbt_select.value = value
        pages.append(box.nbt_detail.value)
    page = "".join(pages) + box.children[0].value
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "capture_scalar_outputs" in page  # the fix of the .item() break
    assert "graph before the break" in page and "class GraphModule" in page
    assert "https://meta-pytorch.github.io/compile-graph-break-site/gb/gb" in page


def test_explorer_and_code_view_carry_a_static_form_beside_the_widget(evil_report: GraphReport) -> None:
    """Without a kernel (nbconvert's HTML, a reopened notebook) the bundle's text/html shows: every
    break with its details, the one selected when it was displayed open; every graph's code."""
    box = graph_break_explorer(evil_report)
    box.nbt_select.value = box.nbt_select.options[1][1]
    data = box._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    html = data["text/html"]
    assert html.count("<details") >= len(box.nbt_select.options)
    opened = re.findall(r"<details open><summary>([^<]*)</summary>", html)
    assert len(opened) == 1 and box.nbt_select.options[1][0].split(" @ ")[0] in opened[0]
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    code = graph_code_view(evil_report)._repr_mimebundle_()["text/html"]
    assert code.count("class GraphModule") == len(evil_report.graphs)


def test_report_html_escapes_and_text_has_units(evil_report: GraphReport) -> None:
    html = evil_report._repr_html_()
    assert "<script>alert" not in html and "&lt;script&gt;" in html
    text = repr(evil_report)
    assert " ms" in text or " µs" in text


def test_graph_code_view_switches_graphs(evil_report: GraphReport) -> None:
    view = graph_code_view(evil_report)
    assert len(view.nbt_dropdown.options) == len(evil_report.graphs) == 3
    first = view.nbt_code.value
    view.nbt_dropdown.value = view.nbt_dropdown.options[-1][1]
    assert view.nbt_code.value != first and "class GraphModule" in view.nbt_code.value


def test_compile_time_chart_of_multi_rank_logs(real_data: Callable[[str], Path]) -> None:
    report = nbt.load_compile_log(real_data("compile_logs/tlparse_inputs/multi_rank_logs"))
    fig = compile_time_chart(report)
    names = {trace.name for trace in fig.data}
    assert names == {"ok", "error"}
    bars = sum(len(trace.x) for trace in fig.data)
    assert bars == len(report.compiles) == 24
    assert "compile time (ms)" in fig.layout.yaxis.title.text


def test_report_view_shortcuts(evil_report: GraphReport) -> None:
    assert len(evil_report.code_view().nbt_dropdown.options) == 3
    assert len(evil_report.compile_time_chart().data) >= 1


def test_explorer_of_a_report_without_breaks(real_data: Callable[[str], Path]) -> None:
    report = nbt.load_compile_log(real_data("compile_logs/tlparse_inputs/simple.log"))
    box = report.explorer()
    assert "No graph breaks" in box.children[-1].value


def torch_settings_snapshot() -> dict[str, Any]:
    """The trace logger, torch's log settings, dynamo config and compiler stance."""
    import logging

    trace = logging.getLogger("torch.__trace")
    return {
        "trace": (tuple(trace.handlers), trace.level, trace.propagate, trace.disabled, tuple(trace.filters)),
        "dynamo_config": torch._dynamo.config.get_config_copy(),
        "stance": torch._dynamo.eval_frame._stance,
        "log_state": dict(torch._logging._internal.log_state.log_qname_to_level),
    }


CELL = """\
import torch
def cell_step(x):
    x = x + 1
    print("in the cell")
    return x * 2
compiled = torch.compile(cell_step, backend="eager")
compiled(torch.randn(4))
"""


def test_graphs_cell_magic_reports_breaks_with_cell_source(shell: InteractiveShell) -> None:
    torch._dynamo.reset()
    shell.run_cell_magic("nbt", "graphs --steps 1 --no-eager --name graphs_rep", CELL)
    report = shell.user_ns["graphs_rep"]
    assert isinstance(report, GraphReport)
    assert len(report.graphs) == 2 and len(report.breaks) == 1
    row = report.breaks.iloc[0]
    assert row["user_file"] == "<nbt-cell>" and row["user_line"] == 4
    assert row["source_line"] == 'print("in the cell")'
    assert report.step_time_s is not None and report.eager_step_time_s is None
    torch._dynamo.reset()


def test_graphs_cell_magic_survives_an_exception_in_the_cell(shell: InteractiveShell) -> None:
    before = torch_settings_snapshot()
    result = shell.run_cell("%%nbt graphs --name failing_rep\nraise RuntimeError('cell failed')\n")
    assert result.error_in_exec is None  # the report carries the error; the kernel goes on
    assert "RuntimeError: cell failed" in shell.user_ns["failing_rep"].error
    assert torch_settings_snapshot() == before


def test_graphs_cell_magic_ctrl_c(shell: InteractiveShell) -> None:
    before = torch_settings_snapshot()
    result = shell.run_cell("%%nbt graphs\nraise KeyboardInterrupt\n")
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert torch_settings_snapshot() == before
    assert shell.run_cell("1 + 1").result == 2


def test_compile_log_magic(shell: InteractiveShell, real_data: Callable[[str], Path]) -> None:
    path = real_data("compile_logs/tlparse_inputs/comp_failure.log")
    shell.run_line_magic("nbt", f"compile-log {path} --name log_rep")
    report: Any = shell.user_ns["log_rep"]
    assert list(report.compile_failures["failure_type"]) == ["BackendCompilerFailed"]
    with pytest.raises(nbt.CompileLogError, match="not found"):
        shell.run_line_magic("nbt", "compile-log /nonexistent/trace.log")


def test_nbt_report_embeds_the_compile_chart_and_escapes(evil_report: GraphReport, tmp_path: Path) -> None:
    out = nbt.report(evil_report, path=tmp_path / "graphs.html")
    page = Path(out.path).read_text()
    assert "Compile time per compile" in page
    assert "<script>alert(1)</script>" not in page
