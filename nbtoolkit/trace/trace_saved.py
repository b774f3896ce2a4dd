"""What ``Trace.load`` checks in a saved trace folder (see :mod:`nbtoolkit.core.saved`).

The schema is the one the reader builds (:mod:`nbtoolkit.trace.trace`'s module docstring):
``trace.json`` holds the notes and one ``RankInfo`` per rank; ``rank<N>.events.parquet`` the
events, sorted by start, with finite times and non-negative durations;
``rank<N>.collectives.parquet`` (when the rank has collectives) rows pointing into the events.
``trace.json``'s ``step_load`` (traces of ``nbt.profile`` only) holds one
:class:`~nbtoolkit.trace.step_load.StepLoad` per rank, keyed by the rank in decimal.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import TraceError
from nbtoolkit.core.paths import shown_path
from nbtoolkit.core.saved import (
    ANY,
    INT,
    NUMBER,
    TEXT,
    Check,
    check_fields,
    check_range,
    dict_of,
    list_of,
    optional,
    read_frame,
)

if TYPE_CHECKING:
    import pandas as pd

if TYPE_CHECKING:
    from nbtoolkit.trace.step_load import StepLoad

__all__ = [
    "COLLECTIVE_DTYPES",
    "EVENT_DTYPES",
    "RANK_INFO_FIELDS",
    "STEP_LOAD_FIELDS",
    "check_meta",
    "rank_info",
    "read_rank",
    "read_step_load",
]

#: column -> the pandas dtype the reader gives it (and Trace.save writes)
EVENT_DTYPES = {
    "ts": "float64",
    "dur": "float64",
    "name": "category",
    "cat": "category",
    "pid": "int64",
    "tid": "int64",
    "stream": "int64",
    "device": "int64",
    "correlation": "int64",
    "external_id": "int64",
}
COLLECTIVE_DTYPES = {
    "row": "int64",
    "collective": "object",
    "in_msg_nelems": "Int64",
    "out_msg_nelems": "Int64",
    "group_size": "Int64",
    "dtype": "object",
    "pg_name": "object",
    "pg_desc": "object",
    "pg_ranks": "object",
}
_NON_NEGATIVE = Check("an integer from 0 to 2**63 - 1", lambda v: INT.ok(v) and v >= 0)
#: RankInfo field -> (check, default); ``rank`` is required
RANK_INFO_FIELDS: dict[str, tuple[Check, Any]] = {
    "rank": (_NON_NEGATIVE, None),
    "world_size": (optional(INT), None),  # what the trace said, as the reader keeps it
    "backend": (optional(TEXT), None),
    "device_type": (TEXT, "cpu"),
    "device_properties": (list_of(dict_of(TEXT, ANY)), []),
    "trace_format": (TEXT, "kineto"),
    "source": (TEXT, ""),
    "base_time_ns": (optional(INT), None),
    "process_groups": (list_of(dict_of(TEXT, ANY)), []),
    "thread_names": (dict_of(TEXT, TEXT), {}),
    "notes": (list_of(TEXT), []),
}
#: StepLoad field -> (check, default); the step lists are required
STEP_LOAD_FIELDS: dict[str, tuple[Check, Any]] = {
    "probes_s": (list_of(NUMBER), None),
    "probe_waits_s": (list_of(NUMBER), []),
    "wall_s": (list_of(NUMBER), None),
    "cpu_s": (list_of(NUMBER), None),
    "wait_s": (list_of(NUMBER), []),
    "machine_busy": (optional(NUMBER), None),
    "cores": (optional(_NON_NEGATIVE), None),
}
_INT64_MAX = 2**63 - 1


def rank_info(entry: Any, where: str) -> dict[str, Any]:
    """The fields of a RankInfo's JSON (``RankInfo.to_json``), each checked; TraceError naming ``where``."""
    return check_fields(entry, RANK_INFO_FIELDS, where=where, error=TraceError, required=("rank",))


