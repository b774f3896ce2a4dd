"""Summarize rank traces where they lie: each node reads its own files, only summaries travel.

``cluster.summarize_traces(where)`` (a thin method of :class:`~nbtoolkit.cluster.cluster.Cluster`):

1. every rank lists the trace files ``where`` names on its node (a folder of per-rank traces,
   or a glob; ``{rank}`` becomes the rank, ``**`` searches folders) with their sizes;
2. each file is given to one rank of a node that has it (round-robin over the node's ranks;
   a file every node sees, on a shared file system, is read once, on the first node);
3. each rank parses its files and summarizes them (:func:`nbtoolkit.trace.summarize_folder.summarize_files`)
   and returns the small per-rank summaries, never the JSON; the notebook combines them
   exactly as the local path does (:func:`nbtoolkit.trace.summarize_folder.combine_outcomes`),
   so the numbers are the same.

The notebook's memory therefore depends on the number of ranks (a few KB each), not on the
size of the traces. ``load_ranks_on_cluster`` brings the events of a few chosen ranks (for
their lanes) from the node that read them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from nbtoolkit.core.errors import ClusterError

if TYPE_CHECKING:
    from nbtoolkit.cluster.rank_spec import RankSpec
    from nbtoolkit.cluster.state import RemoteRun
    from nbtoolkit.trace.summarize_folder import RankOutcome
    from nbtoolkit.trace.summary import TraceSummary
    from nbtoolkit.trace.trace import Trace

__all__ = [
    "RunsOnRanks",
    "list_trace_files_on_rank",
    "load_ranks_on_cluster",
    "summarize_on_cluster",
    "summarize_on_rank",
]


class RunsOnRanks(Protocol):
    """What these functions use of a cluster (a :class:`~nbtoolkit.cluster.cluster.Cluster` is one)."""

    max_result_bytes: int

    def execute(
        self,
        code_or_fn: Any,
        *,
        ranks: RankSpec = None,
        args: tuple[Any, ...] = (),
        max_result_bytes: int | None = None,
    ) -> RemoteRun: ...


def list_trace_files_on_rank(where: str) -> dict[str, Any]:
    """This rank's node and the trace files ``where`` names there: ``{"node", "files": [(path, size)]}``."""
    import glob

    rank = os.environ.get("RANK", "0")
    expanded = os.path.expanduser(where.replace("{rank}", rank))
    if os.path.isdir(expanded):
        paths = [
            os.path.join(expanded, name)
            for name in os.listdir(expanded)
            if name.endswith((".json", ".json.gz")) and not name.startswith(".")
        ]
    else:
        paths = glob.glob(expanded, recursive=True)
    files = sorted((p, os.path.getsize(p)) for p in paths if os.path.isfile(p))
    return {"node": _node_id(), "files": files}


def summarize_on_rank(
    assignment: dict[int, list[str]], cache: bool, include_last_step: bool
) -> list[RankOutcome]:
    """Summarize the files assigned to this rank (run on the rank)."""
    from nbtoolkit.trace.summarize_folder import summarize_files

    files = assignment.get(int(os.environ.get("RANK", "0")), [])
    if not files:
        return []
    cache_dir = str(Path(files[0]).parent / ".nbt-cache") if cache else None
    return summarize_files(files, cache_dir=cache_dir, include_last_step=include_last_step)


def _load_files_on_rank(assignment: dict[int, list[str]], cache: bool) -> Trace | None:
    from nbtoolkit.trace.kineto import load_rank_file
    from nbtoolkit.trace.trace import Trace
    from nbtoolkit.trace.trace_cache import cache_key, read_events

    files = assignment.get(int(os.environ.get("RANK", "0")), [])
    parts = []
    for file in files:
        path = Path(file)
        cached = read_events(path.parent / ".nbt-cache", cache_key(path)) if cache else None
        parts.append(cached if cached is not None else load_rank_file(path))
    return Trace.combine(parts) if parts else None


