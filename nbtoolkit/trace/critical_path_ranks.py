"""``nbt.critical_path_across_ranks``: per iteration, the chain across ranks that bounds it.

In synchronous training a collective ends on every rank at about the same moment: when the
last rank has arrived and the data has moved. So, for one collective call:

- the rank that arrived last spends the least time in it (its time there is the transfer
  alone): ``transfer_us`` = the shortest duration of the call over the ranks;
- every other rank waited for it: ``wait_us`` of a rank = its duration in the call minus
  ``transfer_us``;
- the late rank's compute before the call is what delayed it: its ``arrival_us`` (from the
  start of its ProfilerStep to the call's start) minus the median of the other ranks' is the
  ``delay_us`` it cost them.

No clock is compared across ranks (their trace clocks are not aligned): durations are compared,
and each arrival is measured on its own rank's clock from its own step start.

Calls are matched across ranks by their order in the step: the k-th communication call of
step s (NCCL kernels on a GPU, ``gloo:*`` host ops on a CPU, as in ``comm_comp_overlap``)
is the same collective on every rank, as in any SPMD program. Where ranks made different
numbers of calls in a step, the first calls common to all are matched (a note says so).

The chain of an iteration is its call with the most waiting (summed over ranks): the late
rank and its compute before the call, the call itself (its transfer), and the ranks that
waited in it. The per-rank part runs one rank at a time (a RankFolderTrace reads one rank's
events at a time), so the work and memory are linear in the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from nbtoolkit.core.errors import TraceError
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_seconds
from nbtoolkit.trace.overlap import collective_calls

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.trace import Trace

__all__ = ["CHAIN_COLUMNS", "ITERATION_COLUMNS", "CrossRankPath", "critical_path_across_ranks"]

#: one row per iteration (step): the chain that bounds it
ITERATION_COLUMNS = (
    "step",
    "late_rank",
    "collective",
    "call",
    "arrival_us",
    "median_arrival_us",
    "delay_us",
    "transfer_us",
    "waiting_ranks",
    "median_wait_us",
    "max_wait_us",
    "total_wait_us",
)
#: one row per link of each iteration's chain: compute (of the late rank), collective, wait (of the others)
CHAIN_COLUMNS = ("step", "link", "ranks", "collective", "call", "dur_us", "cost_us", "words")


# repr: the Result text; eq: identity (frames have no truth value)
@dataclass(repr=False, eq=False)
class CrossRankPath(Result):
    """Per iteration, the late rank, the collective it delays and the ranks waiting in it.

    ``iterations``: one row per step (:data:`ITERATION_COLUMNS`); ``chain``: its links, one row
    each (:data:`CHAIN_COLUMNS`); ``calls``: every matched call of every rank (step, call,
    rank, collective, dur_us, arrival_us, wait_us), for other questions.
    """

    iterations: pd.DataFrame
    chain: pd.DataFrame
    calls: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    @property
    def bounding_rank(self) -> int | None:
        """The rank that is late most often (ties: the one that costs the most delay)."""
        if not len(self.iterations):
            return None
        per = self.iterations.groupby("late_rank")["delay_us"].agg(["size", "sum"])
        return int(per.sort_values(["size", "sum"], ascending=False).index[0])

    def _headline(self) -> str:
        rank = self.bounding_rank
        if rank is None:
            return "Critical path across ranks: no collective common to the ranks in any step"
        late = int((self.iterations["late_rank"] == rank).sum())
        return (
            f"Critical path across ranks: rank {rank} is the last to reach the bounding collective in "
            f"{late} of {len(self.iterations)} step(s); the others wait for it"
        )

    def _text(self) -> str:
        lines = [self._headline()]
        lines += [f"  {row.words}" for row in self.chain.itertuples(index=False)]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _html(self) -> str:
        words = "".join(f"<li>{escape(w)}</li>" for w in self.chain["words"])
        return (
            f"<div class='nbt-cross-rank-path'><b>{escape(self._headline())}</b><ul>{words}</ul>"
            + html_table(self.iterations, max_rows=64, float_format="{:,.1f}")
            + "".join(f"<p><i>{escape(n)}</i></p>" for n in self.notes)
            + "</div>"
        )


def critical_path_across_ranks(trace: Trace, *, include_last_step: bool = False) -> CrossRankPath:
    """Per iteration, the chain across ranks that bounds it (definitions in the module docstring)."""
    import pandas as pd

    if len(trace.ranks) < 2:
        raise TraceError(
            f"the critical path across ranks needs two or more ranks; this trace has {len(trace.ranks)} "
            "(nbt.critical_path gives the path of one rank)"
        )
    steps = trace.steps
    parts = []
    for rank in trace.ranks:  # one rank's events at a time
        calls = collective_calls(trace, rank, include_last_step=include_last_step)
        calls = calls[calls["step"].to_numpy() >= 0]
        mine = steps[steps["rank"] == rank].set_index("step")["ts"]
        start = mine.reindex(calls["step"]).to_numpy()
        parts.append(
            pd.DataFrame(
                {
                    "step": calls["step"].to_numpy(),
                    "call": calls.groupby("step").cumcount().to_numpy(),
                    "rank": rank,
                    "collective": [
                        str(n).split("(")[0] if c is None or pd.isna(c) else str(c)
                        for c, n in zip(calls["collective"], calls["name"], strict=True)
                    ],
                    "dur_us": (calls["end"] - calls["ts"]).to_numpy(),
                    "arrival_us": calls["ts"].to_numpy() - start,
                }
            )
        )
    table = pd.concat(parts, ignore_index=True)
    notes: list[str] = []
    table = _common_calls(table, len(trace.ranks), notes)
    if not len(table):
        empty = pd.DataFrame(columns=list(ITERATION_COLUMNS))
        return CrossRankPath(empty, pd.DataFrame(columns=list(CHAIN_COLUMNS)), table, notes)
    group = table.groupby(["step", "call"])["dur_us"]
    table["wait_us"] = table["dur_us"] - group.transform("min")
    iterations, chain = [], []
    for step, in_step in table.groupby("step", sort=True):
        waits = in_step.groupby("call")["wait_us"].sum()
        call = int(waits.idxmax())
        row = _chain_of(int(step), in_step[in_step["call"] == call])
        iterations.append(row)
        chain.extend(_links(row, in_step[in_step["call"] == call]))
    return CrossRankPath(
        pd.DataFrame(iterations, columns=list(ITERATION_COLUMNS)),
        pd.DataFrame(chain, columns=list(CHAIN_COLUMNS)),
        table,
        notes,
    )


def _common_calls(table: pd.DataFrame, ranks: int, notes: list[str]) -> pd.DataFrame:
    """The calls every rank made in a step (by order); a note where ranks differ."""
    per = table.groupby(["step", "rank"]).size().unstack("rank")
    if per.shape[1] < ranks:
        notes.append(
            "some ranks made no communication call in the analysed steps: "
            "only the ranks with calls are compared"
        )
    common = per.min(axis=1).fillna(0).astype(int)
    uneven = [int(s) for s in per.index if per.loc[s].nunique() > 1]
    if uneven:
        notes.append(
            f"ranks made different numbers of communication calls in step(s) {uneven[:8]}: "
            "the first calls common to all are matched"
        )
    keep = table["call"].to_numpy() < common.reindex(table["step"]).to_numpy()
    return table[keep].reset_index(drop=True)


def _chain_of(step: int, call: pd.DataFrame) -> dict[str, object]:
    late = call.loc[call["dur_us"].idxmin()]
    others = call[call["rank"] != late["rank"]]
    # the others' median: with two ranks a median over all would sit halfway to the late rank
    median_arrival = (
        float(np.median(others["arrival_us"].to_numpy())) if len(others) else float(late["arrival_us"])
    )
    return {
        "step": step,
        "late_rank": int(late["rank"]),
        "collective": str(late["collective"]),
        "call": int(late["call"]),
        "arrival_us": float(late["arrival_us"]),
        "median_arrival_us": median_arrival,
        "delay_us": max(float(late["arrival_us"]) - median_arrival, 0.0),
        "transfer_us": float(late["dur_us"]),
        "waiting_ranks": others["rank"].astype(int).tolist(),
        "median_wait_us": float(others["wait_us"].median()) if len(others) else 0.0,
        "max_wait_us": float(others["wait_us"].max()) if len(others) else 0.0,
        "total_wait_us": float(call["wait_us"].sum()),
    }


def _links(row: dict[str, object], call: pd.DataFrame) -> list[dict[str, object]]:
    step, late, name, k = row["step"], row["late_rank"], row["collective"], row["call"]
    waiting = list(row["waiting_ranks"])  # type: ignore[call-overload]
    shown = ", ".join(map(str, waiting[:8])) + (f" and {len(waiting) - 8} more" if len(waiting) > 8 else "")

    def t(us: object) -> str:
        return format_seconds(float(us) / 1e6)  # type: ignore[arg-type]

    return [
        {
            "step": step,
            "link": "compute",
            "ranks": str(late),
            "collective": name,
            "call": k,
            "dur_us": row["arrival_us"],
            "cost_us": row["delay_us"],
            "words": f"step {step}: rank {late} computes {t(row['arrival_us'])} before {name} (call {k} of "
            f"the step), {t(row['delay_us'])} more than the median of the others",
        },
        {
            "step": step,
            "link": "collective",
            "ranks": "all",
            "collective": name,
            "call": k,
            "dur_us": row["transfer_us"],
            "cost_us": row["transfer_us"],
            "words": f"step {step}: {name} itself takes {t(row['transfer_us'])} once rank {late} arrives",
        },
        {
            "step": step,
            "link": "wait",
            "ranks": shown,
            "collective": name,
            "call": k,
            "dur_us": row["max_wait_us"],
            "cost_us": row["total_wait_us"],
            "words": f"step {step}: rank(s) {shown} wait in {name} for rank {late}: "
            f"{t(row['median_wait_us'])} median, {t(row['max_wait_us'])} at most",
        },
    ]
