"""In the notebook: notice a cell that stopped making progress, ask the ranks why, and say it.

:class:`StallWatch` rides along the rank group's wait loop (:meth:`RankGroup.call`): every
poll brings each rank's output and its count of completed collectives (the rank's
``poll``). When none of those moved for ``after_s`` seconds, the watch asks every rank for
its collectives and its stack (``hang_state``, answered on the rank's control thread while
the cell stays blocked), builds a :class:`~nbtoolkit.cluster.hang.HangReport` with
:func:`~nbtoolkit.cluster.hang.diagnose_hang`, and shows it once, when it finds a hang: ranks
that all compute (a long step without output) are left alone and looked at again a threshold
later. Then it keeps waiting
(Ctrl-C frees the ranks as before), or, with ``on_hang="interrupt"``, stops the cell the
way Ctrl-C does. Progress after a diagnosis re-arms it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtoolkit.cluster.hang import HangReport, diagnose_hang
from nbtoolkit.cluster.hang_records import HANG_AFTER_ENV, HANG_AFTER_S, CollectiveCall, RankHang
from nbtoolkit.core.errors import NbtUsageError

if TYPE_CHECKING:
    from nbtoolkit.cluster.group_types import RankGroupLike

__all__ = [
    "HANG_ACTIONS",
    "StallWatch",
    "StopOnHang",
    "ask_ranks",
    "hang_after",
    "hang_report",
    "note_interrupt",
    "show_report",
]

#: What a cell does after its hang diagnosis: keep waiting, or stop like Ctrl-C.
HANG_ACTIONS = ("wait", "interrupt")
# A rank dumping torch's Flight Recorder the first time took over 2 s under load (measured).
_ASK_TIMEOUT_S = 10.0


class StopOnHang(KeyboardInterrupt):
    """Raised in the wait loop to stop a cell after its diagnosis (``on_hang="interrupt"``)."""


def hang_after(value: float | str | None) -> float:
    """The stall threshold in seconds: ``value``, else $NBT_HANG_AFTER_S, else 30; 0 is off."""
    raw: Any = value if value is not None else os.environ.get(HANG_AFTER_ENV, HANG_AFTER_S)
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        source = "hang_after_s" if value is not None else f"${HANG_AFTER_ENV}"
        raise NbtUsageError(
            f"{source} must be seconds (a number, 0 turns the detector off), got {raw!r}"
        ) from None
    if seconds < 0:
        raise NbtUsageError(f"hang_after_s must be >= 0 seconds (0 turns the detector off), got {seconds:g}")
    return seconds


def _call(rank: int, raw: dict[str, Any]) -> CollectiveCall:
    return CollectiveCall(
        rank=rank,
        group=str(raw["group"]),
        seq=int(raw["seq"]),
        op=str(raw["op"]),
        sizes=tuple(tuple(s) for s in raw.get("sizes", ())),
        dtypes=tuple(raw.get("dtypes", ())),
        completed=bool(raw.get("completed")),
        file=raw.get("file"),
        line=raw.get("line"),
        code=raw.get("code"),
    )


def ask_ranks(group: RankGroupLike, ranks: list[int] | None = None) -> list[RankHang]:
    """Each rank's collectives, state and stack now (a dead rank as dead, a silent one as unresponsive)."""
    import ray

    chosen = list(range(group.world_size)) if ranks is None else ranks
    refs = {r: group.actors[r].hang_state.remote() for r in chosen if group.ranks[r].state != "dead"}
    if refs:
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=_ASK_TIMEOUT_S)
    out = []
    for rank in chosen:
        info = group.ranks[rank]
        if rank not in refs:
            out.append(RankHang(rank, "dead", detail=info.cause))
            continue
        try:
            raw = ray.get(refs[rank], timeout=0.01)
        except ray.exceptions.GetTimeoutError:
            out.append(RankHang(rank, "unresponsive", detail=f"no answer within {_ASK_TIMEOUT_S:g} s"))
            continue
        except ray.exceptions.RayError as exc:  # died meanwhile, or an older rank without hang_state
            out.append(RankHang(rank, "dead", detail=str(exc).splitlines()[0][:200]))
            continue
        state, calls = raw["state"], [_call(rank, c) for c in raw["calls"]]
        torch_view = _from_flight_recorder(rank, raw)
        if torch_view is not None:
            calls = torch_view
            waiting = any(not c.completed for c in calls)
            state = "in collective" if waiting else ("computing" if state == "in collective" else state)
        out.append(
            RankHang(
                rank,
                state,
                calls,
                file=raw.get("file"),
                line=raw.get("line"),
                code=raw.get("code"),
                stack=list(raw.get("stack", [])),
            )
        )
    return out


