"""Two runs' memory side by side (:func:`memory_diff`) and many ranks' (:func:`memory_imbalance`).

Algorithm of :func:`memory_diff` (``a`` before, ``b`` after):

1. Each side becomes a timeline (a snapshot: its ``timeline(device)``; a
   :class:`~nbtoolkit.recompute.comparison.Measurement` of ``nbt.optimize``: its
   ``peak_by_category`` only).
2. **By category**: each category's bytes live at its side's total peak
   (:func:`nbtoolkit.memory.timeline_analysis.category_peaks`), ``delta = b - a``.
3. **By stack**: bytes live at each side's peak per allocating stack (the stack text, so two
   recordings of the same code match), ``delta = b - a``; stacks whose bytes did not change are
   left out, the largest change (either sign) first.
4. **Totals**: the peak; for two snapshots also reserved and allocated bytes
   (:meth:`MemorySnapshot.stats`, torch's ``_memory_viz stats`` definitions).

A diff of anything with itself is therefore empty: every delta is 0 and no stack changed.

:func:`memory_imbalance`: per rank the peak and its categories; the *top* rank (highest peak) is
compared with the *baseline* rank (the median peak, the lower one of the middle two): the
category whose bytes at the peak differ most, and the stacks that differ (step 3 above).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.inputs import is_path
from nbtoolkit.memory.breakdown import MemoryTimeline, as_timeline, is_snapshot, stack_bytes_at_peak
from nbtoolkit.memory.reports import MemoryDiff, MemoryImbalance

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["memory_diff", "memory_imbalance", "stack_diff"]


def _is_measurement(value: Any) -> bool:
    # nbt.optimize's Measurement (nbtoolkit.recompute.comparison), told apart by what it holds: its
    # module's Comparison.memory_diff imports this one, so importing it back would close a cycle.
    return hasattr(value, "peak_by_category") and hasattr(value, "total_peak_bytes")


def _categories(data: Any) -> dict[str, int]:
    """Bytes per category at the peak, and "total" (the peak)."""
    if _is_measurement(data):
        out = {str(k): int(v) for k, v in data.peak_by_category.items()}
        out["total"] = int(data.total_peak_bytes if data.total_peak_bytes is not None else data.peak_bytes)
        return out
    from nbtoolkit.memory.timeline_analysis import category_peaks

    peaks = category_peaks(data.events)
    return {str(r.category): int(r.at_peak_bytes) for r in peaks.itertuples()}


def stack_diff(a: MemoryTimeline, b: MemoryTimeline, names: tuple[str, str] = ("a", "b")) -> pd.DataFrame:
    """Stacks whose bytes live at the peak differ: ``stack, <a>_bytes, <b>_bytes, delta_bytes``."""
    left = stack_bytes_at_peak(a).set_index("stack")["bytes"].rename(f"{names[0]}_bytes")
    right = stack_bytes_at_peak(b).set_index("stack")["bytes"].rename(f"{names[1]}_bytes")
    both = left.to_frame().join(right, how="outer").fillna(0).astype("int64")
    both["delta_bytes"] = both[f"{names[1]}_bytes"] - both[f"{names[0]}_bytes"]
    both = both[both["delta_bytes"] != 0]
    both = both.assign(_order=both["delta_bytes"].abs()).sort_values(
        ["_order"], ascending=False, kind="stable"
    )
    return both.drop(columns="_order").reset_index().rename(columns={"index": "stack"})


def memory_diff(
    a: Any,
    b: Any,
    *,
    labels: tuple[str, str] = ("a", "b"),
    device: int | None = None,
) -> MemoryDiff:
    """What grew from ``a`` to ``b`` (see the module docstring for the algorithm).

    ``a`` and ``b``: each a MemorySnapshot, a MemoryTimeline, or a Measurement (``nbt.optimize``'s
    ``before``/``after``; then only categories and the peak compare). ``device``: for snapshots.
    """
    import pandas as pd

    notes: list[str] = []
    measured = _is_measurement(a) or _is_measurement(b)
    left = a if _is_measurement(a) else as_timeline(a, device)
    right = b if _is_measurement(b) else as_timeline(b, device)
    cats_a, cats_b = _categories(left), _categories(right)
    names = [c for c in dict.fromkeys([*cats_a, *cats_b]) if c != "total"]
    by_category = pd.DataFrame(
        {
            "category": names,
            "a_bytes": [cats_a.get(c, 0) for c in names],
            "b_bytes": [cats_b.get(c, 0) for c in names],
        }
    )
    by_category["delta_bytes"] = by_category["b_bytes"] - by_category["a_bytes"]
    by_category = by_category[(by_category["a_bytes"] != 0) | (by_category["b_bytes"] != 0)].reset_index(
        drop=True
    )
    totals = [("peak", cats_a.get("total", 0), cats_b.get("total", 0))]
    if is_snapshot(a) and is_snapshot(b):
        sa, sb = a.stats(), b.stats()
        totals += [
            ("reserved", sa.total_reserved, sb.total_reserved),
            ("allocated", sa.total_allocated, sb.total_allocated),
        ]
    totals_frame = pd.DataFrame(totals, columns=["total", "a_bytes", "b_bytes"])
    totals_frame["delta_bytes"] = totals_frame["b_bytes"] - totals_frame["a_bytes"]
    if measured:
        by_stack = pd.DataFrame({"stack": [], "a_bytes": [], "b_bytes": [], "delta_bytes": []})
        notes.append("measurements keep categories only: no stacks to compare")
    else:
        by_stack = stack_diff(left, right)
    return MemoryDiff(
        by_category=by_category, by_stack=by_stack, totals=totals_frame, labels=labels, notes=notes
    )


def _rank_timelines(ranks: Any) -> dict[int, MemoryTimeline]:
    # a RankMemory (nbtoolkit.memory.rank_memory), told apart by its timelines: its
    # imbalance_report() imports this module, so importing it back would close a cycle
    if isinstance(getattr(ranks, "timelines", None), Mapping):
        return dict(ranks.timelines)
    if is_path(ranks):  # analysis reads no files: nbt.memory_imbalance loads a folder before calling this
        raise NbtUsageError(
            "memory_imbalance() of the analysis takes loaded snapshots: read the folder with "
            "nbt.load_rank_snapshots (nbt.memory_imbalance does that for a path)"
        )
    if isinstance(ranks, Mapping):
        return {int(r): as_timeline(v) for r, v in ranks.items()}
    if isinstance(ranks, (list, tuple)):
        return {r: as_timeline(v) for r, v in enumerate(ranks)}
    raise NbtUsageError(
        "memory_imbalance() takes a RankMemory, {rank: snapshot or timeline}, a list in rank order, "
        f"or a folder of per-rank snapshots (nbt.load_rank_snapshots); got {type(ranks).__name__}"
    )


def memory_imbalance(ranks: Any) -> MemoryImbalance:
    """Which rank peaks highest and why (see the module docstring)."""
    import pandas as pd

    timelines = _rank_timelines(ranks)
    if not timelines:
        raise NbtUsageError("memory_imbalance() needs at least one rank")
    rows = []
    for rank in sorted(timelines):
        row: dict[str, Any] = {"rank": rank}
        row.update({f"{k}_bytes": v for k, v in _categories(timelines[rank]).items() if k != "total"})
        row["peak_bytes"] = timelines[rank].peak_bytes
        rows.append(row)
    peaks = pd.DataFrame(rows).fillna(0)
    category_columns = [c for c in peaks.columns if c not in ("rank", "peak_bytes")]
    used = [c for c in category_columns if (peaks[c] != 0).any()]
    peaks = peaks[["rank", "peak_bytes", *used]].astype("int64")
    order = peaks.sort_values(["peak_bytes", "rank"], kind="stable")
    top_rank = int(order["rank"].iloc[-1])
    baseline_rank = int(order["rank"].iloc[(len(order) - 1) // 2])
    top = peaks.set_index("rank").loc[top_rank]
    base = peaks.set_index("rank").loc[baseline_rank]
    deltas = {c: int(top[c]) - int(base[c]) for c in used}
    category = max(deltas, key=lambda c: deltas[c]) if deltas else "unknown_bytes"
    lowest = int(order["peak_bytes"].iloc[0])
    return MemoryImbalance(
        peaks=peaks.reset_index(drop=True),
        top_rank=top_rank,
        baseline_rank=baseline_rank,
        category=category.removesuffix("_bytes"),
        category_delta_bytes=deltas.get(category, 0),
        by_stack=stack_diff(
            timelines[baseline_rank], timelines[top_rank], (f"rank{baseline_rank}", f"rank{top_rank}")
        )
        if top_rank != baseline_rank
        else pd.DataFrame({"stack": [], "delta_bytes": []}),
        ratio=int(top["peak_bytes"]) / lowest if lowest > 0 else 1.0,
    )
