"""Parsing torch's graph-break messages, de-duplication, ranking and fix hints (pure, no compile)."""
# ruff: noqa: E501  (torch's graph-break messages are kept verbatim, long lines included)

from __future__ import annotations

import pandas as pd

from nbtoolkit.compile.break_summary import break_summary, classify_break, fix_hint
from nbtoolkit.compile.break_text import parse_graph_break_text
from nbtoolkit.compile.schema import FRAME_COLUMNS

TORCH = "/venv/lib/python3.11/site-packages/torch"

CALL_BREAK = f"""\
Graph break in user code at /home/me/train.py:14
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):

Failed to trace builtin operator
  Explanation: Dynamo does not know how to trace builtin operator `print` with argument types ['str'] (has_kwargs False)
  Hint: Avoid calling builtin `print` with argument types ['str']. Consider using an equivalent alternative function/method to `print`.
  Hint: If you are attempting to call a logging function (e.g. `print`), you can try adding it to `torch._dynamo.config.reorderable_logging_functions`.
  Hint: Please report an issue to PyTorch.

  Developer debug context: builtin print [<class 'torch._dynamo.variables.constant.ConstantVariable'>] False

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0059.html

User code traceback:
  File "/home/me/train.py", line 40, in <module>
    step()
  File "/home/me/train.py", line 14, in forward
    print("hi")

Traceback (most recent call last):
  File "{TORCH}/_dynamo/symbolic_convert.py", line 1076, in wrapper
    return inner_fn(self, inst)
"""

SKIP_BREAK = f"""\
Graph break: torch.compile cannot properly resume from this graph break, which results in a skip.
torch.compile will skip tracing the frame fn (/home/me/model.py line 3) and fall back to eager.
The graph break occurred in the following user code:
  File "/home/me/model.py", line 7, in fn
    y = x.item()

Traceback (most recent call last):
  File "{TORCH}/_dynamo/convert_frame.py", line 2300, in __call__
    result = self._inner_convert(
torch._dynamo.exc.Unsupported: Unsupported Tensor.item() call with capture_scalar_outputs=False
  Explanation: Dynamo does not support tracing `Tensor.item()` with config.capture_scalar_outputs=False.
  Hint: Set `torch._dynamo.config.capture_scalar_outputs = True` to include these operations in the captured graph.

  Developer debug context: call_method TensorVariable() item () {{}}

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0124.html
"""

POLYFILL_BREAK = f"""\
Graph break in user code at {TORCH}/_dynamo/polyfills/__init__.py:513
Graph Break Reason: Attempted to inline function marked as skipped
  Explanation: Dynamo developers have intentionally marked that the function `Series.__init__` should not be traced.
  Hint: Avoid calling the function `Series.__init__`.

User code traceback:
  File "/home/me/prep.py", line 28, in prep
    r = pandas.Series([1, 2]).sum()
  File "{TORCH}/_dynamo/polyfills/__init__.py", line 513, in instantiate_user_defined_class_object
    obj.__init__(*args, **kwargs)
"""


def test_call_break_parts() -> None:
    p = parse_graph_break_text(CALL_BREAK)
    assert p.gb_type == "Failed to trace builtin operator"
    assert p.gb_id == "GB0059"
    assert p.doc_url == "https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0059.html"
    assert p.explanation.startswith("Dynamo does not know how to trace builtin operator `print`")
    assert len(p.hints) == 3 and "reorderable_logging_functions" in p.hints[1]
    assert p.context.startswith("builtin print")
    assert (p.user_file, p.user_line, p.user_function) == ("/home/me/train.py", 14, "forward")
    assert p.traceback_source == 'print("hi")'
    assert p.reason.startswith("Encountered graph break") and "User code traceback" not in p.reason


def test_skip_break_takes_type_and_location_from_the_exception() -> None:
    p = parse_graph_break_text(SKIP_BREAK)
    assert p.gb_type == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert p.gb_id == "GB0124"
    assert (p.user_file, p.user_line, p.user_function) == ("/home/me/model.py", 7, "fn")
    assert p.traceback_source == "y = x.item()"
    assert "capture_scalar_outputs = True" in p.hints[0]


def test_break_inside_a_torch_polyfill_points_at_the_user_line() -> None:
    p = parse_graph_break_text(POLYFILL_BREAK)
    assert (p.user_file, p.user_line, p.user_function) == ("/home/me/prep.py", 28, "prep")
    assert p.traceback_source == "r = pandas.Series([1, 2]).sum()"


