"""A compile log can name any file as the user's code: only allowed Python source is ever read.

The log is written here, line by line, in torch's TORCH_TRACE format; each break says
``Graph break in user code at FILE:LINE`` with FILE chosen by an attacker: a secret that is
not Python, a pseudo-file, a FIFO, an endless device, a bare module name looked up along
sys.path, symlinks out of the allowed folder, a file too large. None of them may reach the
report's frames, text or HTML, and none may hang or take memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.compile.user_source import MAX_SOURCE_BYTES, SourcePolicy, read_source_lines

SECRET = "s3cr3t-token-4f9a"
_PREFIX = "V1126 09:00:00.000000 4242 torch/_dynamo/symbolic_convert.py:100] "


def _break_record(file: str, line: int | str, frame_id: int) -> str:
    envelope = {
        "artifact": {"name": "dynamo_graph_break_reason", "encoding": "string"},
        "frame_id": frame_id,
        "frame_compile_id": 0,
        "attempt": 0,
    }
    payload = [
        f"Graph break in user code at {file}:{line}",
        "Graph Break Reason: Unsupported Tensor.item() call",
        "  Explanation: Dynamo does not support tracing `Tensor.item()`.",
        "  Hint: set torch._dynamo.config.capture_scalar_outputs = True",
    ]
    envelope["has_payload"] = hashlib.md5("\n".join(payload).encode()).hexdigest()
    return _PREFIX + json.dumps(envelope) + "\n" + "".join(f"\t{p}\n" for p in payload)


def _log(tmp_path: Path, targets: list[tuple[str, int]]) -> Path:
    log = tmp_path / "logs" / "dedicated_log_torch_trace_rank_0.log"
    log.parent.mkdir(exist_ok=True)
    log.write_text("".join(_break_record(f, n, i) for i, (f, n) in enumerate(targets)))
    return log


def _everything_shown(report: nbt.GraphReport) -> str:
    return "\n".join(
        [
            report.breaks.to_string(),
            str(report.breaks["source_context"].tolist()),
            str(report.breaks["source_line"].tolist()),
            repr(report),
            report._repr_html_(),
        ]
    )


@pytest.fixture
def secrets(tmp_path: Path) -> dict[str, Path]:
    """Files an attacker would like to read, beside code the user does want context from."""
    code = tmp_path / "code"
    code.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"line one\nTOKEN={SECRET}\n")
    (outside / "settings.py").write_text(f"A = 1\nTOKEN = '{SECRET}'\n")
    (code / "train.py").write_text("import torch\n\ndef step(x):\n    return x.item()  # the break\n")
    (code / "link_out.py").symlink_to(outside / "settings.py")
    (code / "link_txt.py").symlink_to(outside / "secret.txt")
    (code / "huge.py").write_text(f"# {SECRET}\n" + "x = 1\n" * (MAX_SOURCE_BYTES // 6 + 10))
    return {"code": code, "outside": outside}


def test_a_log_from_elsewhere_reads_no_source_by_default(tmp_path: Path, secrets: dict[str, Path]) -> None:
    """No source_roots: not even the user's plain .py file is opened; torch's own text remains."""
    log = _log(
        tmp_path,
        [(str(secrets["outside"] / "settings.py"), 2), (str(secrets["outside"] / "secret.txt"), 2)],
    )
    report = nbt.load_compile_log(log)
    assert len(report.breaks) == 2
    assert (report.breaks["source_context"] == "").all()
    assert SECRET not in _everything_shown(report)
    assert any("source_roots=" in note for note in report.notes)


def test_source_roots_allow_only_python_files_under_them(tmp_path: Path, secrets: dict[str, Path]) -> None:
    code, outside = secrets["code"], secrets["outside"]
    targets = [
        (str(code / "train.py"), 4),  # allowed: regular .py under the root
        (str(outside / "settings.py"), 2),  # a .py outside the root
        (str(outside / "secret.txt"), 2),  # not Python
        (str(code / "link_out.py"), 2),  # a symlink under the root to a .py outside it
        (str(code / "link_txt.py"), 2),  # a .py name linking to a secret
        (str(code / "huge.py"), 1),  # over MAX_SOURCE_BYTES
        (str(code / ".." / "outside" / "settings.py"), 2),  # dot-dot out of the root
        ("settings.py", 2),  # relative: never resolved against the working directory or sys.path
    ]
    report = nbt.load_compile_log(_log(tmp_path, targets), source_roots=[code])
    contexts = report.breaks.sort_values("frame_id")["source_context"].tolist()
    assert "> 4 |     return x.item()  # the break" in contexts[0]
    assert contexts[1:] == [""] * (len(targets) - 1)
    assert SECRET not in _everything_shown(report)


@pytest.mark.parametrize(
    "name",
    [
        "/etc/passwd",
        "/etc/shadow",
        "/proc/self/environ",
        "/proc/self/cmdline",
        "/dev/zero",
        "/dev/urandom",
        "os.py",
    ],
)
def test_system_files_and_sys_path_lookups_are_never_read(tmp_path: Path, name: str) -> None:
    """Even with '/' allowed: pseudo-files, devices, non-Python files and bare names stay closed."""
    start = time.perf_counter()
    report = nbt.load_compile_log(_log(tmp_path, [(name, 1)]), source_roots="/")
    assert time.perf_counter() - start < 10
    assert report.breaks["source_context"].tolist() == [""]
    assert report.breaks["source_line"].isna().all()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_fifo_named_like_source_neither_hangs_nor_is_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    start = time.perf_counter()
    assert read_source_lines(str(fifo), SourcePolicy.live()) is None
    report = nbt.load_compile_log(_log(tmp_path, [(str(fifo), 1)]), source_roots=tmp_path)
    assert report.breaks["source_context"].tolist() == [""]
    assert time.perf_counter() - start < 10


def test_a_symlink_to_proc_named_py_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "environ.py"
    link.symlink_to("/proc/self/environ")
    assert read_source_lines(str(link), SourcePolicy.live()) is None


def test_live_policy_reads_cells_from_memory_and_python_files(tmp_path: Path) -> None:
    """A live capture may read its own cells (linecache's in-memory entries) and .py files."""
    import linecache

    name = "<nbt-test-cell>"
    linecache.cache[name] = (10, None, ["a = 1\n", "b = a.item()\n"], name)
    try:
        assert read_source_lines(name, SourcePolicy.live()) == ["a = 1\n", "b = a.item()\n"]
        assert read_source_lines(name, SourcePolicy.from_roots([tmp_path])) is None  # a log's cell name
    finally:
        del linecache.cache[name]
    here = Path(__file__)
    assert read_source_lines(str(here), SourcePolicy.live()) is not None
    assert read_source_lines(str(here), SourcePolicy()) is None
    # a file that linecache holds from disk is read through our checks, never from linecache's copy
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN=1\n")
    assert linecache.getlines(str(secret)) == ["TOKEN=1\n"]
    assert read_source_lines(str(secret), SourcePolicy.live()) is None


def test_source_encoding_is_honoured_and_bad_bytes_do_not_fail(tmp_path: Path) -> None:
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"# -*- coding: latin-1 -*-\nname = '\xe9t\xe9'\n")
    assert read_source_lines(str(latin), SourcePolicy.live()) == [
        "# -*- coding: latin-1 -*-\n",
        "name = 'été'\n",
    ]
    broken = tmp_path / "broken.py"
    broken.write_bytes(b"x = '\xff\xfe'\n")
    lines = read_source_lines(str(broken), SourcePolicy.live())
    assert lines is not None and lines[0].startswith("x = '")


