"""The columns and dtypes of a :class:`~nbtoolkit.compile.report.GraphReport`'s frames.

One schema for the three places that make or read those frames: the parser of torch's
compile events (:mod:`nbtoolkit.compile.log_events`) builds them with these dtypes,
``GraphReport.load`` restores them after Parquet, and tests build frames by hand.
Nullable integers (``Int64``) because a compile id's parts and a break's user line may be
unknown.
"""

from __future__ import annotations

from typing import Any

from nbtoolkit.core.saved import INT, NUMBER, TEXT, Check, list_of, optional

__all__ = [
    "ADDED_COLUMNS",
    "BREAK_COLUMNS",
    "COMPILE_COLUMNS",
    "FAILURE_COLUMNS",
    "FRAME_COLUMNS",
    "GRAPH_COLUMNS",
    "RECOMPILE_COLUMNS",
    "REPORT_FIELDS",
]

# Which compile a row belongs to (torch's compile id and its parts), and where the compiled code is.
_COMPILE_KEY = {
    "rank": "Int64",
    "compile_id": "object",
    "frame_id": "Int64",
    "frame_compile_id": "Int64",
}
_ATTEMPT_AND_CODE = {
    "attempt": "Int64",
    "function": "object",
    "file": "object",
    "line": "Int64",
    "op_count": "Int64",
}

GRAPH_COLUMNS = {
    "graph": "int64",
    **_COMPILE_KEY,
    **_ATTEMPT_AND_CODE,
    "node_count": "Int64",
    "compile_time_s": "float64",
    "backend_compile_time_s": "float64",
    "fx_code": "object",
}
BREAK_COLUMNS = {
    "break": "int64",
    **_COMPILE_KEY,
    "attempt": "Int64",
    "gb_type": "object",
    "gb_id": "object",
    "reason": "object",
    "explanation": "object",
    "hints": "object",
    "user_file": "object",
    "user_line": "Int64",
    "user_function": "object",
    "source_line": "object",
    "source_context": "object",
    "doc_url": "object",
    # the user's own line that called into a library whose code breaks (None when user_* is the
    # user's own line); see nbtoolkit.compile.frame_owner
    "call_file": "object",
    "call_line": "Int64",
    "call_function": "object",
    "call_source_line": "object",
    "inside_torch": "object",  # "torch/optim/optimizer.py:79" when the break was inside torch's code
}
RECOMPILE_COLUMNS = {
    **_COMPILE_KEY,
    "function": "object",
    "file": "object",
    "previous_compile_id": "object",
    "failed_guard": "object",
    "reason": "object",
}
FAILURE_COLUMNS = {
    "rank": "Int64",
    "compile_id": "object",
    "failure_type": "object",
    "description": "object",
    "source": "object",
}
COMPILE_COLUMNS = {
    **_COMPILE_KEY,
    **_ATTEMPT_AND_CODE,
    "compile_time_s": "float64",
    "status": "object",
    "fail_type": "object",
    "restarts": "int64",
}

# columns added after a frame's first format: a saved report without them loads them as nulls
ADDED_COLUMNS: dict[str, tuple[str, ...]] = {
    "breaks": ("call_file", "call_line", "call_function", "call_source_line", "inside_torch"),
}

# frame name -> column -> pandas dtype, in the column order of the frame
FRAME_COLUMNS: dict[str, dict[str, str]] = {
    "graphs": GRAPH_COLUMNS,
    "breaks": BREAK_COLUMNS,
    "recompiles": RECOMPILE_COLUMNS,
    "failures": FAILURE_COLUMNS,
    "compiles": COMPILE_COLUMNS,
}

# report.json (GraphReport.save) key -> (check, default): what GraphReport.load accepts
REPORT_FIELDS: dict[str, tuple[Check, Any]] = {
    "compile_ids": (list_of(TEXT), []),
    "source": (TEXT, ""),
    "notes": (list_of(TEXT), []),
    "ranks": (list_of(INT), []),
    "first_call_s": (optional(NUMBER), None),
    "step_time_s": (optional(NUMBER), None),
    "eager_step_time_s": (optional(NUMBER), None),
    "steps": (INT, 0),
    "error": (optional(TEXT), None),
    "profiled_step_time_s": (optional(NUMBER), None),
    "first_call_compile_s": (optional(NUMBER), None),
    "step_times_s": (list_of(NUMBER), []),
    "eager_step_times_s": (list_of(NUMBER), []),
    "timed_step_compiles": (list_of(INT), []),
}
