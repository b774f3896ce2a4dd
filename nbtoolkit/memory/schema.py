"""The vocabulary of memory events: categories, phases, the event columns, the per-rank peak columns.

Apart from :mod:`nbtoolkit.memory.timeline` (the MemoryTimeline) so that the analyses and figures
the timeline's methods import can name these without importing the timeline back: no import
cycle. :mod:`nbtoolkit.memory.timeline` and :mod:`nbtoolkit.memory.rank_memory` re-export them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CATEGORIES", "EVENT_COLUMNS", "PEAK_COLUMNS", "PHASES", "TORCH_CATEGORIES", "category_columns"]

#: torch.profiler._memory_profiler.Category names (lower case) in torch's index order (the
#: category codes of ``export_memory_timeline``'s raw rows), "unknown" last for torch's ``None``.
TORCH_CATEGORIES: tuple[str, ...] = (
    "parameter",
    "optimizer_state",
    "input",
    "temporary",
    "activation",
    "gradient",
    "autograd_detail",
    "unknown",
)

#: torch's categories, FSDP2's unsharded parameters and gradients (the whole tensors of the block
#: that runs; see nbtoolkit.memory.sharded), and "unknown" for memory no rule could classify
#: (torch's ``None`` category, grey in its plots).
CATEGORIES: tuple[str, ...] = (
    *TORCH_CATEGORIES[:-1],
    "unsharded_parameter",
    "unsharded_gradient",
    "unknown",
)

PHASES: tuple[str, ...] = ("before", "forward", "backward", "optimizer", "other")

EVENT_COLUMNS: tuple[str, ...] = (
    "time_us",
    "action",
    "delta_bytes",
    "category",
    "tensor",
    "module",
    "phase",
    "shape",
    "source",
    "stack_id",
)

#: the first columns of a RankMemory.peaks() table; the category columns follow them
PEAK_COLUMNS = ("rank", "peak_bytes", "peak_time_us")


def category_columns(peaks: pd.DataFrame) -> list[str]:
    """The category columns of a :meth:`RankMemory.peaks` table (those after its first three)."""
    return [c for c in peaks.columns if c not in PEAK_COLUMNS]