def test_the_magic_takes_source_roots_and_the_report_says_where_context_came_from(
    shell: InteractiveShell, tmp_path: Path, secrets: dict[str, Path]
) -> None:
    log = _log(tmp_path, [(str(secrets["code"] / "train.py"), 4)])
    shell.run_line_magic("nbt", f"compile-log {log} --source-root {secrets['code']} --name with_roots")
    assert "x.item()" in shell.user_ns["with_roots"].breaks["source_context"].iloc[0]
    shell.run_line_magic("nbt", f"compile-log {log} --name without_roots")
    assert shell.user_ns["without_roots"].breaks["source_context"].iloc[0] == ""


def test_source_roots_of_the_wrong_type_are_one_clear_error(tmp_path: Path) -> None:
    log = _log(tmp_path, [("/x.py", 1)])
    with pytest.raises(nbt.NbtUsageError, match="source_roots"):
        nbt.load_compile_log(log, source_roots=3)  # type: ignore[arg-type]


def test_a_hostile_break_text_is_escaped_in_the_html_and_the_report(tmp_path: Path) -> None:
    """Markup in a log's reason, explanation, hint and file name reaches HTML only escaped."""
    log = tmp_path / "logs" / "hostile.log"
    log.parent.mkdir()
    record = _break_record("/tmp/<script>x</script>.py", 1, 0)
    record = record.replace("Unsupported Tensor.item() call", "<script>alert(1)</script>")
    record = record.replace(
        "Dynamo does not support tracing `Tensor.item()`.", "<img src=x onerror=alert(2)>"
    )
    record = record.replace(
        '"has_payload": "',
        '"has_payload": "0',  # the digest no longer matches: read as is, with a note
    )
    log.write_text(record)
    report = nbt.load_compile_log(log)
    assert "<script>alert(1)</script>" in report.breaks["reason"].iloc[0]  # the data keeps the text
    written = nbt.report(report, path=str(tmp_path / "report.html")).path.read_text()
    for html in (report._repr_html_(), written):
        assert (
            "<script>alert(1)" not in html and "<img src=x" not in html and "<script>x</script>" not in html
        )
        assert "&lt;script&gt;alert(1)" in html


@pytest.mark.parametrize("digits", [30, 5000])
def test_a_line_number_past_64_bits_is_read_as_absent(tmp_path: Path, digits: int) -> None:
    """A break at line 10**30 (or 5,000 digits, past int()'s limit) keeps its row, without a line."""
    log = tmp_path / "dedicated_log_torch_trace_rank_0.log"
    log.write_text(_break_record("/x.py", "9" * digits, 0))
    report = nbt.load_compile_log(log)
    assert len(report.breaks) == 1
    assert report.breaks["user_line"].isna().all() and report.breaks["source_context"].tolist() == [""]
