"""``compare(before, after)``: what changed between two traces of the same program.

Numbers compared (``before`` and ``after`` columns, ``delta`` = after - before, ``change_pct``):

- step time: median ProfilerStep duration over all ranks (ms); traces without steps use
  the span of their events. Traces recorded by ``nbt.profile`` carry the machine's load around
  each step: the median is then that of the steps no other work disturbed, and the verdict
  (faster, slower, the same, no measurable change, not comparable) is
  :func:`nbtoolkit.trace.step_time.compare_step_times`'s (``TraceDiff.step_time``);
- time per category, averaged over ranks (ms, :func:`temporal_breakdown`): idle, compute,
  non-compute, and communication / exposed communication (:func:`comm_comp_overlap`);
  divided by the number of analysed steps so that traces with a different number of
  steps compare;
- operators: self CPU time per step of each host operator (ms), the ones that changed
  most in absolute terms first; kernels likewise for device traces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.step_time import StepTimeComparison
    from nbtoolkit.trace.trace import Trace
    from nbtoolkit.trace.trace_diff import TraceDiff

__all__ = ["STEP_TIME", "compare"]

#: the summary's step-time metric
STEP_TIME = "step time (ms, median)"


def compare(before: Trace, after: Trace, *, top: int = 15, include_last_step: bool = False) -> TraceDiff:
    """Before/after comparison of two loaded Traces (see the module docstring for the numbers).

    The analysis behind ``nbt.compare`` (:mod:`nbtoolkit.trace.api`, which also takes paths).
    """
    import pandas as pd

    from nbtoolkit.trace.step_time import LOAD_UNKNOWN, compare_step_times
    from nbtoolkit.trace.trace_diff import TraceDiff

    step_time = compare_step_times(before, after)
    a, b = _summary(before, include_last_step), _summary(after, include_last_step)
    if step_time.verdict != LOAD_UNKNOWN and step_time.before.used_ms and step_time.after.used_ms:
        # the undisturbed steps' medians: what the verdict is about
        a[STEP_TIME] = step_time.before.median_ms
        b[STEP_TIME] = step_time.after.median_ms
    summary = pd.DataFrame({"before": a, "after": b})
    summary["delta"] = summary["after"] - summary["before"]
    with np.errstate(divide="ignore", invalid="ignore"):
        summary["change_pct"] = 100.0 * summary["delta"] / summary["before"].where(summary["before"] != 0)
    summary.index.name = "metric"
    # Operator and kernel tables cover the whole trace, so they are divided by all its steps.
    steps_a, steps_b = _n_steps(before, True), _n_steps(after, True)
    operators = _changed(
        before.top_operators(10**9),
        after.top_operators(10**9),
        "self_us",
        steps_a=steps_a,
        steps_b=steps_b,
        top=top,
    )
    kernels = None
    if before.has_gpu_kernels or after.has_gpu_kernels:
        kernels = _changed(
            before.top_kernels(10**9),
            after.top_kernels(10**9),
            "total_us",
            steps_a=steps_a,
            steps_b=steps_b,
            top=top,
        )
    return TraceDiff(
        summary=summary.reset_index(),
        operators=operators,
        kernels=kernels,
        time_within_noise=_within_noise(step_time),
        step_time=step_time,
    )


def _within_noise(step_time: StepTimeComparison) -> bool | None:
    """Whether the step-time change is noise: the verdict's, or (load unknown) the earlier rule
    that the step durations' middle halves overlap; None when it cannot be told."""
    from nbtoolkit.core.interleaved import FASTER, SLOWER
    from nbtoolkit.trace.step_time import LOAD_UNKNOWN, NOT_COMPARABLE

    if step_time.verdict == LOAD_UNKNOWN:
        return step_time.within_noise
    if step_time.verdict == NOT_COMPARABLE:
        return None
    return step_time.verdict not in (FASTER, SLOWER)


def _n_steps(trace: Trace, include_last_step: bool) -> int:
    from nbtoolkit.trace._kernels import count_step_labels

    steps = trace.steps
    if not len(steps):
        return 1
    n = int(steps.groupby("rank")["step"].nunique().max())
    if count_step_labels(trace) >= 2 and not include_last_step:
        n -= 1
    return max(n, 1)


def _summary(trace: Trace, include_last_step: bool) -> dict[str, float]:
    from nbtoolkit.trace.breakdown import temporal_breakdown
    from nbtoolkit.trace.overlap import comm_comp_overlap

    steps = trace.steps
    if len(steps):
        step_ms = float(steps["dur"].median()) / 1e3
    else:
        spans = [float((f["ts"] + f["dur"]).max() - f["ts"].min()) for f in trace.events.values()]
        step_ms = float(np.median(spans)) / 1e3
    n = _n_steps(trace, include_last_step)
    tb = temporal_breakdown(trace, include_last_step=include_last_step)
    ov = comm_comp_overlap(trace, include_last_step=include_last_step)
    return {
        STEP_TIME: step_ms,
        "idle (ms/step)": float(tb["idle_us"].mean()) / 1e3 / n,
        "compute (ms/step)": float(tb["compute_us"].mean()) / 1e3 / n,
        "non-compute (ms/step)": float(tb["non_compute_us"].mean()) / 1e3 / n,
        "communication (ms/step)": float(ov["comm_time_us"].mean()) / 1e3 / n,
        "exposed communication (ms/step)": float(ov["exposed_comm_us"].mean()) / 1e3 / n,
    }


def _changed(
    a: pd.DataFrame, b: pd.DataFrame, column: str, *, steps_a: int, steps_b: int, top: int
) -> pd.DataFrame:
    import pandas as pd

    left = a.set_index("name")[column] / 1e3 / steps_a
    right = b.set_index("name")[column] / 1e3 / steps_b
    table = pd.DataFrame({"before_ms": left, "after_ms": right}).fillna(0.0)
    table["delta_ms"] = table["after_ms"] - table["before_ms"]
    table.index.name = "name"
    table = table.reset_index()
    table["order"] = -table["delta_ms"].abs()
    table = table.sort_values(["order", "name"], kind="stable").drop(columns="order")
    return table.head(top).reset_index(drop=True)
