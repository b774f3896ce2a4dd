"""One check that two GraphReports of the same program agree (a live capture and a TORCH_TRACE log)."""

from __future__ import annotations

from typing import Any

# The columns both sources fill the same way (timings and paths of temporary files differ).
COMPARED_COLUMNS = {
    "graphs": ["compile_id", "function", "file", "line", "op_count", "fx_code"],
    "breaks": ["compile_id", "gb_type", "gb_id", "user_file", "user_line", "user_function", "source_line"],
    "recompiles": ["compile_id", "previous_compile_id", "failed_guard"],
    "failures": ["compile_id", "failure_type", "description"],
}


def assert_same_report(live: Any, from_log: Any) -> None:
    """Every compared column of every table is equal, value for value (as text)."""
    for name, cols in COMPARED_COLUMNS.items():
        a = getattr(live, name)[cols].reset_index(drop=True)
        b = getattr(from_log, name)[cols].reset_index(drop=True)
        for col in cols:
            assert a[col].astype(str).tolist() == b[col].astype(str).tolist(), f"{name}.{col} differ"
