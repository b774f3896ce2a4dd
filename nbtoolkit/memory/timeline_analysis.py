"""Pure functions over memory event frames (see :mod:`nbtoolkit.memory.timeline` for the columns).

No I/O, no printing. Every function takes the events frame of a ``MemoryTimeline`` and
returns a new frame or numbers; inputs are never modified.

Definitions used throughout:

* **running total** ``R[i] = sum(delta_bytes[0..i])``: allocated bytes after event ``i``
  in recording order (events at the same time are applied in their recorded order).
* **peak**: ``max(R)``; the peak event is the first ``i`` with ``R[i] == max(R)``. This is
  the high-water mark of the allocator's live bytes, the quantity torch's
  ``export_memory_timeline`` plots (it sums the same per-allocation deltas), taken
  per event rather than per timestamp so that an allocation freed within the same
  microsecond still counts.
* **category series** ``R_c[i]``: the same running sum restricted to one category.
  A category's *own peak* is ``max(R_c)``; its *bytes at the peak* is ``R_c[peak]``
  (what MemTracker's ``"peak"`` snapshot reports).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = [
    "alive_at_peak",
    "category_peaks",
    "category_series",
    "compare_peaks",
    "decimate",
    "module_attribution",
    "module_spans",
    "peak",
    "phase_attribution",
    "phase_spans",
    "running_total",
]


def running_total(events: pd.DataFrame) -> np.ndarray:
    """``R[i]``: allocated bytes after each event (int64 array, same length as ``events``)."""
    import numpy as np

    return np.cumsum(events["delta_bytes"].to_numpy(dtype="int64"))


def peak(events: pd.DataFrame) -> tuple[int, int]:
    """``(index, bytes)`` of the first event where the running total is highest; ``(-1, 0)`` if empty."""
    if len(events) == 0:
        return -1, 0
    total = running_total(events)
    index = int(total.argmax())
    return index, max(int(total[index]), 0)


def _category_matrix(events: pd.DataFrame) -> tuple[list[str], np.ndarray]:
    """Per-category running sums: (category names, int64 array of shape (n_events, n_categories))."""
    import numpy as np

    from nbtoolkit.memory.schema import CATEGORIES

    codes = events["category"].cat.codes.to_numpy() if hasattr(events["category"], "cat") else None
    if codes is None:
        lookup = {c: i for i, c in enumerate(CATEGORIES)}
        codes = np.array([lookup.get(str(c), len(CATEGORIES) - 1) for c in events["category"]])
    delta = events["delta_bytes"].to_numpy(dtype="int64")
    matrix = np.zeros((len(events), len(CATEGORIES)), dtype="int64")
    if len(events):
        matrix[np.arange(len(events)), codes] = delta
        np.cumsum(matrix, axis=0, out=matrix)
    return list(CATEGORIES), matrix


def category_series(events: pd.DataFrame, *, coalesce: bool = True) -> pd.DataFrame:
    """Allocated bytes per category over time: ``time_us``, one column per category, ``total``.

    ``coalesce`` keeps one row per distinct ``time_us``: the state after the last event
    at that time (torch's ``_coalesce_timeline`` does the same per timestamp).
    """
    import numpy as np
    import pandas as pd

    names, matrix = _category_matrix(events)
    times = events["time_us"].to_numpy(dtype="float64")
    total = running_total(events)
    if coalesce and len(times):
        keep = np.append(times[1:] != times[:-1], True)
        matrix, times, total = matrix[keep], times[keep], total[keep]
    frame = pd.DataFrame(matrix, columns=names, copy=False)
    frame.insert(0, "time_us", times)
    frame["total"] = total
    return frame


def category_peaks(events: pd.DataFrame) -> pd.DataFrame:
    """Per category: ``peak_bytes`` (its own maximum) and ``at_peak_bytes`` (its bytes at the total peak).

    Plus a ``total`` row whose both values are the total peak.
    """
    import pandas as pd

    names, matrix = _category_matrix(events)
    index, total_peak = peak(events)
    rows = []
    for i, name in enumerate(names):
        own = int(matrix[:, i].max()) if len(events) else 0
        at = int(matrix[index, i]) if index >= 0 else 0
        rows.append((name, max(own, 0), at))
    rows.append(("total", total_peak, total_peak))
    return pd.DataFrame(rows, columns=["category", "peak_bytes", "at_peak_bytes"])


def _with_unique_tensor_ids(events: pd.DataFrame) -> pd.DataFrame:
    """Rows without an identity (tensor == -1) each become their own allocation."""
    import numpy as np

    out = events
    missing = out["tensor"].to_numpy() < 0
    if missing.any():
        out = out.copy()
        ids = out["tensor"].to_numpy().copy()
        ids[missing] = -1 - np.arange(int(missing.sum()))
        out["tensor"] = ids
    return out


def alive_at_peak(events: pd.DataFrame, *, top: int | None = 20, at_index: int | None = None) -> pd.DataFrame:
    """Allocations live at the peak event (or at event ``at_index``), largest first.

    An allocation is live at event ``p`` when the sum of its ``delta_bytes`` over events
    ``0..p`` is positive. Its category is the one of its latest positive row (after a
    recategorize), its module/phase/shape/source/stack those of the row that created it.
    Columns: ``tensor, bytes, category, module, phase, shape, source, stack_id, time_us``.
    """
    import pandas as pd

    columns = ["tensor", "bytes", "category", "module", "phase", "shape", "source", "stack_id", "time_us"]
    index = peak(events)[0] if at_index is None else at_index
    if index < 0:
        return pd.DataFrame({c: [] for c in columns})
    upto = _with_unique_tensor_ids(events.iloc[: index + 1])
    live = upto.groupby("tensor", sort=False)["delta_bytes"].sum()
    live = live[live > 0]
    created = upto[upto["delta_bytes"] > 0]
    created = created[created["tensor"].isin(live.index)]
    first = created.groupby("tensor", sort=False).head(1).set_index("tensor")
    last_category = created.groupby("tensor", sort=False)["category"].last()
    frame = pd.DataFrame(
        {
            "tensor": live.index.to_numpy(),
            "bytes": live.to_numpy(dtype="int64"),
        }
    )
    frame["category"] = last_category.reindex(frame["tensor"]).astype(str).to_numpy()
    for name in ("module", "phase", "shape", "source", "stack_id", "time_us"):
        frame[name] = first[name].reindex(frame["tensor"]).to_numpy()
    frame = frame.sort_values(["bytes", "time_us"], ascending=[False, True], kind="stable")
    if top is not None:
        frame = frame.head(top)
    return frame.reset_index(drop=True)


def module_attribution(events: pd.DataFrame) -> pd.DataFrame:
    """Per module path: ``allocations``, ``allocated_bytes`` (sum of its allocations over the
    run), ``at_peak_bytes`` (its allocations live at the peak), and the at-peak bytes split
    by category (``<category>_at_peak_bytes`` for the categories that occur). Memory
    created outside any module has module ``""`` and is listed as ``(no module)``.
    Sorted by ``at_peak_bytes``, then ``allocated_bytes``, descending.
    """
    import pandas as pd

    allocs = events[events["action"].isin(["alloc", "preexisting"])]
    made = allocs.groupby("module", sort=False)["delta_bytes"].agg(["count", "sum"])
    made.columns = ["allocations", "allocated_bytes"]
    alive = alive_at_peak(events, top=None)
    at_peak = alive.groupby("module", sort=False)["bytes"].sum().rename("at_peak_bytes")
    split = alive.pivot_table(index="module", columns="category", values="bytes", aggfunc="sum", fill_value=0)
    split.columns = [f"{c}_at_peak_bytes" for c in split.columns]
    frame = made.join(at_peak, how="outer").join(split, how="left").fillna(0)
    frame = frame.astype("int64").reset_index().rename(columns={"index": "module"})
    frame["module"] = frame["module"].astype(str).replace("", "(no module)")
    frame = frame.sort_values(["at_peak_bytes", "allocated_bytes"], ascending=False, kind="stable")
    return pd.DataFrame(frame).reset_index(drop=True)


def phase_attribution(events: pd.DataFrame) -> pd.DataFrame:
    """Per phase, in PHASES order: ``allocations``, ``allocated_bytes``, ``freed_bytes``,
    ``peak_bytes`` (highest running total at an event of that phase), ``start_us``/``end_us``
    (first and last event time of the phase).
    """
    import pandas as pd

    from nbtoolkit.memory.schema import PHASES

    total = running_total(events)
    frame = events.assign(_total=total)
    rows = []
    for phase_name in PHASES:
        part = frame[frame["phase"] == phase_name]
        if part.empty:
            continue
        created = part[part["action"].isin(["alloc", "preexisting"])]
        freed = part[part["action"] == "free"]
        rows.append(
            (
                phase_name,
                len(created),
                int(created["delta_bytes"].sum()),
                int(-freed["delta_bytes"].sum()),
                int(part["_total"].max()),
                float(part["time_us"].min()),
                float(part["time_us"].max()),
            )
        )
    return pd.DataFrame(
        rows,
        columns=[
            "phase",
            "allocations",
            "allocated_bytes",
            "freed_bytes",
            "peak_bytes",
            "start_us",
            "end_us",
        ],
    )


def _spans(times: np.ndarray, labels: Any, label_name: str) -> pd.DataFrame:
    """Runs of equal consecutive labels; ``labels`` may be a categorical (compared by code)."""
    import numpy as np
    import pandas as pd

    if len(times) == 0:
        return pd.DataFrame({label_name: [], "start_us": [], "end_us": []})
    if isinstance(getattr(labels, "dtype", None), pd.CategoricalDtype):
        keys = np.asarray(labels.cat.codes)
        names = np.asarray(labels.cat.categories, dtype=object)
        decode = lambda idx: names[keys[idx]]  # noqa: E731 - a local one-liner
    else:
        keys = np.asarray(labels, dtype=object)
        decode = lambda idx: keys[idx]  # noqa: E731
    change = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    starts = np.concatenate([[0], change])
    ends = np.minimum(np.concatenate([change, [len(times)]]), len(times) - 1)
    return pd.DataFrame({label_name: decode(starts), "start_us": times[starts], "end_us": times[ends]})


def phase_spans(events: pd.DataFrame) -> pd.DataFrame:
    """Maximal runs of consecutive events in the same phase: ``phase, start_us, end_us``.

    A run ends where the next run starts (its first event's time), so bands tile the axis.
    """
    return _spans(events["time_us"].to_numpy(), events["phase"], "phase")


def module_spans(events: pd.DataFrame) -> pd.DataFrame:
    """Maximal runs of consecutive allocations made by the same module: ``module, start_us, end_us``.

    Only ``alloc`` rows count (frees happen wherever the last reference dies); rows with
    no module are dropped from the result.
    """
    allocs = events[events["action"] == "alloc"]
    spans = _spans(allocs["time_us"].to_numpy(), allocs["module"], "module")
    return spans[spans["module"] != ""].reset_index(drop=True)


def compare_peaks(
    before: pd.DataFrame, after: pd.DataFrame, *, labels: tuple[str, str] = ("before", "after")
) -> pd.DataFrame:
    """Bytes at the total peak per category for two event frames, and the change.

    Columns: ``category``, ``<a>_bytes``, ``<b>_bytes``, ``delta_bytes`` (b - a),
    ``change_pct`` (100 * delta / a; NaN where a is 0). Last row: ``total`` (the peaks).
    Categories that are zero in both runs are left out.
    """
    a, b = labels
    pa = category_peaks(before).set_index("category")["at_peak_bytes"]
    pb = category_peaks(after).set_index("category")["at_peak_bytes"]
    frame = pa.rename(f"{a}_bytes").to_frame().join(pb.rename(f"{b}_bytes"), how="outer").fillna(0)
    frame = frame.astype("int64")
    frame = frame[(frame[f"{a}_bytes"] != 0) | (frame[f"{b}_bytes"] != 0) | (frame.index == "total")]
    order = [c for c in frame.index if c != "total"] + ["total"]
    frame = frame.loc[order]
    frame["delta_bytes"] = frame[f"{b}_bytes"] - frame[f"{a}_bytes"]
    base = frame[f"{a}_bytes"].astype("float64")
    frame["change_pct"] = (100.0 * frame["delta_bytes"] / base.where(base != 0)).astype("float64")
    return frame.reset_index().rename(columns={"index": "category"})


def decimate(series: pd.DataFrame, *, max_points: int = 4000, value: str = "total") -> pd.DataFrame:
    """At most about ``max_points`` rows of a time series frame, keeping every local peak.

    Algorithm: split the time axis into ``max_points // 2`` equal-width bins; in each bin
    keep the row with the largest ``value`` and the row with the smallest (so peaks and
    troughs survive), plus the first and last rows. Rows keep their order. A series that
    is already short enough is returned unchanged.
    """
    import numpy as np

    n = len(series)
    if n <= max_points:
        return series
    times = series["time_us"].to_numpy(dtype="float64")
    values = series[value].to_numpy()
    bins = max(max_points // 2, 1)
    span = times[-1] - times[0]
    if span <= 0:
        edges = np.minimum(np.arange(n) * bins // n, bins - 1)
    else:
        edges = np.minimum(((times - times[0]) / span * bins).astype("int64"), bins - 1)
    order = np.lexsort((values, edges))  # sorted by bin, then by value
    bin_sorted = edges[order]
    first_in_bin = np.flatnonzero(np.r_[True, bin_sorted[1:] != bin_sorted[:-1]])
    last_in_bin = np.r_[first_in_bin[1:] - 1, n - 1]
    keep = np.unique(np.concatenate([order[first_in_bin], order[last_in_bin], [0, n - 1]]))
    return series.iloc[keep].reset_index(drop=True)
