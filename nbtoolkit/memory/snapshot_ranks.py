"""A folder of per-rank allocator snapshots as a :class:`~nbtoolkit.memory.rank_memory.RankMemory`.

Distributed jobs dump one snapshot per rank (``snapshot_rank0.pickle``, ``rank_1.pkl``,
``mem-r2.pickle`` ...). The rank of a file is the number after ``rank`` (or ``r``) in its name,
else the last number in it; two files of one rank are an error naming both. Each snapshot is
read with :func:`nbtoolkit.memory.snapshot_reader.load_memory_snapshot` (streaming, filters and limits
alike) and becomes the timeline of its rank's device; the snapshot itself stays reachable as
``rank_memory.timeline(r).allocator_snapshot``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import SnapshotError
from nbtoolkit.core.inputs import is_path, wrong_type
from nbtoolkit.core.paths import user_path

if TYPE_CHECKING:
    from nbtoolkit.memory.rank_memory import RankMemory

__all__ = ["SNAPSHOT_SUFFIXES", "load_rank_snapshots", "rank_of"]

SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".pickle.gz", ".pkl.gz")
_RANK = re.compile(r"(?:rank|(?<![a-z])r)[_\-.]?(\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"(\d+)")


def rank_of(name: str) -> int | None:
    """The rank a file name states (``rank3``, ``rank_3``, ``r3``, else its last number), or None."""
    found = _RANK.findall(name)
    if found:
        return int(found[-1])
    numbers = _NUMBER.findall(name)
    return int(numbers[-1]) if numbers else None


def load_rank_snapshots(folder: str | Path, *, device: int | None = None, **load: Any) -> RankMemory:
    """One timeline per rank from a folder of per-rank snapshots (see the module docstring).

    ``device``: which device of each snapshot (default: the one with the most trace entries);
    ``load``: passed to ``load_memory_snapshot`` (``time_range_us=``, ``max_bytes=``, ``stream=``...).
    """
    from nbtoolkit.memory.rank_memory import RankMemory
    from nbtoolkit.memory.snapshot_reader import load_memory_snapshot

    if not is_path(folder):
        raise wrong_type("load_rank_snapshots()", "a folder of per-rank snapshot files", folder)
    root = user_path(folder, error=SnapshotError)
    if not root.is_dir():
        raise SnapshotError(f"{root} is not a folder; pass the folder holding one snapshot per rank")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.name.lower().endswith(SNAPSHOT_SUFFIXES))
    if not files:
        raise SnapshotError(f"{root} holds no snapshot files ({', '.join(SNAPSHOT_SUFFIXES)})")
    by_rank: dict[int, Path] = {}
    for index, path in enumerate(files):
        rank = rank_of(path.name.split(".")[0])
        rank = index if rank is None else rank
        if rank in by_rank:
            raise SnapshotError(
                f"{by_rank[rank].name} and {path.name} both look like rank {rank}; "
                "name each rank's snapshot with its rank (e.g. snapshot_rank3.pickle)"
            )
        by_rank[rank] = path
    timelines = {}
    for rank, path in sorted(by_rank.items()):
        snapshot = load_memory_snapshot(path, **load)
        timeline = snapshot.timeline(device)
        timeline.allocator_snapshot = snapshot
        timelines[rank] = timeline
    return RankMemory(timelines=timelines)
