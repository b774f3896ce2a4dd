"""What a trace file says about its rank: rank number, world, backend, device type.

The rank comes from ``distributedInfo``; files without it get the rank their file name
states (``rank-34``, ``rank0``, ``worker3``, ``_rank_1``), else rank 0, and the rank's
notes say so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from nbtoolkit.io._kineto_json import Document

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.model.trace import RankInfo

__all__ = ["detect_device_type", "read_rank_info"]

_RANK_IN_NAME_RE = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def read_rank_info(file: Path, doc: Document) -> RankInfo:
    """The rank's metadata from the document's fields (``thread_names``/``device_type`` come later)."""
    from nbtoolkit.model.trace import RankInfo

    notes: list[str] = []
    dist = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    rank = dist.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        matches = list(_RANK_IN_NAME_RE.finditer(file.name))
        match = matches[-1] if matches else None  # the last "rankN"/"workerN" in the name wins
        if match is not None:
            rank = int(match.group(1))
            notes.append(f"rank {rank} taken from the file name {file.name} (no distributedInfo.rank)")
        else:
            rank = 0
            notes.append(
                f"rank unknown (no distributedInfo.rank, none in the file name {file.name}); using 0"
            )
    world = dist.get("world_size")
    schema = doc.schemaVersion
    trace_format = (
        "chrome-array"
        if schema == "chrome-array"
        else f"kineto schema {schema if schema is not None else '?'}"
    )
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else []
    base = doc.baseTimeNanoseconds if isinstance(doc.baseTimeNanoseconds, int) else None
    pg_config = dist.get("pg_config")
    groups = [g for g in pg_config if isinstance(g, dict)] if isinstance(pg_config, list) else []
    return RankInfo(
        rank=int(rank),
        world_size=world if isinstance(world, int) else None,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        device_properties=[p for p in props if isinstance(p, dict)],
        trace_format=trace_format,
        source=str(file),
        base_time_ns=base,
        process_groups=groups,
        notes=notes,
    )


def detect_device_type(info: RankInfo, frame: pd.DataFrame) -> str:
    """cpu (no events on a stream), mtia, rocm, cuda, or gpu (kernels without device properties)."""
    if not bool((frame["stream"].to_numpy() >= 0).any()):
        return "cpu"
    cats = {str(c) for c in frame["cat"].cat.categories}
    if any(c.startswith("mtia") for c in cats):
        return "mtia"
    if info.device_properties:
        first = info.device_properties[0]
        if "gcnArchName" in first or "AMD" in str(first.get("name", "")):
            return "rocm"
        return "cuda"
    return "gpu"
