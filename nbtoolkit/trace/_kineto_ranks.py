"""What a trace file says about its rank: rank number, world, backend, device type.

The rank comes from ``distributedInfo``; files without it get the rank their file name
states (``rank-34``, ``rank0``, ``worker3``, ``_rank_1``), else rank 0, and the rank's
notes say so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from nbtoolkit.core.bounded import limit, limit_hint
from nbtoolkit.trace._kineto_json import Document

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.records import RankInfo

__all__ = ["check_same_job", "detect_device_type", "device_type_of", "rank_from_file_name", "read_rank_info"]

_RANK_IN_NAME_RE = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def rank_from_file_name(name: str) -> int | None:
    """The rank a file name states (the last ``rankN``/``workerN`` in it), or None.

    A number of more than 18 digits (no int64 rank) is no rank: None.
    """
    matches = list(_RANK_IN_NAME_RE.finditer(name))
    digits = matches[-1].group(1) if matches else ""
    return int(digits) if digits and len(digits) <= 18 else None


def read_rank_info(file: Path, doc: Document) -> RankInfo:
    """The rank's metadata from the document's fields (``thread_names``/``device_type`` come later)."""
    from nbtoolkit.trace.records import RankInfo

    notes: list[str] = []
    dist = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    most = limit("world_size")
    rank = _believable(dist.get("rank"), most, "distributedInfo.rank", notes, below=True)
    if rank is None:
        rank = rank_from_file_name(file.name)
        if rank is not None and rank >= most:
            notes.append(
                f"the rank in the file name {file.name} is not believed: it is not below "
                f"{limit_hint('world_size', most)}"
            )
            rank = None
        if rank is not None:
            notes.append(f"rank {rank} taken from the file name {file.name} (no distributedInfo.rank)")
        else:
            rank = 0
            notes.append(
                f"rank unknown (no distributedInfo.rank, none in the file name {file.name}); using 0"
            )
    world = _believable(dist.get("world_size"), most, "distributedInfo.world_size", notes, below=False)
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
        world_size=world,
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
    on_stream = bool((frame["stream"].to_numpy() >= 0).any())
    return device_type_of(info, on_stream, map(str, frame["cat"].cat.categories))


def device_type_of(info: RankInfo, on_stream: bool, categories: Iterable[str]) -> str:
    """:func:`detect_device_type` from whether any event is on a stream and the event categories."""
    if not on_stream:
        return "cpu"
    if any(c.startswith("mtia") for c in categories):
        return "mtia"
    if info.device_properties:
        first = info.device_properties[0]
        if "gcnArchName" in first or "AMD" in str(first.get("name", "")):
            return "rocm"
        return "cuda"
    return "gpu"


def _believable(value: object, most: int, field: str, notes: list[str], *, below: bool) -> int | None:
    """``value`` as a rank (``below``: under the limit) or a world size (at most the limit), else None.

    A number past the limit is treated as absent, with a note naming the limit: a rank of
    2**64 or a world of 10**12 is damage, and believing it would size tables by it.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return None
    if value > most or (below and value == most):
        notes.append(
            f"{field} {_short_int(value)} is not believed (treated as absent): it is over "
            f"{limit_hint('world_size', most)}"
        )
        return None
    return value


def _short_int(value: int) -> str:
    text = str(value) if value.bit_length() < 200 else f"a {value.bit_length()}-bit number"
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} digits)"


def check_same_job(root: Path, info: dict[int, RankInfo]) -> None:
    """Refuse a folder whose ranks' ``distributedInfo`` shows they come from different jobs.

    Ranks of one job agree on the world size, the backend and the members of every process
    group they both list; a rank number is below the world size. Fields a file does not
    carry are not compared (older traces lack ``pg_config``, some lack everything). Loading
    two jobs as one trace would compute overlap and stragglers across unrelated runs, so this
    raises a TraceError naming the files of each side rather than splitting silently.
    """
    from nbtoolkit.core.errors import TraceError

    def name(rank: int) -> str:
        return Path(info[rank].source).name

    problems: list[str] = []
    for field, label in (("world_size", "world size"), ("backend", "backend")):
        values: dict[object, list[int]] = {}
        for rank in sorted(info):
            value = getattr(info[rank], field)
            if value is not None:
                values.setdefault(value, []).append(rank)
        if len(values) > 1:
            problems.append(
                f"{label} differs: "
                + "; ".join(f"{value} in {_files(name, ranks)}" for value, ranks in values.items())
            )
    for rank in sorted(info):
        world = info[rank].world_size
        if world is not None and rank >= world:
            problems.append(f"rank {rank} ({name(rank)}) is not below its world size {world}")
    members: dict[str, dict[tuple[int, ...], list[int]]] = {}
    for rank in sorted(info):
        for group in info[rank].process_groups:
            ranks = group.get("ranks")
            if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
                members.setdefault(str(group.get("pg_name")), {}).setdefault(tuple(ranks), []).append(rank)
    for pg_name, variants in members.items():
        if len(variants) > 1:
            problems.append(
                f"process group {pg_name!r} has different members: "
                + "; ".join(
                    f"ranks {_short(list(ranks))} in {_files(name, holders)}"
                    for ranks, holders in variants.items()
                )
            )
    if problems:
        raise TraceError(
            f"{root}: these traces come from different jobs ({'; '.join(problems[:3])}"
            f"{' ...' if len(problems) > 3 else ''}); overlap and stragglers across jobs mean nothing. "
            "Put each job's traces in a folder of their own, or load the files one by one"
        )


def _files(name: Callable[[int], str], ranks: list[int]) -> str:
    shown = ", ".join(name(r) for r in ranks[:3])
    return shown + (f" and {len(ranks) - 3} more" if len(ranks) > 3 else "")


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{', '.join(map(str, ranks[:8]))}, ...] ({len(ranks)})"
