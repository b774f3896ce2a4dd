"""Magics under bad input: wrong variable types, unsafe --name, a user's exception inside a cell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _trace_file(folder: Path) -> Path:
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}
    path = folder / "rank0.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [event]}))
    return path


@pytest.mark.parametrize("name", ["__builtins__", "print", "len", "__name__", "1abc", "class", "a-b"])
def test_unsafe_or_invalid_name_is_a_usage_error(shell: InteractiveShell, tmp_path: Path, name: str) -> None:
    path = _trace_file(tmp_path)
    before = shell.user_ns.get(name, "absent")
    with pytest.raises(UsageError, match=r"argument --name: .*(builtin|dunder|not a Python variable name)"):
        shell.run_line_magic("nbt", f"overlap {path} --name {name}")
    assert shell.user_ns.get(name, "absent") is before  # nothing was overwritten


def test_a_plain_name_stores_the_result(shell: InteractiveShell, tmp_path: Path) -> None:
    shell.run_line_magic("nbt", f"overlap {_trace_file(tmp_path)} --name my_overlap")
    assert "my_overlap" in shell.user_ns


@pytest.mark.parametrize(("line", "function"), [("overlap x", "comm_comp_overlap"),
                                                 ("trace items", "load_trace"),
                                                 ("snapshot x", "load_memory_snapshot"),
                                                 ("compile-log x", "load_compile_log")])
def test_a_variable_of_the_wrong_type_is_one_usage_error(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str, function: str
) -> None:
    shell.user_ns.update(x=5, items=[1, 2])
    result = shell.run_cell(f"%nbt {line}")
    assert isinstance(result.error_in_exec, nbt.NbtUsageError)
    assert f"{function}() takes" in str(result.error_in_exec)
    assert "got an int (5)" in str(result.error_in_exec) or "got a list ([1, 2])" in str(result.error_in_exec)
    shown = _ANSI.sub("", capsys.readouterr().out)
    assert "Traceback" not in shown and f"NbtUsageError: {function}() takes" in shown


@pytest.mark.parametrize("magic", ["profile --steps 1 --warmup 0", "memory --steps 1"])
def test_a_user_exception_in_a_cell_shows_the_users_frames_only(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], magic: str
) -> None:
    shell.run_cell("def divide(x):\n    return 1 / x\n")
    capsys.readouterr()
    result = shell.run_cell(f"%%nbt {magic}\ny = 2\ndivide(y - 2)\n")
    assert isinstance(result.error_in_exec, ZeroDivisionError)  # the user's exception, as it was
    shown = _ANSI.sub("", capsys.readouterr().out)
    assert "<nbt-cell>:2" in shown and "divide(y - 2)" in shown  # the cell's line, with its source
    assert "return 1 / x" in shown  # the user's function
    assert "nbtoolkit" not in shown.split("ZeroDivisionError: division by zero")[0].replace(
        "nbtoolkit: the memory timeline", ""
    )
    assert "site-packages" not in shown and "Could not get source" not in shown
    frames = [line for line in shown.splitlines() if line.startswith(("File ", "Cell "))]
    assert len(frames) == 2, shown  # the cell and divide(), as a plain cell would show


def test_an_nbtoolkit_error_in_a_cell_keeps_its_one_line(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = "%%nbt profile --steps 1 --warmup 0\nimport nbtoolkit\nnbtoolkit.load_trace(None)\n"
    result = shell.run_cell(cell)
    assert isinstance(result.error_in_exec, nbt.NbtUsageError)
    assert "NbtUsageError: load_trace() takes" in _ANSI.sub("", capsys.readouterr().out)