def check_meta(meta: dict[str, Any], meta_path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The notes and rank infos' fields of ``trace.json``, checked (ranks present and distinct)."""
    where = shown_path(meta_path)
    fields = check_fields(
        meta,
        {"notes": (list_of(TEXT), []), "ranks": (list_of(ANY), None)},
        where=where,
        error=TraceError,
        required=("ranks",),
    )
    if not fields["ranks"]:
        raise TraceError(f"{where}: the saved Trace lists no ranks; the file is damaged, save it again")
    infos = [rank_info(entry, f"{where}, ranks[{i}]") for i, entry in enumerate(fields["ranks"])]
    ranks = [info["rank"] for info in infos]
    if len(set(ranks)) != len(ranks):
        twice = sorted({r for r in ranks if ranks.count(r) > 1})[:5]
        raise TraceError(f"{where}: rank(s) {twice} are listed twice; the file is damaged, save it again")
    return list(fields["notes"]), infos


def read_step_load(meta: dict[str, Any], meta_path: Path, *, ranks: set[int]) -> dict[int, StepLoad]:
    """The ``step_load`` of ``trace.json`` (empty when absent: a trace of another tool), each checked."""
    from nbtoolkit.trace.step_load import StepLoad

    where = shown_path(meta_path)
    entries = meta.get("step_load", {})
    if not isinstance(entries, dict):
        raise TraceError(f"{where}: 'step_load' should be an object (rank -> load); save the trace again")
    loads: dict[int, StepLoad] = {}
    for key, entry in entries.items():
        rank = int(key) if key.isdecimal() and len(key) < 19 else None
        if rank is None or rank not in ranks:
            raise TraceError(
                f"{where}: step_load names rank {key[:20]!r}, which is not a rank of the trace; "
                "the file is damaged, save it again"
            )
        fields = check_fields(
            entry,
            STEP_LOAD_FIELDS,
            where=f"{where}, step_load[{rank}]",
            error=TraceError,
            required=("probes_s", "wall_s", "cpu_s"),
        )
        load = StepLoad(**{name: _as_float(value) for name, value in fields.items() if name != "cores"})
        load.cores = fields["cores"]
        problem = load.problem()
        if problem:
            raise TraceError(f"{where}, step_load[{rank}]: {problem}; the file is damaged, save it again")
        loads[rank] = load
    return loads


def _as_float(value: Any) -> Any:
    """JSON numbers as floats (a list of them, None kept): 0 and 0.0 read alike."""
    if isinstance(value, list):
        return [float(v) for v in value]
    return None if value is None else float(value)


def read_rank(folder: Path, rank: int) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The events and collectives frames (None: no file) of one rank, checked against the reader's schema."""
    import numpy as np

    path = folder / f"rank{rank}.events.parquet"
    where = shown_path(path)
    events = read_frame(path, EVENT_DTYPES, what="Trace", error=TraceError)
    ts, dur = events["ts"].to_numpy(), events["dur"].to_numpy()
    bad = ~np.isfinite(ts) | ~(dur >= 0) | ~np.isfinite(dur) | (np.abs(ts) * 1e3 > _INT64_MAX)
    bad |= dur * 1e3 > _INT64_MAX
    if bad.any():
        raise TraceError(
            f"{where}: the saved Trace is damaged: {int(bad.sum()):,} event(s) have a missing, infinite or "
            "negative time or duration; save it again"
        )
    if len(ts) > 1 and bool((ts[1:] < ts[:-1]).any()):
        raise TraceError(f"{where}: the saved Trace is damaged: events are not in time order; save it again")
    coll_path = folder / f"rank{rank}.collectives.parquet"
    if not coll_path.is_file():
        return events, None
    collectives = read_frame(coll_path, COLLECTIVE_DTYPES, what="Trace", error=TraceError)
    check_range(
        collectives,
        "row",
        0,
        len(events),
        where=shown_path(coll_path),
        what="Trace",
        error=TraceError,
        meaning="rows of the rank's events",
    )
    return events, collectives
