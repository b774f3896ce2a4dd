"""What a hang looks like as data: each rank's collectives, where it is now, and the verdict.

The same objects come from two sources:

- live ranks of a :class:`~nbtoolkit.Cluster` (nbtoolkit's own record of the collectives each
  rank called while a cell ran, plus a look at the cell thread's Python stack);
- PyTorch Flight Recorder dumps of a job that ran elsewhere (:func:`nbtoolkit.load_flight_recorder`).

:func:`nbtoolkit.analysis.hang.diagnose_hang` turns a list of :class:`RankHang` into a
:class:`HangReport`: a per-rank frame plus the verdicts in words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.model._result import Result, escape
from nbtoolkit.units import format_seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "HANG_AFTER_ENV",
    "HANG_AFTER_S",
    "RANK_STATES",
    "VERDICT_KINDS",
    "CollectiveCall",
    "HangReport",
    "HangVerdict",
    "RankHang",
    "user_place",
]

#: Seconds without progress on any rank (no collective completed, no output) before a running
#: cell shows the hang diagnosis; the environment variable below overrides it, 0 turns it off.
HANG_AFTER_S = 30.0
HANG_AFTER_ENV = "NBT_HANG_AFTER_S"

#: What a rank is doing: waiting in a collective, running Python outside any collective,
#: done with the cell, gone, not answering, or (Flight Recorder) no collective pending.
RANK_STATES = ("in collective", "computing", "finished", "dead", "unresponsive", "no collective pending")

#: The verdicts :func:`~nbtoolkit.analysis.hang.diagnose_hang` gives.
VERDICT_KINDS = (
    "skipped collective",
    "skipped backward",
    "reordered collectives",
    "mismatched collectives",
    "size mismatch",
    "outside any collective",
    "other process group",
    "dead rank",
    "unresponsive rank",
    "no dump",
    "waiting together",
    "computing",
    "no hang",
)


@dataclass(frozen=True)
class CollectiveCall:
    """One collective one rank called: which, in which process group, with what, from where."""

    rank: int
    group: str  # the process group's name as users know it ("default_pg", a desc, or its id)
    seq: int  # 1-based number of the collective within its process group (as Flight Recorder counts)
    op: str  # "all_reduce", "broadcast", ... (no backend prefix)
    sizes: tuple[tuple[int, ...], ...] = ()  # shapes of the input tensors
    dtypes: tuple[str, ...] = ()
    completed: bool = False  # False: the rank entered it and has not come out
    file: str | None = None  # the user's code that called it: "<remote-cell>" or a path
    line: int | None = None
    code: str | None = None  # that line's text, when known

    @property
    def numel(self) -> int:
        """Elements the rank sends: the sum over its input tensors."""
        return sum(math.prod(shape) for shape in self.sizes)

    @property
    def label(self) -> str:
        """``all_reduce #12``."""
        return f"{self.op} #{self.seq}"


def user_place(file: str | None, line: int | None, code: str | None = None) -> str:
    """``cell line 7`` for a line of the cell, ``train.py:7`` for a file, with the code after a colon."""
    if line is None:
        return "an unknown line"
    where = f"cell line {line}" if file in (None, "<remote-cell>") else f"{_short_path(file)}:{line}"
    return f"{where}: {code.strip()}" if code and code.strip() else where


def _short_path(path: str | None) -> str:
    parts = (path or "").replace("\\", "/").split("/")
    return "/".join(parts[-2:])


#: Stack frames (``"file:line in function"`` endings) that mean a rank runs autograd's backward.
BACKWARD_FRAMES = (" in _engine_run_backward", " in run_backward")


@dataclass
class RankHang:
    """One rank at the moment of the diagnosis."""

    rank: int
    state: str  # one of RANK_STATES
    calls: list[CollectiveCall] = field(default_factory=list)  # in the order called
    file: str | None = None  # where the rank's user code is now (from its stack)
    line: int | None = None
    code: str | None = None
    stack: list[str] = field(default_factory=list)  # innermost last, "file:line in function"
    detail: str | None = None  # why it is dead or unresponsive

    @property
    def in_backward(self) -> bool:
        """The stack shows autograd's backward: DDP, FSDP and DeepSpeed reduce gradients there with
        collectives torch starts itself (not recorded as calls), so a rank stuck there waits for peers."""
        return any(entry.endswith(BACKWARD_FRAMES) for entry in self.stack)

    @property
    def current(self) -> CollectiveCall | None:
        """The collective the rank waits in: the first one it entered and did not come out of."""
        return next((call for call in self.calls if not call.completed), None)

    @property
    def place(self) -> str:
        return user_place(self.file, self.line, self.code)


@dataclass(frozen=True)
class HangVerdict:
    """One finding: what is wrong, who caused it, who waits for it, and where in the code."""

    kind: str  # one of VERDICT_KINDS
    message: str
    culprits: tuple[int, ...] = ()  # the ranks that did something different
    waiting: tuple[int, ...] = ()  # the ranks waiting because of it
    op: str | None = None
    seq: int | None = None
    group: str | None = None
    line: int | None = None


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
            from nbtoolkit.model._providers import provided

            self._verdicts = list(provided("HangReport.verdicts")(self))
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
