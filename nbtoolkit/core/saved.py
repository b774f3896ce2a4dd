"""Saved results read back and written: one check shared by every ``load`` and ``save``.

A result's ``save`` writes plain data: a JSON file of metadata and Parquet frames (``Trace``,
``MemorySnapshot``, ``GraphReport``), or one Parquet file with its metadata in the schema
(``MemoryTimeline``). A saved folder may come from someone else, or have been edited or
damaged on the way, so ``load`` checks what it reads *before* any analysis sees it:

* the metadata: valid JSON (nesting included), a JSON object, each key the saver writes of the
  type it writes (:func:`check_fields`, with :class:`Check`s such as ``INT``, ``list_of(TEXT)``);
  keys it does not know are left out;
* each frame: a Parquet file that reads, with every column the saver writes, each of the Arrow
  type the frame's pandas dtype (the schema the saver writes) becomes (:func:`read_frame`);
  columns beyond those are kept;
* the values the analyses index by (row numbers, stack ids) within range (:func:`check_range`).

Whatever is wrong ends in one error of the loader's kind (``TraceError``, ``SnapshotError``,
``NbtUsageError``) naming the file and the problem, at load time, never later in an analysis.

``save`` goes through :func:`folder_to_save` (or :func:`file_to_save`): a file in the way, a
folder holding another kind of saved result, no permission, a full disk: one
:class:`~nbtoolkit.core.errors.SaveError` naming the path (an ``OSError`` too, which the caches
take as "not cached this time").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtError, SaveError
from nbtoolkit.core.paths import dangling_link, path_errors, shown_path, user_path

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = [
    "ANY",
    "BOOL",
    "INT",
    "NUMBER",
    "TEXT",
    "Check",
    "check_fields",
    "check_range",
    "check_version",
    "dict_of",
    "file_to_save",
    "folder_to_save",
    "list_of",
    "optional",
    "read_frame",
    "read_json",
    "read_schema_json",
    "saved_folder",
]

#: the metadata file of each kind of saved folder -> (its class, how to load it)
SAVED_KINDS = {
    "trace.json": "a saved Trace (load it with nbt.Trace.load)",
    "snapshot.json": "a saved MemorySnapshot (load it with nbt.MemorySnapshot.load)",
    "report.json": "a saved GraphReport (load it with nbt.GraphReport.load)",
}
_MAX_JSON_BYTES = 1 << 30  # a saved result's metadata is KBs to MBs; this is damage


@dataclass(frozen=True)
class Check:
    """A test of one JSON value and what it expects, in words (for the message)."""

    what: str
    ok: Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


ANY = Check("any value", lambda value: True)
INT = Check("an integer", _is_int)
#: what a saver may write for a measured number (NaN and infinities included: JSON as Python writes it)
NUMBER = Check("a number", lambda v: _is_int(v) or isinstance(v, float))
TEXT = Check("a string", lambda value: isinstance(value, str))
BOOL = Check("true or false", lambda value: isinstance(value, bool))


def optional(check: Check) -> Check:
    return Check(f"{check.what} or null", lambda value: value is None or check.ok(value))


def list_of(check: Check) -> Check:
    return Check(
        f"a list (of {check.what} each)",
        lambda value: isinstance(value, list) and all(map(check.ok, value)),
    )


def dict_of(key: Check, value: Check) -> Check:
    return Check(
        f"an object ({key.what} -> {value.what})",
        lambda d: isinstance(d, dict) and all(key.ok(k) and value.ok(v) for k, v in d.items()),
    )


def saved_folder(path: Any, meta_name: str, *, what: str, error: type[NbtError]) -> tuple[Path, Path]:
    """``(folder, folder / meta_name)`` of a saved result, or ``error`` saying what is there instead."""
    folder = user_path(path, error=error)
    meta = folder / meta_name
    with path_errors(folder, f"read the saved {what} in", error=error):
        if meta.is_file():
            return folder, meta
        if dangling_link(folder):
            raise error(dangling_link(folder))
        if not folder.exists():
            raise error(f"{shown_path(folder)}: no such folder; give a folder written by {what}.save()")
        if not folder.is_dir():
            inside = f"; give its folder, {shown_path(folder.parent)}" if folder.name in SAVED_KINDS else ""
            raise error(f"{shown_path(folder)} is a file, not a folder written by {what}.save(){inside}")
        other = next((kind for name, kind in SAVED_KINDS.items() if (folder / name).is_file()), None)
    if other is not None:
        raise error(f"{shown_path(folder)} holds {other}, not a saved {what}")
    raise error(f"{shown_path(folder)}: no {meta_name} here; is this a folder written by {what}.save()?")


def read_json(file: Path, *, what: str, error: type[NbtError]) -> dict[str, Any]:
    """The JSON object in ``file`` (the metadata of a saved ``what``), or ``error`` naming the damage."""
    with path_errors(file, f"read the saved {what}'s metadata", error=error):
        size = file.stat().st_size
        if size > _MAX_JSON_BYTES:
            raise error(f"{shown_path(file)}: {size:,} bytes is no saved {what}'s metadata; save it again")
        raw = file.read_bytes()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, nesting too deep
        problem = "nested too deeply" if isinstance(exc, RecursionError) else f"not valid JSON ({exc})"
        raise error(f"{shown_path(file)}: the saved {what} is damaged: {problem}; save it again") from None
    if not isinstance(data, dict):
        raise error(
            f"{shown_path(file)}: the saved {what} is damaged: it holds a JSON {_json_kind(data)}, "
            "not an object; save it again"
        )
    return data


def check_version(found: Any, known: int, file: Path, *, what: str, error: type[NbtError]) -> None:
    """Refuse a saved ``what`` of a format version newer than ``known`` (an older one reads as it is)."""
    if _is_int(found) and found > known:
        raise error(
            f"{shown_path(file)}: this {what} was saved by a newer nbtoolkit (format {found}; this one reads "
            f"up to {known}): upgrade nbtoolkit to load it"
        )


def check_fields(
    data: Any,
    fields: Mapping[str, tuple[Check, Any]],
    *,
    where: str,
    error: type[NbtError],
    required: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The ``fields`` of the JSON object ``data``, each checked (``name -> (check, default)``).

    A key in ``required`` must be there; any other missing key takes its default. Keys not in
    ``fields`` are left out (a newer writer's additions). ``where`` names the file (and entry).
    """
    if not isinstance(data, dict):
        raise error(f"{where}: expected a JSON object, got a {_json_kind(data)}; save it again")
    out: dict[str, Any] = {}
    for name, (check, default) in fields.items():
        if name not in data:
            if name in required:
                raise error(f"{where}: the key {name!r} is missing; the saved file is damaged, save it again")
            out[name] = default
            continue
        value = data[name]
        if not check.ok(value):
            raise error(
                f"{where}: {name!r} should be {check.what}, got {_json_kind(value)} {_short(value)}; "
                "the saved file is damaged, save it again"
            )
        out[name] = value
    return out


