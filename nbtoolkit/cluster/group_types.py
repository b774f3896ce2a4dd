"""What the rank group's helpers share with it: the rank-process record, the output callback, and
the part of :class:`~nbtoolkit.cluster.ranks.RankGroup` that freeing and the hang watch use.

A lower module than :mod:`nbtoolkit.cluster.ranks`, so that :mod:`nbtoolkit.cluster.freeing` and
:mod:`nbtoolkit.cluster.hang_watch` (which ``ranks`` calls) never import ``ranks`` back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nbtoolkit.cluster.hang import HangReport
    from nbtoolkit.cluster.state import RankCallResult

__all__ = ["OutputCallback", "RankGroupLike", "RankProcess"]

OutputCallback = Callable[[int, str, str], None]  # (rank, "stdout" | "stderr", text)


@dataclass
class RankProcess:
    """What the notebook knows about one rank's worker process: where it runs and its state.

    (Not :class:`nbtoolkit.trace.trace.RankInfo`, which is the metadata of one rank of a trace.)
    """

    rank: int
    pid: int
    host: str
    ip: str
    gpu_ids: list[str]
    node_id: str = ""  # Ray's id of the node the rank runs on
    state: str = "idle"  # idle | busy | dead | broken
    cause: str | None = None  # why it is dead or broken


class RankGroupLike(Protocol):
    """The members of a RankGroup that freeing and the hang watch read or call."""

    world_size: int
    actors: list[Any]
    ranks: list[RankProcess]
    _start_timeout_s: float
    last_hang_report: HangReport | None

    def _get(self, refs: list[Any], timeout_s: float, what: str) -> list[Any]: ...

    def _collect(self, ref: Any, rank: int, result: RankCallResult) -> None: ...

    def _form_process_group(self, rank0_info: dict[str, Any]) -> list[dict[str, Any]]: ...

    def _flush_outcomes(self, result: RankCallResult, on_output: OutputCallback) -> None: ...
