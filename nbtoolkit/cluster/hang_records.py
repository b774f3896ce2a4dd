"""The records a hang diagnosis is made of: collective calls, each rank's state, the verdicts.

Apart from :mod:`nbtoolkit.cluster.hang` (the report) so that the analysis that turns these into
verdicts (:mod:`nbtoolkit.cluster.hang_verdicts`) imports them without importing the report, whose
``verdicts`` imports that analysis: no import cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = [
    "BACKWARD_FRAMES",
    "HANG_AFTER_ENV",
    "HANG_AFTER_S",
    "RANK_STATES",
    "VERDICT_KINDS",
    "CollectiveCall",
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

#: The verdicts :func:`~nbtoolkit.cluster.hang_verdicts.hang_verdicts` gives.
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
