"""Moving data between the notebook and the ranks: variables both ways, files the ranks wrote.

The work behind :class:`nbtoolkit.cluster.cluster.Cluster`'s ``push``, ``pull`` and ``fetch``,
as plain functions of what they need (the live rank group, the ranks chosen, a call's result).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.cluster.rank_spec import RankSpec, parse_ranks
from nbtoolkit.cluster.state import FetchedFiles, RemoteRun, rank_label
from nbtoolkit.core.errors import ClusterError, NbtUsageError

if TYPE_CHECKING:
    from nbtoolkit.cluster.ranks import RankGroup

__all__ = ["FETCH_MAX_BYTES", "check_variable_name", "push", "push_targets", "save_fetched"]

#: The most bytes ``fetch`` copies from one rank: a pattern that is too wide must not fill memory.
FETCH_MAX_BYTES = 1 << 30


def push_targets(values: dict[str, Any], ranks: RankSpec, world_size: int) -> list[int]:
    """The ranks ``push`` sets ``values`` on, after checking the names are identifiers."""
    bad = [name for name in values if not str(name).isidentifier()]
    if bad:
        raise NbtUsageError(f"cannot push {bad}: names must be Python identifiers")
    return parse_ranks(ranks, world_size)


def push(group: RankGroup, chosen: list[int], values: dict[str, Any], *, everyone: bool) -> None:
    """Set ``values`` in the namespaces of the ``chosen`` ranks; print one line saying what went where."""
    RemoteRun(chosen, group.call(chosen, "push", dict(values))).raise_for_errors()
    where = "all ranks" if everyone else rank_label(chosen)
    print(f"pushed {', '.join(values)} to {where}")


def check_variable_name(name: str) -> None:
    """What ``pull`` evaluates on the ranks must be a variable name."""
    if not name.isidentifier():
        raise NbtUsageError(f"cannot pull {name!r}: give a variable name")


def save_fetched(result: RemoteRun, pattern: str, into: str | Path | None) -> FetchedFiles:
    """Write the files ``read_matching_files`` brought back as ``rank<N>-<name>`` in ``into``."""
    result.raise_for_errors()
    if not any(result.values.get(rank) for rank in result.ranks):
        raise ClusterError(
            f"no file matches {pattern!r} on {rank_label(result.ranks)}: check the path on the ranks "
            "(use {rank} for a per-rank name, ** to search folders)"
        )
    folder = Path(into).expanduser() if into is not None else Path(tempfile.mkdtemp(prefix="nbt-fetch-"))
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for rank in result.ranks:
        for remote_path, data in (result.values.get(rank) or {}).items():
            target = folder / f"rank{rank}-{Path(remote_path).name}"
            copy = 1
            while target in written:  # same file name in two folders of one rank
                copy += 1
                target = folder / f"rank{rank}-{copy}-{Path(remote_path).name}"
            target.write_bytes(data)
            written.append(target)
    return FetchedFiles(written)
