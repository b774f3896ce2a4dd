"""capture_graphs on real torch.compile: counts equal torch._dynamo.explain, user lines, costs, cleanup."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.compile.report import GraphReport

from ._same_report import assert_same_report

log = logging.getLogger("nbt_test_graphs")


def step_with_breaks(x: torch.Tensor) -> torch.Tensor:
    x = torch.relu(x) + 1
    print("step")  # BREAK print
    x = x * 2
    scale = x.abs().max().item()  # BREAK scalar
    x = x / (scale + 1)
    if x.sum() > 0:  # BREAK control_flow
        x = x + 1
    x = x - 0.5
    torch._dynamo.graph_break()  # BREAK graph_break_call
    x = x.sin()
    _ = time.time()  # BREAK unsupported_call
    x = x.cos()
    _ = np.frombuffer(b"abcd", dtype=np.uint8)  # BREAK numpy
    x = x.exp()
    log.info("x")  # BREAK logging
    return x.sum()


def step_fixed(x: torch.Tensor) -> torch.Tensor:
    x = torch.relu(x) + 1
    x = x * 2
    scale = x.abs().max()
    x = x / (scale + 1)
    x = torch.where(x.sum() > 0, x + 1, x)
    x = x - 0.5
    x = x.sin().cos().exp()
    return x.sum()


def _marked_lines(fn: Any) -> dict[int, str]:
    """Line number -> expected break category, from the `# BREAK <category>` markers."""
    lines, first = inspect.getsourcelines(fn)
    return {
        first + i: line.split("# BREAK ")[1].strip() for i, line in enumerate(lines) if "# BREAK " in line
    }


def torch_settings() -> dict[str, Any]:
    """Everything capture_graphs could disturb: trace logger, torch loggers, dynamo config, stance."""
    trace = logging.getLogger("torch.__trace")
    state: dict[str, Any] = {
        "trace_handlers": tuple(trace.handlers),
        "trace_level": trace.level,
        "trace_propagate": trace.propagate,
        "trace_disabled": trace.disabled,
        "trace_filters": tuple(trace.filters),
        "dynamo_config": torch._dynamo.config.get_config_copy(),
        "stance": torch._dynamo.eval_frame._stance,
        "log_state": dict(torch._logging._internal.log_state.log_qname_to_level),
        "artifacts": set(torch._logging._internal.log_state.artifact_names),
    }
    for name in ("torch", "torch._dynamo", "torch._inductor", "torch._logging.structured"):
        lg = logging.getLogger(name)
        state[name] = (tuple(lg.handlers), lg.level, lg.propagate)
    return state


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def captured() -> tuple[GraphReport, Any]:
    torch._dynamo.reset()
    x = torch.randn(64)
    compiled = torch.compile(step_with_breaks, backend="eager")
    report = nbt.capture_graphs(compiled, x, steps=2)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step_with_breaks)(x)
    torch._dynamo.reset()
    return report, explained


def test_graph_and_break_counts_equal_dynamo_explain(captured: tuple[GraphReport, Any]) -> None:
    report, explained = captured
    assert len(report.graphs) == explained.graph_count == 8
    assert len(report.breaks) == explained.graph_break_count == 7


def test_every_break_carries_its_user_line(captured: tuple[GraphReport, Any]) -> None:
    report, explained = captured
    expected = _marked_lines(step_with_breaks)
    file = inspect.getsourcefile(step_with_breaks)
    assert sorted(report.breaks["user_line"].tolist()) == sorted(expected)
    assert set(report.breaks["user_file"]) == {file}
    assert set(report.breaks["user_function"]) == {"step_with_breaks"}
    explain_lines = sorted(r.user_stack[-1].lineno for r in explained.break_reasons)
    assert sorted(report.breaks["user_line"].tolist()) == explain_lines
    for row in report.breaks.itertuples(index=False):
        assert f"# BREAK {expected[row.user_line]}" in row.source_line
        assert f"> {row.user_line} |" in row.source_context


def test_breaks_have_type_id_explanation_hints_and_registry_link(captured: tuple[GraphReport, Any]) -> None:
    report, _ = captured
    for row in report.breaks.itertuples(index=False):
        assert row.gb_type and row.explanation and row.hints
        assert row.gb_id and row.gb_id.startswith("GB")
        number = row.gb_id[2:]
        assert row.doc_url == f"https://meta-pytorch.github.io/compile-graph-break-site/gb/gb{number}.html"
    item = report.breaks[report.breaks["gb_type"].str.contains("Tensor.item()", regex=False)]
    assert len(item) == 1 and "capture_scalar_outputs" in item["hints"].iloc[0]


def test_summary_classifies_each_kind_and_gives_the_right_fix(captured: tuple[GraphReport, Any]) -> None:
    report, _ = captured
    summary = report.break_summary()
    expected = _marked_lines(step_with_breaks)
    got = dict(zip(summary["user_line"].tolist(), summary["category"].tolist(), strict=True))
    assert got == expected
    fixes = dict(zip(summary["category"], summary["fix"], strict=True))
    assert "capture_scalar_outputs = True" in fixes["scalar"]
    assert "reorderable_logging_functions" in fixes["print"]
    assert "torch.cond" in fixes["control_flow"]
    assert "graph_break()" in fixes["graph_break_call"]
    assert "ignore_logging_functions" in fixes["logging"]
    assert "torch op" in fixes["numpy"]
    assert "outside the compiled step" in fixes["unsupported_call"]


def test_graphs_have_compile_ids_functions_op_counts_and_code(captured: tuple[GraphReport, Any]) -> None:
    report, _ = captured
    graphs = report.graphs
    assert graphs["function"].iloc[0] == "step_with_breaks"
    assert graphs["function"].iloc[1:].str.startswith("torch_dynamo_resume_in_step_with_breaks").all()
    assert (graphs["op_count"] >= 1).all()
    assert (graphs["compile_time_s"] > 0).all()
    assert graphs["fx_code"].str.contains("class GraphModule").all()
    assert list(graphs["compile_id"].str.split("_").str[0]) == [f"{i}/0" for i in range(8)]
    # each break was logged in the compile whose graph it ended
    assert set(report.breaks["frame_id"]) == set(range(7))


def test_step_times_and_break_costs_are_measured(captured: tuple[GraphReport, Any]) -> None:
    report, _ = captured
    assert report.first_call_s and report.step_time_s and report.eager_step_time_s
    assert report.first_call_s > report.step_time_s
    assert (report.breaks["eager_us_per_step"] > 0).all()
    assert report.profiled_step_time_s is not None and report.eager_between_graphs_s is not None
    assert 0 < report.eager_between_graphs_s < report.profiled_step_time_s
    text = repr(report)
    assert "µs/step eager" in text and "step time eager" in text


def heavy_eager(x: torch.Tensor) -> torch.Tensor:
    for _ in range(30):
        x = torch.tanh(x @ x)
    return x


heavy_disabled = torch.compiler.disable(heavy_eager)


def step_with_a_costly_break(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    print("cheap")  # a cheap break
    x = x * 2
    x = heavy_disabled(x)  # an expensive break: 30 matmuls run eagerly
    return x.sum()


def test_costly_break_ranks_first() -> None:
    x = torch.randn(128, 128)
    report = nbt.capture_graphs(
        torch.compile(step_with_a_costly_break, backend="eager"), x, steps=2, eager_baseline=False
    )
    summary = report.break_summary()
    assert len(summary) == 2
    assert summary["category"].tolist() == ["disabled", "print"]
    assert summary["eager_us_per_step"].iloc[0] > 5 * summary["eager_us_per_step"].iloc[1]


@pytest.fixture(scope="module")
def inductor_captured() -> tuple[GraphReport, Any]:
    # module scope: set up before the per-test logging snapshot, because compiling outside
    # capture_graphs (explain) lets torch's idle LazyTraceHandler remove itself under pytest
    torch._dynamo.reset()
    x = torch.randn(128, 128)
    report = nbt.capture_graphs(torch.compile(step_with_a_costly_break), x, steps=2, eager_baseline=False)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step_with_a_costly_break)(x)
    torch._dynamo.reset()
    return report, explained


@pytest.mark.slow
def test_costs_with_inductor_use_its_graph_call_marker(inductor_captured: tuple[GraphReport, Any]) -> None:
    """Inductor graphs run inside `## Call CompiledFxGraph ##` ranges: the graph's end is exact."""
    report, explained = inductor_captured
    assert len(report.graphs) == explained.graph_count == 3
    assert len(report.breaks) == explained.graph_break_count == 2
    summary = report.break_summary()
    assert summary["category"].tolist() == ["disabled", "print"]
    assert summary["eager_us_per_step"].iloc[0] > 5 * summary["eager_us_per_step"].iloc[1] > 0


