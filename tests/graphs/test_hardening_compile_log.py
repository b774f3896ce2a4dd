"""load_compile_log under hostile input: wrong types, FIFOs, devices, files over the read limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import nbtoolkit as nbt

_LINE = 'V0403 07:28:48.061000 139877824898048 torch/_dynamo/output_graph.py:1139] {"str": ["x", 0]}\n'


@pytest.mark.parametrize("value", [None, 3, ["a.log"]])
def test_a_wrong_type_names_what_was_given(value: object) -> None:
    shown = "None" if value is None else type(value).__name__
    with pytest.raises(nbt.NbtUsageError, match=rf"load_compile_log\(\) takes the path .*got .*{shown}"):
        nbt.load_compile_log(value)  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "dedicated_log_torch_trace_rank_0.log"
    os.mkfifo(fifo)
    with pytest.raises(nbt.CompileLogError, match="named pipe"):
        nbt.load_compile_log(fifo)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused() -> None:
    with pytest.raises(nbt.CompileLogError, match="is a device"):
        nbt.load_compile_log("/dev/zero")


def test_a_log_over_the_limit_is_refused_naming_the_knobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.log"
    path.write_text(_LINE * 20_000)  # about 2 MB
    with pytest.raises(nbt.CompileLogError, match=r"big\.log is 1\.\d\d MiB, over the limit of 1\.00 MiB"):
        nbt.load_compile_log(path, max_bytes="1MiB")
    monkeypatch.setenv("NBT_MAX_READ_BYTES", "1MiB")
    with pytest.raises(nbt.CompileLogError, match="NBT_MAX_READ_BYTES"):
        nbt.load_compile_log(path)
    monkeypatch.delenv("NBT_MAX_READ_BYTES")
    assert nbt.load_compile_log(path).source == str(path)  # under the default limit it reads