def _from_flight_recorder(rank: int, raw: dict[str, Any]) -> list[CollectiveCall] | None:
    """The rank's collectives as torch's Flight Recorder has them (NCCL: what the GPU completed).

    None when the rank sent no dump or an unreadable one: our own record is used then.
    """
    from dataclasses import replace

    from nbtoolkit.cluster.flight_recorder import parse_dump, rank_from_dump
    from nbtoolkit.core.errors import TraceError

    data = raw.get("flight_recorder")
    if not data:
        return None
    try:
        dump = parse_dump(data, name=f"rank {rank}'s Flight Recorder")
    except TraceError:
        return None
    lines = raw.get("cell_lines") or []

    def code(call: CollectiveCall) -> str | None:
        inside = call.file == "<remote-cell>" and call.line is not None and 0 < call.line <= len(lines)
        return str(lines[call.line - 1]).strip() if inside and call.line is not None else None

    # Off NCCL a collective is done when it returns, and gloo's recorder marks it done a moment
    # later (a dump taken at once still shows it pending: measured): our own record knows sooner.
    returned = (
        {(c["group"], c["seq"]) for c in raw["calls"] if c.get("completed")}
        if raw.get("backend") != "nccl"
        else set()
    )
    return [
        replace(c, code=code(c), completed=c.completed or (c.group, c.seq) in returned)
        for c in rank_from_dump(dump, rank).calls
    ]


def show_report(report: HangReport) -> None:
    """Show a diagnosis in the cell's output: rich in a notebook, its text elsewhere."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from IPython.display import display

        display(report)
        return
    sys.stdout.write(report._text() + "\n")
    sys.stdout.flush()


class StallWatch:
    """Notice when no rank made progress for ``after_s`` seconds and show the diagnosis once."""

    def __init__(
        self,
        after_s: float,
        *,
        on_hang: str = "wait",
        show: Callable[[HangReport], None] = show_report,
    ) -> None:
        if on_hang not in HANG_ACTIONS:
            raise NbtUsageError(f"on_hang must be one of {', '.join(HANG_ACTIONS)}, got {on_hang!r}")
        self.after_s = after_s
        self.on_hang = on_hang
        self._show = show
        self._completed: dict[int, int] = {}
        self._last_progress = time.monotonic()
        self._reported = False
        self.report: HangReport | None = None  # the diagnosis shown, if any
        self.diagnosed_after_s: float | None = None  # seconds from the last progress to the diagnosis

    @property
    def enabled(self) -> bool:
        return self.after_s > 0

    def observe(self, rank: int, completed: int | None, had_output: bool) -> None:
        """One rank's poll: progress is output or a collective completed since the last poll."""
        moved = had_output
        if completed is not None:
            moved = moved or (rank in self._completed and completed != self._completed[rank])
            self._completed[rank] = completed
        if moved:
            self._last_progress = time.monotonic()
            self._reported = False

    def finished(self, rank: int) -> None:
        """A rank's call came back: that is progress too."""
        self._last_progress = time.monotonic()
        self._reported = False

    def check(self, group: RankGroupLike) -> None:
        """Diagnose and show once a stall passes the threshold; raise StopOnHang if asked to stop."""
        stalled = time.monotonic() - self._last_progress
        if not self.enabled or self._reported or stalled < self.after_s:
            return
        report = diagnose_hang(ask_ranks(group), stalled_s=stalled)
        if not report.hung:
            # Every rank computes (or finished): a long step, not a hang. Look again a threshold later.
            self._last_progress = time.monotonic()
            return
        self._reported = True
        self.report = report
        self.diagnosed_after_s = time.monotonic() - self._last_progress
        group.last_hang_report = self.report
        if self.on_hang == "interrupt":
            self._show(self.report)
            print(f"stopping the cell (on_hang='interrupt') after {self.after_s:g} s without progress")
            raise StopOnHang
        self._show(self.report)
        print("still waiting: interrupt the kernel (Ctrl-C) to stop and free the ranks")


def hang_report(group: RankGroupLike) -> HangReport:
    """The diagnosis now: live while some rank still runs a cell, else the last stall's or Ctrl-C's."""
    ranks = ask_ranks(group)
    busy = any(r.state in {"in collective", "computing"} for r in ranks)
    last: HangReport | None = getattr(group, "last_hang_report", None)
    if not busy and last is not None:
        return last
    return diagnose_hang(ranks, source="live ranks")


def note_interrupt(group: RankGroupLike) -> None:
    """Keep where each rank is as the user presses Ctrl-C (before the ranks are stopped)."""
    group.last_hang_report = diagnose_hang(ask_ranks(group), source="at Ctrl-C")