def read_frame(
    file: Path,
    columns: Mapping[str, str],
    *,
    what: str,
    error: type[NbtError],
    self_destruct: bool = False,
) -> pd.DataFrame:
    """A saved frame, checked against ``columns`` (name -> the pandas dtype the saver writes).

    dtypes: ``int64`` (Arrow integers, no nulls), ``Int64`` (integers, nulls allowed),
    ``float64`` (numbers), ``bool``, ``category``/``str`` (text), ``object`` (text or nulls),
    ``any``. A column that is all null (what pandas writes for an empty object column) passes
    any dtype that allows nulls, and any dtype when the frame has no rows.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    with path_errors(file, f"read the saved {what}'s frame", error=error):
        if not file.is_file():
            raise error(
                f"{shown_path(file)}: the saved {what} is damaged: "
                + ("the file is missing" if not file.exists() else "not a regular file (a FIFO or device?)")
                + "; save it again"
            )
    from nbtoolkit.core.bounded import max_read_bytes

    limit = max_read_bytes()  # before the try: a malformed NBT_MAX_READ_BYTES is the user's, not the file's
    try:
        with path_errors(file, f"read the saved {what}'s frame", error=error):
            _check_size(pq.read_metadata(file), file, limit, what=what, error=error)
            table = pq.read_table(file)
            table.validate(full=True)  # e.g. text that is not UTF-8, which fails only when used
    except (pa.ArrowException, ValueError, MemoryError, TypeError, KeyError, IndexError) as exc:
        raise error(
            f"{shown_path(file)}: the saved {what} is damaged: not a readable Parquet file "
            f"({type(exc).__name__}: {_short(str(exc), 200)}); save it again"
        ) from None
    check_table(table, columns, where=shown_path(file), what=what, error=error)
    schema = table.schema
    if schema.metadata and b"pandas" in schema.metadata:  # not used (below): not parsed either
        table = table.replace_schema_metadata({k: v for k, v in schema.metadata.items() if k != b"pandas"})
    # an empty frame's all-null columns stay as pandas wrote them (object); with rows they take the dtype
    null_columns = (
        {n for n, t in zip(schema.names, schema.types, strict=True) if pa.types.is_null(t)}
        if table.num_rows == 0
        else set()
    )
    try:
        # pandas' own metadata in the file is not used (damaged, it fails in pyarrow in a dozen ways):
        # the dtypes come from ``columns``, the schema the saver writes
        if self_destruct:  # each Arrow column freed as it becomes pandas: the peak is the frame
            frame = table.to_pandas(split_blocks=True, self_destruct=True, ignore_metadata=True)
        else:
            frame = table.to_pandas(ignore_metadata=True)
        del table
        for name, dtype in columns.items():
            if dtype in _COERCED and name not in null_columns and str(frame[name].dtype) != dtype:
                frame[name] = frame[name].astype(dtype)
    except Exception as exc:
        raise error(
            f"{shown_path(file)}: the saved {what} is damaged: its frame cannot be converted "
            f"({type(exc).__name__}: {_short(str(exc), 200)}); save it again"
        ) from None
    return frame


_COERCED = ("int64", "Int64", "float64", "bool", "category")


def _check_size(metadata: Any, file: Path, limit: int, *, what: str, error: type[NbtError]) -> None:
    """Refuse a frame whose rows would take more memory than the read limit (a Parquet "bomb").

    A column of one repeated value compresses to almost nothing: a 2 MB file can hold 50 million
    rows, 3 GB once read. Estimated as 8 bytes per row and column, against the readers' limit
    (``NBT_MAX_READ_BYTES``, default 8 GiB; see :mod:`nbtoolkit.core.bounded`).
    """
    from nbtoolkit.core.bounded import ENV_MAX_READ_BYTES
    from nbtoolkit.core.units import format_bytes

    estimate = int(metadata.num_rows) * max(1, int(metadata.num_columns)) * 8
    if estimate > limit:
        raise error(
            f"{shown_path(file)}: the saved {what} holds {int(metadata.num_rows):,} rows, about "
            f"{format_bytes(estimate)} once read, over the read limit of {format_bytes(limit)}; if it is "
            f"really yours, raise {ENV_MAX_READ_BYTES} (e.g. {ENV_MAX_READ_BYTES}=64GiB)"
        )


def read_schema_json(file: Path, key: bytes, *, what: str, error: type[NbtError]) -> dict[str, Any] | None:
    """The JSON object stored under ``key`` in a Parquet file's schema metadata (None: no such key)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with path_errors(file, f"read the saved {what}", error=error):
            schema = pq.read_schema(file)
    except (pa.ArrowException, ValueError, MemoryError, TypeError, KeyError, IndexError) as exc:
        raise error(
            f"{shown_path(file)} is not a saved {what} (Parquet): "
            f"{type(exc).__name__}: {_short(str(exc), 200)}"
        ) from None
    raw = (schema.metadata or {}).get(key)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise error(
            f"{shown_path(file)}: the saved {what}'s metadata is damaged ({_short(str(exc), 120)}); "
            "save it again"
        ) from None
    if not isinstance(data, dict):
        raise error(
            f"{shown_path(file)}: the saved {what}'s metadata is a JSON {_json_kind(data)}, not an object; "
            "save it again"
        )
    return data


