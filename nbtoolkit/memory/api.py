"""The public functions of the memory feature that accept where to find their input.

Each loads what it is given a path of, then calls the analysis, which takes loaded objects only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbtoolkit.memory.reports import MemoryImbalance

__all__ = ["memory_imbalance"]


def memory_imbalance(ranks: Any) -> MemoryImbalance:
    """Which rank peaks highest and why (the analysis: :func:`nbtoolkit.memory.diff.memory_imbalance`).

    ``ranks``: a RankMemory, ``{rank: snapshot or timeline}``, a list in rank order, or a folder of
    per-rank snapshots. A folder is read here (``nbt.load_rank_snapshots``): the analysis reads no files.
    """
    from nbtoolkit.core.inputs import is_path
    from nbtoolkit.memory.diff import memory_imbalance as imbalance_of
    from nbtoolkit.memory.snapshot_ranks import load_rank_snapshots

    return imbalance_of(load_rank_snapshots(ranks) if is_path(ranks) else ranks)
