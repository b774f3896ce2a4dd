"""Does communication hide behind computation? Per rank, per iteration, per collective call.

GPU/accelerator ranks use HolisticTraceAnalysis's definition (HTA 0.5
``get_comm_comp_overlap``) and give its number:

- communication time = union of the intervals of communication kernels
  (``nccl...Kernel``, which RCCL keeps, as in HTA; HCCL kernels too, see
  ``nbtoolkit.trace._kernels``);
- overlap time = the part of it during which at least one COMPUTATION kernel runs
  (memcpy/memset and sync events are neither);
- ``overlap_pct = 100 * overlap / communication``; ``exposed_comm_us = communication -
  overlap`` is the communication nothing hides (nbtoolkit's addition).

CPU ranks (no device kernels, e.g. DDP with gloo) have no HTA definition; nbtoolkit's:

- communication = union of the collectives' intervals: host events named ``gloo:*``
  (the annotations and ops of gloo collectives, on any thread, including gloo's own
  worker threads);
- compute = union of the rank's own operators (``cpu_op`` events) on its *main threads*
  (threads with at least one operator that is not communication), leaving out
  communication ops themselves (names starting ``gloo:``, ``c10d``, ``nccl:``,
  ``record_param_comms``, ``ProcessGroup``) and leaving out the time when that same
  thread is inside such a communication op (a thread blocked in a collective is not
  computing);
- overlap, overlap_pct and exposed_comm_us as above.

Windows: like HTA, the last ProfilerStep is left out unless ``include_last_step=True``
(only when the trace has two or more ProfilerStep labels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.profiler_steps import step_number_table
from nbtoolkit.trace import _kernels as k
from nbtoolkit.trace import kernel_types as kt
from nbtoolkit.trace._gloo_calls import gloo_call_collectives
from nbtoolkit.trace._intervals import covered_per_interval, intersection_length, merge
from nbtoolkit.trace.kernel_types import COMM_PREFIXES

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = [
    "OVERLAP_BY_STEP_COLUMNS",
    "OVERLAP_COLUMNS",
    "collective_calls",
    "comm_comp_overlap",
    "host_comm_and_compute",
    "host_comm_and_compute_of_view",
    "overlap_by_rank_and_step",
    "rank_overlap_rows",
]

_CALL_COLUMNS = ["ts", "end", "name", "collective", "step", "external_id"]
_MESSAGE_FIELDS = ("in_msg_nelems", "out_msg_nelems", "dtype", "pg_name")
Intervals = tuple[np.ndarray, np.ndarray]


def comm_comp_overlap(
    trace: Trace,
    *,
    by: Literal["rank", "iteration", "collective"] = "rank",
    include_last_step: bool = False,
) -> pd.DataFrame:
    """Communication/computation overlap of a loaded Trace (definitions in the module docstring).

    The analysis behind ``nbt.comm_comp_overlap`` (:mod:`nbtoolkit.trace.api`, which also takes a
    path or a TraceSummary, and documents ``by`` and ``include_last_step``).
    """
    import pandas as pd

    if by not in ("rank", "iteration", "collective"):
        raise NbtUsageError(f"by must be 'rank', 'iteration' or 'collective', got {by!r}")
    rows: list[dict[str, object]] = []
    for rank in trace.ranks:
        calls = _comm_and_comp(trace, rank, include_last_step=include_last_step)
        comp = merge(*calls.comp)
        if by == "rank":
            rows.append({"rank": rank, **_overlap_numbers(merge(*calls.comm), comp), "method": calls.method})
        elif by == "iteration":
            rows.extend(_by_step(rank, calls))
        else:
            table = _calls_frame(trace, rank, calls)
            dur = calls.comm[1] - calls.comm[0]
            covered = covered_per_interval(calls.comm[0], calls.comm[1], comp)
            with np.errstate(invalid="ignore", divide="ignore"):
                pct = np.where(dur > 0, 100.0 * covered / np.where(dur > 0, dur, 1.0), np.nan)
            meta = _collective_metadata(trace, rank)
            for i, call in enumerate(table.itertuples(index=False)):
                found = meta.get(int(call.external_id), {})
                rows.append(
                    {
                        "rank": rank,
                        "name": str(call.name),
                        "collective": found.get("collective") or call.collective,
                        "ts": float(call.ts),
                        "dur_us": float(dur[i]),
                        "overlap_time_us": float(covered[i]),
                        "overlap_pct": float(pct[i]),
                        "exposed_comm_us": float(dur[i] - covered[i]),
                        **{f: found.get(f) for f in _MESSAGE_FIELDS},
                    }
                )
    columns = {
        "rank": ["rank", "comm_time_us", "overlap_time_us", "overlap_pct", "exposed_comm_us", "method"],
        "iteration": [
            "rank",
            "step",
            "comm_time_us",
            "overlap_time_us",
            "overlap_pct",
            "exposed_comm_us",
            "method",
        ],
        "collective": [
            "rank",
            "name",
            "collective",
            "ts",
            "dur_us",
            "overlap_time_us",
            "overlap_pct",
            "exposed_comm_us",
            *_MESSAGE_FIELDS,
        ],
    }[by]
    return pd.DataFrame(rows, columns=columns)


def overlap_by_rank_and_step(
    trace: Trace, *, include_last_step: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``comm_comp_overlap`` by rank and by iteration at once (each rank's events are classified once).

    What :func:`nbtoolkit.trace.summarize_rank.summarize_trace` keeps of every rank at scale.
    """
    import pandas as pd

    by_rank: list[dict[str, object]] = []
    by_step: list[dict[str, object]] = []
    for rank in trace.ranks:
        view = k.device_view(trace, rank, include_last_step=include_last_step)
        rank_row, step_rows = rank_overlap_rows(view)
        by_rank.append(rank_row)
        by_step.extend(step_rows)
    return (
        pd.DataFrame(by_rank, columns=OVERLAP_COLUMNS),
        pd.DataFrame(by_step, columns=OVERLAP_BY_STEP_COLUMNS),
    )