def test_recompile_records_the_failed_guard() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    compiled = torch.compile(f, backend="eager", dynamic=False)

    def run() -> None:
        compiled(torch.randn(4))
        compiled(torch.randn(5))

    report = nbt.capture_graphs(run, steps=0)
    assert len(report.graphs) == 2
    assert list(report.recompiles["compile_id"]) == ["0/1"]
    row = report.recompiles.iloc[0]
    assert row["previous_compile_id"] == "0/0"
    assert "size mismatch at index 0" in row["failed_guard"] and "expected 4, actual 5" in row["failed_guard"]
    assert row["function"] == "f"


def broken_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    raise RuntimeError("broken backend <script>")


def interrupting_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    raise KeyboardInterrupt


def test_backend_failure_is_reported_and_settings_restored() -> None:
    before = torch_settings()
    compiled = torch.compile(lambda x: x.sin() + 1, backend=broken_backend)
    report = nbt.capture_graphs(compiled, torch.randn(4))
    assert torch_settings() == before
    assert report.error is not None and "broken backend" in report.error
    failures = report.compile_failures
    assert list(failures["failure_type"]) == ["BackendCompilerFailed"]
    assert "broken backend" in failures["description"].iloc[0]
    html = report._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_backend_failure_can_be_raised() -> None:
    before = torch_settings()
    compiled = torch.compile(lambda x: x.sin() + 1, backend=broken_backend)
    with pytest.raises(Exception, match="broken backend"):
        nbt.capture_graphs(compiled, torch.randn(4), raise_errors=True)
    assert torch_settings() == before


