"""The restricted unpickler refuses the extension registry (EXT1/EXT2/EXT4), whoever filled it.

C's unpickler pushes an object cached in ``copyreg._extension_cache`` for an EXT opcode without
asking ``find_class``: once any code in the process has registered an extension code and
unpickled it, a snapshot could name that code and REDUCE would call the cached object. Here the
object is a canary that records its calls; each reader (whole file, streamed, gzipped, the
Flight Recorder reader) must refuse the pickle and the canary must never run. The registry
keeps working for ordinary pickle afterwards.
"""

from __future__ import annotations

import copyreg
import gzip
import io
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtError, SnapshotError
from nbtoolkit.memory.snapshot_pickle import RefusingUnpickler

CALLS: list[tuple[object, ...]] = []


def canary(*args: object) -> dict[str, object]:
    """Stands in for os.system: a call is recorded (and would have been an attack)."""
    CALLS.append(args)
    return {"segments": [], "device_traces": []}


canary2 = canary4 = canary  # one (module, name) pair holds one code: aliases for the other codes

# one code per opcode width: EXT1 takes 1 byte, EXT2 2 bytes, EXT4 4 bytes
CODES = {"EXT1": 0xE7, "EXT2": 0xE7E7, "EXT4": 0x7E7E7E7}
NAMES = {"EXT1": "canary", "EXT2": "canary2", "EXT4": "canary4"}


def _ext_opcode(code: int) -> bytes:
    if code <= 0xFF:
        return b"\x82" + struct.pack("<B", code)
    if code <= 0xFFFF:
        return b"\x83" + struct.pack("<H", code)
    return b"\x84" + struct.pack("<i", code)


def _attack(code: int) -> bytes:
    """PROTO 2, EXT <code>, the argument tuple ('touch pwned',), REDUCE, STOP."""
    arg = b"touch pwned"
    return b"\x80\x02" + _ext_opcode(code) + b"X" + struct.pack("<I", len(arg)) + arg + b"\x85" + b"R" + b"."


@pytest.fixture
def registered() -> Iterator[None]:
    """Every code registered for the canary and resolved once, as some library in the kernel might."""
    CALLS.clear()
    for opcode, code in CODES.items():
        copyreg.add_extension(__name__, NAMES[opcode], code)
    try:
        for code in CODES.values():
            assert pickle.loads(_attack(code)) == {"segments": [], "device_traces": []}  # fills the cache
        assert len(CALLS) == 3 and all(code in copyreg._extension_cache for code in CODES.values())  # type: ignore[attr-defined]
        CALLS.clear()
        yield
    finally:
        for opcode, code in CODES.items():
            copyreg.remove_extension(__name__, NAMES[opcode], code)
        CALLS.clear()


@pytest.mark.parametrize("opcode", sorted(CODES))
def test_the_unpickler_refuses_an_extension_code_the_cache_holds(registered: None, opcode: str) -> None:
    data = _attack(CODES[opcode])
    with pytest.raises(SnapshotError, match=r"refused: the pickle tries to load .*canary"):
        RefusingUnpickler(io.BytesIO(data)).load()
    assert CALLS == []
    # the cache is back as it was, and ordinary pickle still resolves the registered code
    assert CODES[opcode] in copyreg._extension_cache  # type: ignore[attr-defined]
    assert pickle.loads(data) == {"segments": [], "device_traces": []}


@pytest.mark.parametrize("opcode", sorted(CODES))
@pytest.mark.parametrize("how", ["whole", "stream", "gzip"])
def test_every_snapshot_reader_refuses_it(registered: None, tmp_path: Path, opcode: str, how: str) -> None:
    data = _attack(CODES[opcode])
    path = tmp_path / ("attack.pickle.gz" if how == "gzip" else "attack.pickle")
    path.write_bytes(gzip.compress(data) if how == "gzip" else data)
    with pytest.raises(SnapshotError, match="refused"):
        nbt.load_memory_snapshot(path, stream=(how == "stream"))
    assert CALLS == []


def test_an_unregistered_extension_code_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "unregistered.pickle"
    path.write_bytes(_attack(0x7ABCDEF))
    with pytest.raises(SnapshotError, match="not a readable memory snapshot"):
        nbt.load_memory_snapshot(path)


def test_the_flight_recorder_reader_refuses_it(registered: None, tmp_path: Path) -> None:
    from nbtoolkit.cluster.flight_recorder import read_dump

    path = tmp_path / "fr_dump_0.pickle"
    path.write_bytes(_attack(CODES["EXT1"]))
    with pytest.raises(NbtError, match="refused"):
        read_dump(path)
    assert CALLS == []


@pytest.mark.parametrize(
    ("opcodes", "message"),
    [
        (b"(ios\nsystem\nS'echo hi'\ntR.", r"refused: the pickle tries to load os\.system"),  # INST
        (b"\x80\x02(cos\nsystem\nS'x'\no.", r"refused: the pickle tries to load os\.system"),  # OBJ
        (
            b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
            r"refused: the pickle tries to load os\.system",
        ),  # STACK_GLOBAL
        (b"\x80\x02X\x01\x00\x00\x00aQ.", r"refused: the pickle uses a persistent id"),  # BINPERSID
        (b"\x80\x05\x97.", r"out-of-band data"),  # NEXT_BUFFER without buffers
        (b"\x80\x02}}b.", r"not a readable memory snapshot"),  # BUILD on a dict (no __setstate__)
        (b"\x80\x02\x82\x00.", r"EXT specifies code <= 0"),  # EXT1 of an impossible code
    ],
    ids=["INST", "OBJ", "STACK_GLOBAL", "BINPERSID", "NEXT_BUFFER", "BUILD", "EXT1-zero"],
)
def test_every_other_way_to_reach_an_object_is_one_snapshot_error(
    tmp_path: Path, opcodes: bytes, message: str
) -> None:
    path = tmp_path / "hostile.pickle"
    path.write_bytes(opcodes)
    for stream in (False, True):
        with pytest.raises(SnapshotError, match=message):
            nbt.load_memory_snapshot(path, stream=stream)