def check_table(
    table: pa.Table, columns: Mapping[str, str], *, where: str, what: str, error: type[NbtError]
) -> None:
    """Each of ``columns`` is in ``table`` with an Arrow type its pandas dtype allows (see read_frame)."""
    names = table.schema.names
    if len(set(names)) != len(names):
        raise error(f"{where}: the saved {what} is damaged: a column name appears twice; save it again")
    for name, dtype in columns.items():
        if name not in names:
            raise error(
                f"{where}: the saved {what} is damaged: the column {name!r} is missing "
                f"(it has {_short(names, 200)}); save it again"
            )
        column = table.column(name)
        problem = _type_problem(column, dtype, table.num_rows)
        if problem:
            raise error(f"{where}: the saved {what} is damaged: the column {name!r} {problem}; save it again")


def _type_problem(column: Any, dtype: str, rows: int) -> str:
    import pyarrow as pa

    kind = column.type
    if pa.types.is_null(kind):
        return (
            ""
            if rows == 0 or dtype in ("Int64", "float64", "object", "str", "any")
            else (f"is empty (all null) where {_WORDS.get(dtype, dtype)} are expected")
        )
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    ok = {
        "int64": pa.types.is_integer(kind),
        "Int64": pa.types.is_integer(kind),
        "float64": pa.types.is_integer(kind) or pa.types.is_floating(kind),
        "bool": pa.types.is_boolean(kind),
        "category": text,
        "str": text,
        "object": text,
        "any": True,
    }.get(dtype, True)
    if not ok:
        return f"holds {column.type}, where {_WORDS.get(dtype, dtype)} are expected"
    if column.null_count and dtype in ("int64", "bool", "category"):
        return f"has {column.null_count:,} missing value(s), where {_WORDS.get(dtype, dtype)} are expected"
    if pa.types.is_unsigned_integer(kind) and kind.bit_width == 64:
        return "holds unsigned 64-bit integers, where int64 values are expected"
    return ""