def test_message_without_link_gets_the_registry_id_of_installed_torch() -> None:
    text = CALL_BREAK.replace(
        " For more details about this graph break, please visit: "
        "https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0059.html\n",
        "",
    )
    p = parse_graph_break_text(text)
    assert p.gb_id == "GB0059"
    assert p.doc_url == "https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0059.html"


def _breaks(rows: list[dict[str, object]]) -> pd.DataFrame:
    base = dict.fromkeys(FRAME_COLUMNS["breaks"])
    frame = pd.DataFrame([{**base, **row} for row in rows], columns=list(FRAME_COLUMNS["breaks"]))
    return frame.astype(FRAME_COLUMNS["breaks"])


def test_summary_dedups_by_type_and_location_and_ranks_by_count_without_costs() -> None:
    rows = [
        {"break": 0, "compile_id": "0/0", "gb_type": "A", "user_file": "m.py", "user_line": 3},
        {"break": 1, "compile_id": "1/0", "gb_type": "B", "user_file": "m.py", "user_line": 9},
        {"break": 2, "compile_id": "0/1", "gb_type": "B", "user_file": "m.py", "user_line": 9},
        {"break": 3, "compile_id": "2/0", "gb_type": "B", "user_file": "m.py", "user_line": 12},
    ]
    summary = break_summary(_breaks(rows))
    assert list(zip(summary["gb_type"], summary["user_line"], summary["count"], strict=True)) == [
        ("B", 9, 2),
        ("A", 3, 1),
        ("B", 12, 1),
    ]
    assert summary["compile_ids"].iloc[0] == "1/0, 0/1"
    assert summary["eager_us_per_step"].isna().all()


def test_summary_ranks_measured_costs_first() -> None:
    rows = [
        {"break": 0, "compile_id": "0/0", "gb_type": "A", "user_file": "m.py", "user_line": 3},
        {"break": 1, "compile_id": "1/0", "gb_type": "B", "user_file": "m.py", "user_line": 9},
        {"break": 2, "compile_id": "2/0", "gb_type": "B", "user_file": "m.py", "user_line": 9},
    ]
    frame = _breaks(rows)
    frame["eager_us_per_step"] = [500.0, 10.0, 15.0]
    summary = break_summary(frame)
    assert list(summary["gb_type"]) == ["A", "B"]
    assert list(summary["eager_us_per_step"]) == [500.0, 25.0]


def test_summary_of_no_breaks_is_empty_with_columns() -> None:
    summary = break_summary(_breaks([]))
    assert summary.empty and "fix" in summary.columns


def test_fix_hints_name_real_torch_apis() -> None:
    import torch

    assert classify_break("Unsupported Tensor.item() call with capture_scalar_outputs=False") == "scalar"
    assert classify_break("Data-dependent branching") == "control_flow"
    assert classify_break("Call to `torch._dynamo.graph_break()`") == "graph_break_call"
    assert classify_break("Something new") == "other"
    # torch's own hint where none of ours fits, marked as not checked
    assert fix_hint("Something new", "", "First torch hint\nSecond") == (
        "torch's hint (not checked by nbtoolkit): First torch hint"
    )
    # every torch name the hints mention exists in the installed torch
    config = torch._dynamo.config
    assert hasattr(config, "capture_scalar_outputs")
    assert hasattr(config, "trace_autograd_ops")
    assert hasattr(config, "skip_fwd_side_effects_in_bwd_under_checkpoint")
    assert isinstance(config.reorderable_logging_functions, set)
    assert isinstance(config.ignore_logging_functions, set)
    assert callable(torch.cond) and callable(torch.where)
    assert callable(torch.compiler.disable)
    assert callable(torch.library.custom_op)


def test_a_record_of_unexpected_shape_is_skipped_with_a_note() -> None:
    from nbtoolkit.compile.log_events import CompileEventParser

    parser = CompileEventParser()
    parser.add({"compilation_metrics": {"graph_op_count": 2}, "frame_id": "zero?"}, None)
    parser.add({"dynamo_start": {"stack": [{"filename": 3, "line": "x"}]}, "frame_id": 0}, None)
    parser.add(
        {"compilation_metrics": {"restart_reasons": "one reason"}, "frame_id": 0, "frame_compile_id": 0}, None
    )
    parser.add({"artifact": {"name": "dynamo_graph_break_reason"}, "frame_id": 0}, 123)  # type: ignore[arg-type]
    frames = parser.frames()
    assert frames["failures"]["description"].tolist() == ["one reason"]
    assert len(frames["compiles"]) == 2
    assert frames["breaks"].empty
    assert any("skipped a record (artifact)" in n for n in parser.notes)