_NUMBERS = ["comm_time_us", "overlap_time_us", "overlap_pct", "exposed_comm_us", "method"]
OVERLAP_COLUMNS = ["rank", *_NUMBERS]
OVERLAP_BY_STEP_COLUMNS = ["rank", "step", *_NUMBERS]


def rank_overlap_rows(view: k.EventView) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The overlap row of one rank's view and its rows by step (the columns above), no frame built.

    ``view``: a :class:`~nbtoolkit.trace._kernels.DeviceView`, or the lean summarizer's view of
    the same events (:mod:`nbtoolkit.trace.summarize_rank_lean`), which has its interface.
    """
    calls = _calls_of_view(view)
    overlap = _overlap_numbers(merge(*calls.comm), merge(*calls.comp))
    return {"rank": view.rank, **overlap, "method": calls.method}, _by_step(view.rank, calls)


def collective_calls(trace: Trace, rank: int, *, include_last_step: bool = False) -> pd.DataFrame:
    """A rank's communication calls, in start order: ts, end, name, collective, step, external_id.

    The calls ``comm_comp_overlap(by="collective")`` measures (NCCL kernels, or gloo's host ops);
    ``step`` is the ProfilerStep that launched each (-1 outside steps). What the cross-rank
    critical path (:mod:`nbtoolkit.trace.critical_path_ranks`) matches across ranks.
    """
    calls = _comm_and_comp(trace, rank, include_last_step=include_last_step)
    table = _calls_frame(trace, rank, calls)
    return table.sort_values("ts", kind="stable", ignore_index=True)


def _by_step(rank: int, calls: _RankCalls) -> list[dict[str, object]]:
    """The overlap rows of each step of a rank (steps with communication; -1, outside steps, left out)."""
    rows: list[dict[str, object]] = []
    comm_ts, comm_end = calls.comm
    comp_ts, comp_end = calls.comp
    for step in np.unique(calls.comm_steps):
        if step < 0:
            continue
        in_comm, in_comp = calls.comm_steps == step, calls.comp_steps == step
        numbers = _overlap_numbers(
            merge(comm_ts[in_comm], comm_end[in_comm]), merge(comp_ts[in_comp], comp_end[in_comp])
        )
        rows.append({"rank": rank, "step": int(step), **numbers, "method": calls.method})
    return rows


def _overlap_numbers(comm: Intervals, comp: Intervals) -> dict[str, float]:
    comm_time = float((comm[1] - comm[0]).sum())
    overlap = intersection_length(comm, comp)
    return {
        "comm_time_us": comm_time,
        "overlap_time_us": overlap,
        "overlap_pct": 100.0 * overlap / comm_time if comm_time > 0 else float("nan"),
        "exposed_comm_us": comm_time - overlap,
    }


class _RankCalls(NamedTuple):
    """One rank's communication calls and compute intervals, as numpy (no frame is built).

    ``comm_rows`` are the calls' positions among the view's events (for the per-call table);
    compute intervals are unmerged, with the step of each.
    """

    view: k.EventView
    comm_rows: np.ndarray
    comm: Intervals
    comm_steps: np.ndarray
    comp: Intervals
    comp_steps: np.ndarray
    method: str


def _comm_and_comp(trace: Trace, rank: int, *, include_last_step: bool) -> _RankCalls:
    """Communication calls and compute intervals of a rank, with their steps, and the method name.

    Device work belongs to the step in which the host launched it (device clocks run behind
    the host's, so a kernel often runs after its step ended on the host).
    """
    return _calls_of_view(k.device_view(trace, rank, include_last_step=include_last_step))


def _calls_of_view(view: k.EventView) -> _RankCalls:
    """:func:`_comm_and_comp` of a rank's preprocessed events."""
    windows = _step_windows(view)
    device = view.device_rows
    if len(device):
        codes, categories = view.codes("name", device)
        kinds = kt.kernel_type_table(categories)[codes]
        comm_rows = device[kinds == kt.COMMUNICATION]
        comp_rows = device[kinds == kt.COMPUTATION]
        return _RankCalls(
            view,
            comm_rows,
            (view.values("ts", comm_rows), view.values("end", comm_rows)),
            _launch_steps(view, comm_rows, windows),
            (view.values("ts", comp_rows), view.values("end", comp_rows)),
            _launch_steps(view, comp_rows, windows),
            "hta-gpu",
        )
    comm_rows, comp = _host_comm_calls_and_compute(view)
    comm_ts = view.values("ts", comm_rows)
    return _RankCalls(
        view,
        comm_rows,
        (comm_ts, view.values("end", comm_rows)),
        _step_of(comm_ts, windows),
        comp,
        _step_of(comp[0], windows),
        "cpu-gloo",
    )


def _calls_frame(trace: Trace, rank: int, calls: _RankCalls) -> pd.DataFrame:
    """The per-call table of a rank's communication: ts, end, name, collective, step, external_id."""
    import pandas as pd

    view, rows = calls.view, calls.comm_rows
    names = view.values("name", rows)
    external = view.values("external_id", rows)
    if calls.method == "hta-gpu":
        meta = _collective_metadata(trace, rank)
        collective: list[object] = [meta.get(int(ext), {}).get("collective") for ext in external]
    else:  # gloo:all_gather -> all_gather; gloo:all_reduce -> reduce_scatter when it carried one
        host = view.host_rows
        name_codes, host_names = view.codes("name", host)
        c10d = host[_flags(host_names, lambda c: c.startswith("c10d::"))[name_codes]]
        collective = list(
            gloo_call_collectives(names, calls.comm[0], view.values("name", c10d), view.values("ts", c10d))
        )
    return pd.DataFrame(
        {
            "ts": calls.comm[0],
            "end": calls.comm[1],
            "name": names,
            "collective": collective,
            "step": calls.comm_steps,
            "external_id": external,
        },
        columns=_CALL_COLUMNS,
    )


def host_comm_and_compute(
    trace: Trace, rank: int, *, include_last_step: bool = False
) -> tuple[Intervals, Intervals, float, float]:
    """Merged communication and compute intervals of a CPU rank, plus the first/last host time."""
    return host_comm_and_compute_of_view(k.device_view(trace, rank, include_last_step=include_last_step))


def host_comm_and_compute_of_view(view: k.EventView) -> tuple[Intervals, Intervals, float, float]:
    """:func:`host_comm_and_compute` of a rank's preprocessed events (a DeviceView or the lean one)."""
    calls, comp = _host_comm_calls_and_compute(view)
    comm = merge(view.values("ts", calls), view.values("end", calls))
    host = view.host_rows
    name_codes, names = view.codes("name", host)
    cat_codes, cats = view.codes("cat", host)
    ops = host[_flags(cats, lambda c: c == "cpu_op")[cat_codes] | _flags(names, _is_comm)[name_codes]]
    if len(ops):
        first, last = float(view.values("ts", ops).min()), float(view.values("end", ops).max())
    else:
        first = last = 0.0
    return comm, comp, first, last


def _is_comm(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


def _flags(categories: pd.Index | np.ndarray, test: Callable[[str], bool]) -> np.ndarray:
    """``test`` of each category, plus a trailing False for code -1 (missing)."""
    return np.array([test(str(c)) for c in np.asarray(categories, dtype=object)] + [False], dtype=bool)


def _host_comm_calls_and_compute(view: k.EventView) -> tuple[np.ndarray, Intervals]:
    """A CPU rank's gloo calls (positions among the view's events) and its merged compute."""
    host = view.host_rows
    name_codes, names = view.codes("name", host)
    cat_codes, cats = view.codes("cat", host)
    comm_calls = host[_flags(names, lambda c: c.startswith("gloo:"))[name_codes]]
    is_comm = _flags(names, _is_comm)[name_codes]
    is_op = _flags(cats, lambda c: c == "cpu_op")[cat_codes]
    ts, end = view.values("ts", host), view.values("end", host)
    compute_parts_s, compute_parts_e = [], []
    if len(host):
        lane_keys = view.values("pid", host) * (1 << 32) + view.values("tid", host)
        main_lanes = np.unique(lane_keys[is_op & ~is_comm])
        for lane in main_lanes:
            on = lane_keys == lane
            ops = on & is_op & ~is_comm
            comp = _subtract(merge(ts[ops], end[ops]), merge(ts[on & is_comm], end[on & is_comm]))
            compute_parts_s.append(comp[0])
            compute_parts_e.append(comp[1])
    if compute_parts_s:
        comp_all = merge(np.concatenate(compute_parts_s), np.concatenate(compute_parts_e))
    else:
        comp_all = (np.empty(0), np.empty(0))
    return comm_calls, comp_all


def _subtract(a: Intervals, b: Intervals) -> Intervals:
    """Merged ``a`` minus merged ``b``, as merged intervals."""
    if len(b[0]) == 0 or len(a[0]) == 0:
        return a
    # Boundaries of a and b; keep the pieces inside a and outside b.
    points = np.unique(np.concatenate([a[0], a[1], b[0], b[1]]))
    mids = (points[:-1] + points[1:]) / 2
    in_a = _inside(mids, a)
    in_b = _inside(mids, b)
    keep = in_a & ~in_b
    return merge(points[:-1][keep], points[1:][keep])


def _inside(x: np.ndarray, merged_intervals: Intervals) -> np.ndarray:
    starts, ends = merged_intervals
    i = np.searchsorted(starts, x, side="right") - 1
    ok = i >= 0
    result = np.zeros(len(x), dtype=bool)
    result[ok] = x[ok] < ends[i[ok]]
    return result


def _step_windows(view: k.EventView) -> dict[int, tuple[float, float]]:
    """(first start, last end) of each ProfilerStep on the host."""
    host = view.host_rows
    codes, categories = view.codes("name", host)
    step_of_code = step_number_table(categories)
    if step_of_code is None:
        return {}
    # numpy on the category codes: this runs once per rank, hundreds of times at scale
    steps = step_of_code[codes]
    rows = steps >= 0
    ts, end, steps = view.values("ts", host[rows]), view.values("end", host[rows]), steps[rows]
    windows: dict[int, tuple[float, float]] = {}
    for step in np.unique(steps):
        on = steps == step
        windows[int(step)] = (float(ts[on].min()), float(end[on].max()))
    return windows


def _step_of(ts: np.ndarray, windows: dict[int, tuple[float, float]]) -> np.ndarray:
    out = np.full(len(ts), -1, dtype=np.int64)
    for step, (start, end) in sorted(windows.items()):
        out[(ts >= start) & (ts < end) & (out < 0)] = step
    return out


def _launch_steps(
    view: k.EventView, rows: np.ndarray, windows: dict[int, tuple[float, float]]
) -> np.ndarray:
    """The step of each device call: that of the host event that launched it, else its own start."""
    host = view.host_rows
    correlation = view.values("correlation", host)
    has = correlation >= 0
    host_corr, host_ts = correlation[has], view.values("ts", host)[has]
    # the last host event of each correlation launched it (as drop_duplicates(keep="last") would)
    keys, first_from_end = np.unique(host_corr[::-1], return_index=True)
    launch_ts = host_ts[::-1][first_from_end]
    wanted = view.values("correlation", rows)
    at = np.clip(np.searchsorted(keys, wanted), 0, max(len(keys) - 1, 0))
    found = (keys[at] == wanted) if len(keys) else np.zeros(len(wanted), dtype=bool)
    ts = np.where(found, launch_ts[at] if len(keys) else 0.0, view.values("ts", rows))
    return _step_of(ts, windows)


def _collective_metadata(trace: Trace, rank: int) -> dict[int, dict[str, object]]:
    """Collective name and message sizes by External id (shared by a kernel and its launching op)."""
    import pandas as pd

    coll = trace.collectives.get(rank)
    if coll is None or not len(coll):
        return {}
    external = trace.events[rank]["external_id"].to_numpy()[coll["row"].to_numpy()]
    out: dict[int, dict[str, object]] = {}
    for ext, record in zip(external, coll.to_dict("records"), strict=True):
        if ext != -1:
            out.setdefault(int(ext), {k: (None if pd.isna(v) else v) for k, v in record.items()})
    return out
