"""What a hang looks like as data: each rank's collectives, where it is now, and the verdict.

The same objects come from two sources:

- live ranks of a :class:`~nbtoolkit.Cluster` (nbtoolkit's own record of the collectives each
  rank called while a cell ran, plus a look at the cell thread's Python stack);
- PyTorch Flight Recorder dumps of a job that ran elsewhere (:func:`nbtoolkit.load_flight_recorder`).

:func:`diagnose_hang` turns a list of :class:`RankHang` into a :class:`HangReport`: a per-rank
frame plus the verdicts in words (the verdicts are :func:`nbtoolkit.cluster.hang_verdicts.hang_verdicts`).
The records themselves live in :mod:`nbtoolkit.cluster.hang_records`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nbtoolkit.cluster.hang_records import (
    HangVerdict,
    RankHang,
    user_place,
)
from nbtoolkit.core.result import Result, escape
from nbtoolkit.core.units import format_seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "HangReport",
    "diagnose_hang",
]

class HangReport(Result):
    """The diagnosis of a stalled cell (or of Flight Recorder dumps): per-rank rows and verdicts."""

    def __init__(
        self,
        ranks: list[RankHang],
        verdicts: list[HangVerdict] | None = None,
        *,
        stalled_s: float | None = None,
        source: str = "live ranks",
        members: dict[str, list[int]] | None = None,
    ) -> None:
        self.ranks = ranks
        self._verdicts = verdicts
        self.stalled_s = stalled_s  # how long no rank made progress, when known
        self.source = source
        self.members = members  # process group -> its ranks (None: every group holds every rank)

    @property
    def verdicts(self) -> list[HangVerdict]:
        """The findings; computed on first use when the report was read from files."""
        if self._verdicts is None:
            from nbtoolkit.cluster.hang_verdicts import hang_verdicts

            self._verdicts = hang_verdicts(self.ranks, members=self.members)
        return self._verdicts

    @property
    def hung(self) -> bool:
        """True when some rank waits in a collective that cannot complete."""
        return any(v.kind not in {"no hang", "computing"} for v in self.verdicts)

    def frame(self) -> pd.DataFrame:
        """One row per rank: rank, state, op, seq, group, sizes, numel, line, code, stack_top."""
        import pandas as pd

        rows: list[dict[str, Any]] = []
        for rank in self.ranks:
            call = rank.current
            rows.append(
                {
                    "rank": rank.rank,
                    "state": rank.state,
                    "op": call.op if call else None,
                    "seq": call.seq if call else None,
                    "group": call.group if call else None,
                    "sizes": [list(s) for s in call.sizes] if call else None,
                    "numel": call.numel if call else None,
                    "line": (call.line if call else rank.line),
                    "code": (call.code if call else rank.code),
                    "stack_top": rank.stack[-1] if rank.stack else None,
                }
            )
        return pd.DataFrame(rows)

    def _rank_line(self, rank: RankHang) -> str:
        call = rank.current
        if call is not None:
            shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in call.sizes) or "no tensors"
            return (
                f"  rank {rank.rank}: waits in {call.label} [{call.group}] ({call.numel} elements: {shapes}) "
                f"at {user_place(call.file, call.line, call.code)}"
            )
        if rank.state == "computing" and rank.in_backward:
            return f"  rank {rank.rank}: in backward (gradient reduction started by torch), at {rank.place}"
        if rank.state == "computing":
            return f"  rank {rank.rank}: outside any collective, at {rank.place}"
        if rank.state in {"dead", "unresponsive"}:
            return f"  rank {rank.rank}: {rank.state}" + (f" ({rank.detail})" if rank.detail else "")
        last = rank.calls[-1] if rank.calls else None
        after = f"; its last collective: {last.label}" if last else ""
        return f"  rank {rank.rank}: {rank.state}{after}"

    def _text(self) -> str:
        stalled = f" after {format_seconds(self.stalled_s)} without progress" if self.stalled_s else ""
        lines = [f"hang diagnosis ({self.source}){stalled}:"]
        lines += [self._rank_line(rank) for rank in self.ranks]
        lines += [f"=> {v.message}" for v in self.verdicts]
        return "\n".join(lines)

    def _html(self) -> str:
        colour = "#c62828" if self.hung else "#1565c0"
        rows = "".join(f"<div>{escape(self._rank_line(r).strip())}</div>" for r in self.ranks)
        verdicts = "".join(
            f"<div style='color:{colour}'><b>⇒ {escape(v.message)}</b></div>" for v in self.verdicts
        )
        stalled = (
            f" after {escape(format_seconds(self.stalled_s))} without progress" if self.stalled_s else ""
        )
        return (
            f"<div class='nbt-hang' style='font-family:monospace'><b>hang diagnosis</b> "
            f"({escape(self.source)}){stalled}{rows}{verdicts}</div>"
        )


def diagnose_hang(
    ranks: Sequence[RankHang],
    *,
    members: Mapping[str, Sequence[int]] | None = None,
    stalled_s: float | None = None,
    source: str = "live ranks",
) -> HangReport:
    """The verdicts on ``ranks`` (one :class:`RankHang` each) as a :class:`HangReport`.

    ``members`` maps a process group to its ranks; a group not in it (or ``members=None``)
    is taken to hold every rank given. The algorithm: :mod:`nbtoolkit.cluster.hang_verdicts`.
    """
    from nbtoolkit.cluster.hang_verdicts import hang_verdicts

    return HangReport(
        list(ranks),
        hang_verdicts(ranks, members=members),
        stalled_s=stalled_s,
        source=source,
        members={g: list(r) for g, r in members.items()} if members else None,
    )
