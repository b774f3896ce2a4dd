"""Running code on the ranks: cells, functions, and nbtoolkit's instruments (profile, memory, graphs, FLOPs).

The work behind :class:`nbtoolkit.cluster.cluster.Cluster`'s running methods, as plain
functions of what they need: the live rank group, the world size and the call's options
(the Cluster resolves its own defaults, ``hang_after_s`` and ``max_result_bytes``, first).
Values and errors come back as a :class:`RemoteRun`; instruments gather one result per rank
(a multi-rank Trace from the ranks' gzipped traces, a RankMemory, a list of reports).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.cluster.group_types import OutputCallback
from nbtoolkit.cluster.rank_spec import RankSpec, parse_ranks
from nbtoolkit.cluster.state import RemoteRun
from nbtoolkit.core.errors import NbtUsageError

if TYPE_CHECKING:
    from nbtoolkit.cluster.hang_watch import StallWatch
    from nbtoolkit.cluster.ranks import RankGroup
    from nbtoolkit.memory.rank_memory import RankMemory
    from nbtoolkit.trace.trace import Trace

__all__ = ["Step", "check_step", "execute", "rank_memory", "run_tool", "stall_watch", "traces_of"]
Step = str | Callable[..., Any]  # cell source run in each rank's namespace, or a function


def byte_limit(value: Any) -> int:
    """``max_result_bytes`` checked: a positive whole number of bytes."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise NbtUsageError(
            f"max_result_bytes must be a positive number of bytes (e.g. 2**30 for 1 GiB), got {value!r}"
        )
    return value


def stall_watch(hang_after_s: float | None, on_hang: str) -> StallWatch | None:
    """The stall detector of one call (None when it is turned off); ``hang_after_s`` None: the env/default."""
    from nbtoolkit.cluster.hang_watch import StallWatch, hang_after

    watch = StallWatch(hang_after(hang_after_s), on_hang=on_hang)
    return watch if watch.enabled else None


def execute(
    group: RankGroup,
    world_size: int,
    code_or_fn: Step,
    *,
    ranks: RankSpec,
    on_output: OutputCallback | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None,
    hang_after_s: float | None,
    on_hang: str,
    max_result_bytes: Any,
) -> RemoteRun:
    """Run a cell or call a function on the chosen ranks of ``group`` (see ``Cluster.execute``)."""
    chosen = parse_ranks(ranks, world_size)
    watch = stall_watch(hang_after_s, on_hang)
    limit = byte_limit(max_result_bytes)
    if isinstance(code_or_fn, str):
        raw = group.call(chosen, "run_cell", code_or_fn, limit, on_output=on_output, watch=watch)
    elif callable(code_or_fn):
        raw = group.call(
            chosen, "run_function", code_or_fn, args, kwargs or {}, limit, on_output=on_output,
            watch=watch,
        )
    else:
        raise NbtUsageError(f"run takes cell source (str) or a function, got {type(code_or_fn).__name__}")
    return RemoteRun(chosen, raw)


def check_step(code_or_fn: Any) -> None:
    """What an instrument runs on the ranks: cell source or a function."""
    if not (isinstance(code_or_fn, str) or callable(code_or_fn)):
        raise NbtUsageError(f"expected cell source (str) or a function, got {type(code_or_fn).__name__}")


def run_tool(
    group: RankGroup,
    world_size: int,
    name: str,
    code_or_fn: Step,
    *,
    ranks: RankSpec,
    options: dict[str, Any],
    on_output: OutputCallback | None,
    hang_after_s: float | None,
) -> RemoteRun:
    """Run ``nbtoolkit.cluster.rank_tools.<name>`` around the step on each chosen rank; raise on failure."""
    check_step(code_or_fn)
    chosen = parse_ranks(ranks, world_size)
    raw = group.call(
        chosen,
        "run_tool",
        "nbtoolkit.cluster.rank_tools",
        name,
        code_or_fn,
        options,
        on_output=on_output,
        watch=stall_watch(hang_after_s, "wait"),
    )
    result = RemoteRun(chosen, raw)
    result.raise_for_errors()
    return result


def traces_of(result: RemoteRun, save_dir: str | Path | None) -> Trace:
    """One multi-rank Trace of the ranks' gzipped traces (``profile_to_bytes``); ``save_dir`` keeps them."""
    from nbtoolkit.trace.kineto import load_trace

    folder = (
        Path(save_dir).expanduser()
        if save_dir is not None
        else Path(tempfile.mkdtemp(prefix="nbt-cluster-"))
    )
    folder.mkdir(parents=True, exist_ok=True)
    try:
        for rank in result.ranks:
            (folder / f"rank{rank}.json.gz").write_bytes(result.values[rank]["trace_gz"])
        return load_trace(folder)
    finally:
        if save_dir is None:
            shutil.rmtree(folder, ignore_errors=True)


def rank_memory(result: RemoteRun) -> RankMemory:
    """The ranks' MemoryTimelines (``memory_timeline_on_rank``) as one RankMemory, in rank order."""
    from nbtoolkit.memory.rank_memory import RankMemory

    return RankMemory(timelines={rank: result.values[rank] for rank in result.ranks})