def summarize_on_cluster(
    cluster: RunsOnRanks,
    where: str,
    *,
    cache: bool = False,
    on_error: Literal["skip", "raise"] = "skip",
    include_last_step: bool = False,
) -> TraceSummary:
    """See the module docstring; options as in ``nbt.summarize_traces``."""
    from nbtoolkit.trace.summarize_folder import combine_outcomes

    listing = cluster.execute(list_trace_files_on_rank, args=(str(where),))
    listing.raise_for_errors()
    assignment, owners = _assign(listing.values)
    if not owners:
        raise ClusterError(
            f"no trace file matches {where!r} on any rank: give a folder of per-rank .json/.json.gz "
            "traces as the ranks see it, or a glob ({rank} for a per-rank name, ** to search folders)"
        )
    run = cluster.execute(summarize_on_rank, args=(assignment, cache, include_last_step))
    run.raise_for_errors()
    outcomes = [o for rank in run.ranks for o in (run.values.get(rank) or [])]

    def redo(file: str, labels: list[str]) -> dict[str, Any]:
        # summarized again on its node with the job's ProfilerStep labels (rare; see rank_summary)
        job = cluster.execute(_redo_on_rank, args=(file, labels), ranks=[owners[file]])
        job.raise_for_errors()
        records: dict[str, Any] = job.values[owners[file]]
        return records

    summary = combine_outcomes(Path(where), outcomes, on_error=on_error, notes=[], cache_dir=None, redo=redo)
    summary.cache_dir = None  # the caches are on the nodes: load_ranks_on_cluster reads them
    summary.notes.append(
        f"summarized on the cluster: {len(owners)} file(s) read by {len(set(owners.values()))} rank(s) "
        f"on {len({listing.values[r]['node'] for r in set(owners.values())})} node(s)"
    )
    return summary


def load_ranks_on_cluster(
    cluster: RunsOnRanks, summary: TraceSummary, ranks: list[int], *, cache: bool = False
) -> Trace:
    """The events of the chosen trace ranks, read on the nodes holding their files."""
    from nbtoolkit.trace.trace import Trace

    wanted = {summary.info[r].source for r in ranks if r in summary.info}
    missing = sorted(set(ranks) - set(summary.info))
    if missing:
        raise ClusterError(f"ranks {missing} are not in the summary; ranks present: {summary.ranks[:16]} ...")
    listing = cluster.execute(list_trace_files_on_rank, args=(str(Path(next(iter(wanted))).parent),))
    listing.raise_for_errors()
    assignment, owners = _assign(listing.values, only=wanted)
    from nbtoolkit.cluster.transfer import FETCH_MAX_BYTES

    # The rank files' events come back whole, as fetch brings files: fetch's cap, not a cell value's.
    run = cluster.execute(
        _load_files_on_rank,
        args=(assignment, cache),
        ranks=sorted(set(owners.values())),
        max_result_bytes=max(cluster.max_result_bytes, FETCH_MAX_BYTES),
    )
    run.raise_for_errors()
    return Trace.combine(t for t in (run.values.get(r) for r in run.ranks) if t is not None)


def _redo_on_rank(file: str, labels: list[str]) -> dict[str, Any]:
    from nbtoolkit.trace.kineto import load_rank_file
    from nbtoolkit.trace.summarize_rank import summarize_trace

    return summarize_trace(load_rank_file(Path(file)), step_labels=labels).to_records()


def _assign(
    listings: dict[int, dict[str, Any]], only: set[str] | None = None
) -> tuple[dict[int, list[str]], dict[str, int]]:
    """rank -> files it reads, and file -> its rank: each (path, size) once, on the first node holding it."""
    by_node: dict[str, list[int]] = {}
    for rank in sorted(listings):
        by_node.setdefault(listings[rank]["node"], []).append(rank)
    assignment: dict[int, list[str]] = {}
    owners: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    for ranks in by_node.values():
        on_node = sorted({(path, size) for r in ranks for path, size in listings[r]["files"]})
        files = [f for f in on_node if f not in seen and (only is None or f[0] in only)]
        seen.update(files)
        for i, (path, _) in enumerate(files):
            rank = ranks[i % len(ranks)]
            assignment.setdefault(rank, []).append(path)
            owners[path] = rank
    return assignment, owners


def _node_id() -> str:
    """Ray's id of this worker's node; outside a Ray worker, the host name (never starts Ray)."""
    import socket
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return str(ray.get_runtime_context().get_node_id())
    return socket.gethostname()
