"""Modules split by job: each name has one home, and the new modules import on their own.

A name that moved out of a module is imported from the module that defines it; the old module
no longer lists it (no backward-compatible re-export), and each new module imports cleanly in
a fresh interpreter (no hidden circular import that only the old module's import order hides).
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from tests._python import run_python

# old module -> {name: new module that now defines it}
MOVED = {
    "nbtoolkit.compile.log_events": {
        "FRAME_COLUMNS": "nbtoolkit.compile.schema",
        "CompileKey": "nbtoolkit.compile.log_envelope",
        "format_compile_id": "nbtoolkit.compile.log_envelope",
        "record_kind": "nbtoolkit.compile.log_envelope",
        "GRAPH_BREAK_SITE": "nbtoolkit.compile.break_text",
        "GraphBreakText": "nbtoolkit.compile.break_text",
        "parse_graph_break_text": "nbtoolkit.compile.break_text",
        "source_context": "nbtoolkit.compile.break_text",
    },
    "nbtoolkit.metrics.measure": {
        "FlopCounts": "nbtoolkit.metrics.flop_count",
        "count_step_flops": "nbtoolkit.metrics.flop_count",
        "measure_matmul_peak": "nbtoolkit.metrics.peak_flops",
        "resolve_peak": "nbtoolkit.metrics.peak_flops",
    },
    "nbtoolkit.integrations.deepspeed": {
        "KNOBS": "nbtoolkit.integrations.deepspeed.config",
        "zero_config": "nbtoolkit.integrations.deepspeed.config",
        "default_settings": "nbtoolkit.integrations.deepspeed.config",
        "grid_settings": "nbtoolkit.integrations.deepspeed.config",
        "label": "nbtoolkit.integrations.deepspeed.config",
        "sweep_one_on_rank": "nbtoolkit.integrations.deepspeed.rank",
        "graph_breaks_one_on_rank": "nbtoolkit.integrations.deepspeed.rank",
        "ZeroSweep": "nbtoolkit.integrations.deepspeed.sweep",
        "zero_sweep": "nbtoolkit.integrations.deepspeed.sweep",
        "read_sweep": "nbtoolkit.integrations.deepspeed.sweep",
        "ZeroGraphBreaks": "nbtoolkit.integrations.deepspeed.graph_breaks",
        "zero_graph_breaks": "nbtoolkit.integrations.deepspeed.graph_breaks",
    },
}

NEW_MODULES = sorted(
    {new for names in MOVED.values() for new in names.values()}
    | {"nbtoolkit.memory.snapshot_stacks", "nbtoolkit.memory.snapshot_timeline"}
)


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [(old, name, new) for old, names in MOVED.items() for name, new in names.items()],
)
def test_a_moved_name_is_defined_and_listed_only_in_its_new_module(old: str, name: str, new: str) -> None:
    moved = getattr(importlib.import_module(new), name)
    if inspect.isclass(moved) or inspect.isfunction(moved):
        assert moved.__module__ == new  # defined there, not re-exported from somewhere else
    assert name not in getattr(importlib.import_module(old), "__all__", [])


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_all_lists_only_names_the_module_has(old: str) -> None:
    module = importlib.import_module(old)
    missing = [name for name in getattr(module, "__all__", []) if not hasattr(module, name)]
    assert not missing


def test_each_new_module_imports_first_in_a_fresh_interpreter() -> None:
    # A fresh process per module: in this one, earlier tests have imported everything already.
    for module in NEW_MODULES:
        run_python("-c", f"import {module}")
