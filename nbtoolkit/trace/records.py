"""The plain records of the trace feature, below the Trace and the TraceSummary.

What the readers (:mod:`nbtoolkit.trace._kineto_columns`, :mod:`nbtoolkit.trace._kineto_ranks`),
the Trace (:mod:`nbtoolkit.trace.trace`), the per-rank cache and the TraceSummary share:
the metadata of one rank (:class:`RankInfo`), the columns of the event and collective frames,
and the shape of :meth:`TraceSummary.to_records` (:data:`RECORD_COLUMNS`, :func:`records_problem`).
This module imports nothing of the trace feature but :mod:`nbtoolkit.trace.trace_saved`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import TraceError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "COLLECTIVE_COLUMNS",
    "EVENT_COLUMNS",
    "FRAMES",
    "RECORD_COLUMNS",
    "SPAN_COLUMNS",
    "RankInfo",
    "empty_collectives",
    "records_problem",
]

EVENT_COLUMNS = ("ts", "dur", "name", "cat", "pid", "tid", "stream", "device", "correlation", "external_id")
COLLECTIVE_COLUMNS = (
    "row",
    "collective",
    "in_msg_nelems",
    "out_msg_nelems",
    "group_size",
    "dtype",
    "pg_name",
    "pg_desc",
    "pg_ranks",
)


@dataclass
class RankInfo:
    """What a trace file says about the rank that wrote it."""

    rank: int
    world_size: int | None = None
    backend: str | None = None
    device_type: str = "cpu"  # cuda, rocm, mtia, gpu (kernels without device properties), cpu
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    trace_format: str = "kineto"
    source: str = ""
    base_time_ns: int | None = None
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    thread_names: dict[str, str] = field(default_factory=dict)  # "pid:tid" -> name
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "backend": self.backend,
            "device_type": self.device_type,
            "device_properties": self.device_properties,
            "trace_format": self.trace_format,
            "source": self.source,
            "base_time_ns": self.base_time_ns,
            "process_groups": self.process_groups,
            "thread_names": self.thread_names,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "rank metadata") -> RankInfo:
        """The RankInfo of :meth:`to_json`'s output, each field checked (a TraceError names ``where``)."""
        from nbtoolkit.trace.trace_saved import rank_info

        return cls(**rank_info(data, where))


SPAN_COLUMNS = ("rank", "first_us", "last_us", "events")
FRAMES = ("overlap", "overlap_by_step", "steps", "spans", "temporal")
_OVERLAP = {
    "comm_time_us": "number",
    "overlap_time_us": "number",
    "overlap_pct": "number",
    "exposed_comm_us": "number",
    "method": "text",
}
#: frame -> column -> kind of value in :meth:`TraceSummary.to_records` (int, number or None, text or None)
RECORD_COLUMNS: dict[str, dict[str, str]] = {
    "overlap": {"rank": "int", **_OVERLAP},
    "overlap_by_step": {"rank": "int", "step": "int", **_OVERLAP},
    "steps": {"rank": "int", "step": "int", "ts": "number", "dur": "number"},
    "spans": {"rank": "int", "first_us": "number", "last_us": "number", "events": "int"},
    # temporal_breakdown's table (the percentages are made from these when the frame is built)
    "temporal": {
        "rank": "int",
        "idle_us": "number",
        "compute_us": "number",
        "non_compute_us": "number",
        "span_us": "number",
        "idle_pct": "number",
        "compute_pct": "number",
        "non_compute_pct": "number",
    },
}


def empty_collectives() -> pd.DataFrame:
    """A collectives table without rows (``row`` int64, the rest object)."""
    import numpy as np
    import pandas as pd

    # numpy arrays, not one pd.Series per column: this runs once per rank file, hundreds of times at scale
    return pd.DataFrame(
        {c: np.empty(0, dtype=np.int64 if c == "row" else object) for c in COLLECTIVE_COLUMNS}
    )


def records_problem(records: Any) -> str:
    """What is wrong with ``records`` (:meth:`TraceSummary.to_records`'s shape), or "" when nothing is.

    What a summary cache is checked with before it is used: an edited or damaged cache entry is
    then read again from its trace, never a KeyError in :meth:`TraceSummary.from_records`.
    """
    import math

    from nbtoolkit.core.saved import BOOL, TEXT, list_of

    if not isinstance(records, dict):
        return "not a JSON object"
    if not BOOL.ok(records.get("include_last_step")):
        return "'include_last_step' is not true or false"
    for key in ("step_labels", "notes"):
        if not list_of(TEXT).ok(records.get(key)):
            return f"{key!r} is not a list of strings"
    entries = records.get("info")
    if not isinstance(entries, list) or not entries:
        return "'info' is not a list of rank metadata"
    try:
        ranks = {RankInfo.from_json(entry, "the cached rank metadata").rank for entry in entries}
    except TraceError as exc:
        return str(exc)
    kinds = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63,
        "number": lambda v: (
            v is None
            or (
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and not (isinstance(v, float) and math.isinf(v))
            )
        ),
        "text": lambda v: v is None or isinstance(v, str),
    }
    for name, columns in RECORD_COLUMNS.items():
        part = records.get(name)
        if not isinstance(part, dict) or not isinstance(part.get("data"), dict):
            return f"{name!r} is not a frame"
        if part.get("columns") != list(columns) or set(part["data"]) != set(columns):
            return f"{name!r} does not have the columns {list(columns)}"
        lengths = {len(v) if isinstance(v, list) else -1 for v in part["data"].values()}
        if len(lengths) != 1 or -1 in lengths:
            return f"{name!r} has columns of different lengths"
        for column, kind in columns.items():
            if not all(map(kinds[kind], part["data"][column])):
                return f"{name}.{column} holds a value that is not {'an integer' if kind == 'int' else kind}"
        if not set(part["data"]["rank"]) <= ranks:
            return f"{name!r} names ranks its metadata does not list"
    return ""
