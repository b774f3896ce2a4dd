"""The notebook side that every configuration sweep shares (DeepSpeed ZeRO, FSDP2): one table row
from every rank's measurements, the baseline's drift over the sweep, and the plain-words changes.

How far step times can be trusted: configurations cannot be interleaved step by step (each is a
wrapped model of its own), so a sweep runs its first configuration again after the last and the
change between the two runs (``drift``) is the machine's own drift over the sweep. A step-time
change is named only when it exceeds the noise band: the larger of :data:`NOISE`, that drift and
the two configurations' step-time spreads (IQR over the timed steps) relative to the baseline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbtoolkit.trace.trace import Trace

__all__ = [
    "NOISE", "change", "differs", "load_traces", "measured_row", "rerun_drift", "slowest_rank_times",
    "spread_share", "sweep_notes", "verb",
]  # fmt: skip

NOISE = 0.10  # changes smaller than 10% are called "no clear change" (timings on shared CPUs)


def slowest_rank_times(results: Sequence[dict[str, Any]]) -> list[float]:
    """Each timed step's time on the slowest rank."""
    return [max(times) for times in zip(*(r["step_times_s"] for r in results), strict=True)]


def load_traces(blobs: list[bytes], *, prefix: str = "nbt-sweep-") -> Trace:
    """One multi-rank Trace from each rank's gzipped profiler trace (rank order)."""
    import shutil
    import tempfile
    from pathlib import Path

    from nbtoolkit.trace.kineto import load_trace

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        for rank, blob in enumerate(blobs):
            (folder / f"rank{rank}.json.gz").write_bytes(blob)
        return load_trace(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measured_row(results: Sequence[dict[str, Any]], *, steps: int) -> tuple[dict[str, Any], Trace]:
    """The measured columns of one configuration's row from every rank's
    :func:`~nbtoolkit.integrations.rank_measure.time_and_profile_on_rank` result, and its trace.

    Step time: median over steps of the slowest rank; communication: per step, mean over ranks;
    collectives per step: rank 0's calls; peak memory: the largest rank's.
    """
    import pandas as pd

    from nbtoolkit.trace.overlap import comm_comp_overlap

    trace = load_traces([r["trace_gz"] for r in results])
    overlap = comm_comp_overlap(trace, include_last_step=True)
    per_call = comm_comp_overlap(trace, by="collective", include_last_step=True)
    times = pd.Series(slowest_rank_times(results))
    row = {
        "step_time_ms": 1e3 * float(times.median()),
        "step_time_spread_ms": 1e3 * float(times.quantile(0.75) - times.quantile(0.25)),
        "comm_ms": float(overlap["comm_time_us"].mean()) / 1e3 / steps,
        "exposed_comm_ms": float(overlap["exposed_comm_us"].mean()) / 1e3 / steps,
        "overlap_pct": float(overlap["overlap_pct"].mean()),
        "collectives_per_step": float((per_call["rank"] == trace.ranks[0]).sum()) / steps,
        "peak_mb": max(r["peak_bytes"] for r in results) / 2**20,
        "state_mb": max(r["state_bytes"] for r in results) / 2**20,
        "loss": results[0]["loss"],
    }
    return row, trace


def rerun_drift(first_ms: float, again: Sequence[dict[str, Any]]) -> float | None:
    """How far the baseline's step time moved when it ran again after the last configuration."""
    import statistics

    again_ms = 1e3 * statistics.median(slowest_rank_times(again))
    return abs(again_ms / first_ms - 1) if first_ms > 0 else None


def change(new: float, old: float) -> float:
    """``(new - old) / old``; NaN where either is missing or ``old`` is 0."""
    return (new - old) / old if old and math.isfinite(old) and math.isfinite(new) else math.nan


def verb(ratio: float, what: str, unit_new: str, unit_old: str, noise: float = NOISE) -> str:
    """``raised/cut <what> by N% (old -> new)``, or "no clear change" within ``noise``."""
    if not math.isfinite(ratio) or abs(ratio) < noise:
        return f"no clear change in {what} ({unit_old} -> {unit_new}, within the ±{noise:.0%} noise)"
    direction = "raised" if ratio > 0 else "cut"
    return f"{direction} {what} by {abs(ratio) * 100:.0f}% ({unit_old} -> {unit_new})"


def spread_share(row: Any, base: Any) -> float:
    """The two rows' step-time spreads together, as a share of the baseline's step time (0 when
    the table has no spreads)."""
    if "step_time_spread_ms" not in row or not base["step_time_ms"]:
        return 0.0
    total = float(row["step_time_spread_ms"]) + float(base["step_time_spread_ms"])
    return total / float(base["step_time_ms"]) if math.isfinite(total) else 0.0


def differs(a: Any, b: Any) -> bool:
    """Whether two knob values differ (None and NaN both mean "default")."""

    def norm(v: Any) -> Any:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

    return bool(norm(a) != norm(b))


def sweep_notes(measure: Any, world_size: int, baseline: str, drift: float | None) -> list[str]:
    """The notes under a sweep's table: how it was timed, why communication is compared only between
    configurations, and the baseline's drift (``measure`` is the sweep's MeasureConfig)."""
    timing = f"{measure.steps} timed steps after {measure.warmup} warmup, then {measure.steps} profiled steps"
    notes = [f"{timing}, {world_size} ranks"]
    notes.append(
        "communication is measured in the profiled steps, which the profiler slows down: compare it "
        "between configurations, not with the step time"
    )
    if drift is not None:
        notes.append(
            f"the baseline {baseline} ran again after the last configuration and its step "
            f"time moved by {drift:.0%}: step-time changes within ±{max(NOISE, drift):.0%} are not named"
        )
    return notes