_WORDS = {
    "int64": "integers",
    "Int64": "integers",
    "float64": "numbers",
    "bool": "true/false values",
    "category": "strings",
    "str": "strings",
    "object": "strings",
}


def check_range(
    frame: pd.DataFrame,
    column: str,
    low: float,
    high: float,
    *,
    where: str,
    what: str,
    error: type[NbtError],
    meaning: str = "",
) -> None:
    """Every value of ``column`` within ``[low, high)`` (NaN counts as outside), or ``error``."""
    import numpy as np

    values = frame[column].to_numpy(dtype="float64", na_value=np.nan)
    bad = ~((values >= low) & (values < high))
    if bad.any():
        first = values[np.flatnonzero(bad)[0]]
        raise error(
            f"{where}: the saved {what} is damaged: {int(bad.sum()):,} value(s) of {column!r} are outside "
            f"[{low:g}, {high:g}){f' ({meaning})' if meaning else ''}, e.g. {first}; save it again"
        )


def folder_to_save(path: Any, meta_name: str, *, what: str, error: type[NbtError] = SaveError) -> Path:
    """The folder to save a ``what`` into, made if missing; refuses a file or another kind of result there."""
    folder = user_path(path, error=error)
    with path_errors(folder, f"save the {what} into", error=error):
        if dangling_link(folder):
            raise error(f"cannot save the {what}: {dangling_link(folder)}")
        if folder.exists() and not folder.is_dir():
            raise error(
                f"cannot save the {what} into {shown_path(folder)}: it is a file; a saved {what} is a "
                "folder. Give a new folder's path"
            )
        mine = folder / meta_name
        if mine.is_file():
            with mine.open("rb") as head:
                ours = b"nbtoolkit" in head.read(256)
            if not ours:  # e.g. a profiler trace named trace.json: saving would overwrite it
                raise error(
                    f"cannot save the {what} into {shown_path(folder)}: its {meta_name} was not written by "
                    f"nbtoolkit, and saving would overwrite it. Give another folder"
                )
        for name, kind in SAVED_KINDS.items():
            if name != meta_name and (folder / name).is_file():
                raise error(
                    f"cannot save the {what} into {shown_path(folder)}: it holds {kind}, which "
                    "saving here would mix with this one. Give another folder, or delete that one first"
                )
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def file_to_save(path: Any, *, what: str, error: type[NbtError] = SaveError) -> Path:
    """The file to save a ``what`` into (its folder made if missing); refuses a folder there."""
    target = user_path(path, error=error)
    with path_errors(target, f"save the {what} to", error=error):
        if dangling_link(target):
            raise error(f"cannot save the {what}: {dangling_link(target)}")
        if target.is_dir():
            raise error(f"cannot save the {what} to {shown_path(target)}: it is a folder; give a file name")
        if target.exists() and not target.is_file():
            raise error(
                f"cannot save the {what} to {shown_path(target)}: it is not a regular file (a device, FIFO "
                "or socket, which would swallow the result or wait forever); give a file name"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
    return target


def _json_kind(value: Any) -> str:
    return {
        dict: "object",
        list: "list",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = shown_path(text, limit)
    return text
