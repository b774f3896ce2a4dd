"""Magics under careless input (issue 32, item 10): IPython's own names for --name, and bad paths.

``%nbt trace x --name _oh`` used to replace IPython's output history, and every later cell's
display failed until the kernel restarted; an 8,000-character path showed 55 lines of traceback.
Both are one clear error now, through a real IPython shell as the other magic tests use.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.core.magic_registry import all_subcommands
from nbtoolkit.magic_dispatch import load_subcommands

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_IPYTHON_NAMES = [
    "_oh",
    "_ih",
    "_",
    "__",
    "___",
    "_i",
    "_ii",
    "_iii",
    "_dh",
    "In",
    "Out",
    "exit",
    "quit",
    "get_ipython",
    "_i3",
    "_3",
    "_12",
    "_i120",
]


def _trace_file(folder: Path) -> Path:
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}
    path = folder / "rank0.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [event]}))
    return path


@pytest.mark.parametrize("name", _IPYTHON_NAMES)
def test_an_ipython_name_is_refused_and_later_cells_still_display(
    shell: InteractiveShell, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = _trace_file(tmp_path)
    before = shell.user_ns.get(name, "absent")
    with pytest.raises(UsageError, match=r"argument --name: .*(IPython keeps|not a Python variable name)"):
        shell.run_line_magic("nbt", f"trace {path} --static --name {name}")
    assert shell.user_ns.get(name, "absent") is before
    capsys.readouterr()
    result = shell.run_cell("6 * 7", store_history=True)  # the display of a later cell works
    assert result.success and result.result == 42
    assert isinstance(shell.user_ns["_oh"], dict) and isinstance(shell.user_ns["Out"], dict)
    assert "42" in capsys.readouterr().out


def test_every_subcommand_refuses_ipython_names() -> None:
    load_subcommands()
    stored = [sub for sub in all_subcommands() if sub.store_result]
    assert len(stored) > 5
    for sub in stored:
        for name in ("_oh", "Out", "_i7"):
            with pytest.raises(UsageError, match="IPython keeps"):
                sub.build_parser().parse_args(["--name", name])


@pytest.mark.parametrize("name", ["_nbt", "my_trace", "_i_trace", "match", "out", "in_"])
def test_ordinary_names_still_work(shell: InteractiveShell, tmp_path: Path, name: str) -> None:
    shell.run_line_magic("nbt", f"trace {_trace_file(tmp_path)} --static --name {name}")
    assert type(shell.user_ns[name]).__name__ == "TraceReport"


@pytest.mark.parametrize(
    ("line", "error", "message"),
    [
        (
            "trace " + "a" * 8000,
            "TraceError",
            r"a{59}…a{59} \(8,000 characters\): the path is 8,000 bytes long",
        ),
        ("overlap ~nosuchuser_nbt/x.json", "TraceError", r"cannot expand '~nosuchuser_nbt'"),
        ("snapshot ~nosuchuser_nbt/s.pickle", "SnapshotError", r"cannot expand '~nosuchuser_nbt'"),
        ("compile-log " + "b" * 300, "CompileLogError", r"one name in the path is 300 bytes long"),
    ],
)
def test_a_bad_path_through_the_magic_is_one_line(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str, error: str, message: str
) -> None:
    capsys.readouterr()
    result = shell.run_cell(f"%nbt {line}")
    assert isinstance(result.error_in_exec, nbt.NbtError)
    assert type(result.error_in_exec).__name__ == error
    assert re.search(message, str(result.error_in_exec))
    shown = _ANSI.sub("", capsys.readouterr().out)
    assert "Traceback" not in shown and len(shown.strip().splitlines()) == 1, shown[:2000]


def test_a_path_with_a_tilde_is_still_expanded(
    shell: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    _trace_file(tmp_path)
    shell.run_line_magic("nbt", "trace ~/rank0.json --static --name home_trace")
    assert type(shell.user_ns["home_trace"]).__name__ == "TraceReport"