def test_exception_in_the_code_is_recorded() -> None:
    before = torch_settings()

    def step(x: torch.Tensor) -> torch.Tensor:
        y = torch.compile(lambda t: t * 2, backend="eager")(x)
        raise ValueError("bad step")
        return y  # pragma: no cover

    report = nbt.capture_graphs(step, torch.randn(3))
    assert torch_settings() == before
    assert report.error == "ValueError: bad step"
    assert len(report.graphs) == 1  # what compiled before the error is kept


def test_keyboard_interrupt_inside_the_function_restores_everything() -> None:
    before = torch_settings()
    calls = []

    def f(x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        calls.append(1)
        if len(calls) == 2:  # the first timed step: Ctrl-C after compiling
            raise KeyboardInterrupt
        return x * 2

    compiled = torch.compile(f, backend="eager")
    with pytest.raises(KeyboardInterrupt):
        nbt.capture_graphs(compiled, torch.randn(3))
    assert torch_settings() == before
    # the kernel goes on: the next capture works
    torch._dynamo.reset()
    report = nbt.capture_graphs(
        torch.compile(lambda x: x.cos() * 3, backend="eager"), torch.randn(3), steps=1
    )
    assert len(report.graphs) == 1 and report.error is None
    assert torch_settings() == before


@pytest.mark.parametrize(
    ("interrupt_at", "phase"),
    [
        (1, "first call"),
        (2, "eager warm-up"),
        (3, "eager timed"),
        (4, "compiled timed"),
        (7, "profiled"),
        (9, "profiled"),
    ],
)
def test_keyboard_interrupt_in_every_phase_restores_everything(interrupt_at: int, phase: str) -> None:
    """steps=2 calls fn: 1 first call, 2 eager warm-up, 3-6 eager and compiled interleaved, 7-9 profiled."""
    before = torch_settings()
    calls: list[int] = []

    def step(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return compiled(x)

    compiled = torch.compile(lambda t: torch.relu(t) * 2, backend="eager")
    with pytest.raises(KeyboardInterrupt):
        nbt.capture_graphs(step, torch.randn(3), steps=2)
    assert len(calls) == interrupt_at, phase
    assert torch_settings() == before  # includes the compiler stance set for the eager baseline
    assert not torch.autograd.profiler._is_profiler_enabled


def test_keyboard_interrupt_during_compile_restores_everything() -> None:
    before = torch_settings()
    compiled = torch.compile(lambda x: x.sin() + 1, backend=interrupting_backend)
    with pytest.raises(KeyboardInterrupt):
        nbt.capture_graphs(compiled, torch.randn(4))
    assert torch_settings() == before


def test_capture_inside_a_running_profiler_skips_costs_with_a_note() -> None:
    from torch.profiler import ProfilerActivity, profile

    compiled = torch.compile(step_with_a_costly_break, backend="eager")
    with profile(activities=[ProfilerActivity.CPU]):
        report = nbt.capture_graphs(compiled, torch.randn(8, 8), steps=1, eager_baseline=False)
    assert report.error is None and len(report.breaks) == 2
    assert report.breaks["eager_us_per_step"].isna().all()
    assert any("another torch profiler" in n for n in report.notes)


def test_nothing_compiled_gives_an_empty_report_with_a_note() -> None:
    report = nbt.capture_graphs(lambda: torch.ones(2) + 1, steps=1, eager_baseline=False)
    assert report.graphs.empty and report.breaks.empty
    assert any("no compile event" in n for n in report.notes)


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(nbt.NbtUsageError, match="callable"):
        nbt.capture_graphs(42)  # type: ignore[arg-type]
    with pytest.raises(nbt.NbtUsageError, match="steps"):
        nbt.capture_graphs(lambda: None, steps=-1)


def test_before_after_comparison_shows_fewer_breaks(captured: tuple[GraphReport, Any]) -> None:
    before, _ = captured
    after = nbt.capture_graphs(torch.compile(step_fixed, backend="eager"), torch.randn(64), steps=2)
    comparison = before.compare(after)
    table = comparison.table().set_index("metric")
    assert table.loc["graph breaks", "before"] == 7 and table.loc["graph breaks", "after"] == 0
    assert table.loc["graphs", "after"] == 1
    assert table.loc["graph breaks", "change"] == -7
    assert len(comparison.fixed_breaks()) == 7
    text = repr(comparison)
    assert "step time compiled" in text and "fixed:" in text
    assert "<table" in comparison._repr_html_()


def test_live_report_saves_and_loads(captured: tuple[GraphReport, Any], tmp_path: Any) -> None:
    report, _ = captured
    again = GraphReport.load(report.save(tmp_path / "live"))
    assert again.step_time_s == report.step_time_s
    assert again.breaks["eager_us_per_step"].tolist() == report.breaks["eager_us_per_step"].tolist()
    assert repr(again) == repr(report)


LIVE_VS_LOG_MODULE = """
import torch


def f(x):
    x = x.sin()
    print("break one")
    y = x.sum().item()
    return x.cos() * y


def run():
    torch.manual_seed(0)  # .item() becomes a constant of the next graph: same value in both runs
    compiled = torch.compile(f, backend="eager", dynamic=False)
    compiled(torch.randn(4))
    compiled(torch.randn(5))  # a recompile: size 4 -> 5
"""


@pytest.mark.slow
def test_live_capture_and_torch_trace_log_give_the_same_report(tmp_path: Any) -> None:
    """One parser for both: the same code captured live and written by TORCH_TRACE in a subprocess."""
    import importlib.util

    from tests._python import run_module_function

    module_path = tmp_path / "live_vs_log.py"
    module_path.write_text(LIVE_VS_LOG_MODULE)
    log_dir = tmp_path / "trace"
    run_module_function(module_path, env={"TORCH_TRACE": str(log_dir)})
    from_log = nbt.load_compile_log(log_dir)

    spec = importlib.util.spec_from_file_location("live_vs_log", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    live = nbt.capture_graphs(module.run, steps=0)

    def ids(report: GraphReport) -> list[str]:
        return [c.split(":")[-1] for c in report.compile_ids if not c.endswith("-/-")]

    assert ids(live) == ids(from_log)
    assert_same_report(live, from_log)
    assert len(live.graphs) == 6 and len(live.breaks) == 4 and len(live.recompiles) == 3
