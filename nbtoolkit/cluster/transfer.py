"""Moving data between the notebook and the ranks: variables both ways, files the ranks wrote.

Part of :class:`nbtoolkit.cluster.cluster.Cluster` (a mixin over its running methods).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from nbtoolkit.cluster.rank_spec import RankSpec, parse_ranks
from nbtoolkit.cluster.running import ClusterRunning
from nbtoolkit.cluster.state import FetchedFiles, RemoteRun, rank_label
from nbtoolkit.core.errors import ClusterError, NbtUsageError

__all__ = ["FETCH_MAX_BYTES", "ClusterTransfer"]

#: The most bytes ``fetch`` copies from one rank: a pattern that is too wide must not fill memory.
FETCH_MAX_BYTES = 1 << 30


class ClusterTransfer(ClusterRunning):
    """The data-moving part of :class:`~nbtoolkit.cluster.cluster.Cluster`; see its methods."""

    def push(self, values: dict[str, Any], *, ranks: RankSpec = None) -> None:
        """Set variables in the namespace of each rank (``values`` maps name -> value).

        Prints one line saying which variables went to which ranks (as ``%nbt push`` shows).
        """
        bad = [name for name in values if not str(name).isidentifier()]
        if bad:
            raise NbtUsageError(f"cannot push {bad}: names must be Python identifiers")
        chosen = parse_ranks(ranks, self._world_size)
        RemoteRun(chosen, self._live_group().call(chosen, "push", dict(values))).raise_for_errors()
        where = "all ranks" if ranks is None else rank_label(chosen)
        print(f"pushed {', '.join(values)} to {where}")

    def pull(self, name: str, *, ranks: RankSpec = None) -> list[Any]:
        """A variable's value from each rank, in rank order."""
        if not name.isidentifier():
            raise NbtUsageError(f"cannot pull {name!r}: give a variable name")
        return self.run(name, ranks=ranks)

    def fetch(
        self,
        pattern: str,
        *,
        into: str | Path | None = None,
        ranks: RankSpec = None,
        max_bytes: int = FETCH_MAX_BYTES,
    ) -> FetchedFiles:
        """Copy the files matching ``pattern`` on each rank into a folder of the notebook's machine.

        For what the ranks wrote themselves: profiler traces, CUDA memory snapshots,
        ``TORCH_TRACE`` compile logs. ``{rank}`` in the pattern becomes each rank's number
        (ranks of a local cluster share one file system), ``~`` is expanded and ``**``
        matches folders recursively. Each file lands as ``rank<N>-<name>`` in ``into`` (a new
        temporary folder by default), so ``nbt.load_trace(folder)`` and
        ``nbt.load_compile_log(folder)`` see one rank per file. At most ``max_bytes`` per rank.
        Returns the local paths, sorted (a list that shows how many files, their size and folder).
        """
        from nbtoolkit.cluster.rank_tools import read_matching_files

        # The files come back as the call's value: fetch's own cap bounds it, not max_result_bytes.
        result = self.execute(
            read_matching_files, args=(pattern, max_bytes), ranks=ranks, max_result_bytes=max_bytes + 2**20
        )
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
