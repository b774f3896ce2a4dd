"""Which ranks a call means, and how many ranks to start: the cluster's small parsers.

``parse_ranks("0,2", 4)`` picks ranks of a running cluster; ``rank_count("4")`` reads the
number of ranks to start (from ``%nbt cluster start 4`` or ``Cluster.local(ranks=4)``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nbtoolkit.cluster.state import DEFAULT_RANKS
from nbtoolkit.core.errors import NbtUsageError

__all__ = ["RankSpec", "parse_ranks", "rank_count"]

RankSpec = str | int | Sequence[int] | None


def parse_ranks(spec: RankSpec, world_size: int) -> list[int]:
    """Ranks named by ``spec``: None/"all" -> every rank; 3; "0,2"; "1-3"; [0, 1]."""
    if spec is None or spec == "all":
        return list(range(world_size))
    if isinstance(spec, int):
        chosen = [spec]
    elif isinstance(spec, str):
        chosen = []
        for part in spec.split(","):
            match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
            if not match:
                raise NbtUsageError(f"cannot read rank spec {spec!r}: use e.g. 0 | 0,2 | 1-3 | all")
            lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
            chosen.extend(range(lo, hi + 1))
    else:
        chosen = [int(r) for r in spec]
    bad = [r for r in chosen if not 0 <= r < world_size]
    if bad or not chosen:
        raise NbtUsageError(f"ranks {bad or spec!r} do not exist: the cluster has ranks 0-{world_size - 1}")
    return sorted(set(chosen))


def rank_count(ranks: int | str | None) -> int:
    """The number of ranks to start: a positive int, its digits as text, or None for the default."""
    if ranks is None:
        return DEFAULT_RANKS
    if isinstance(ranks, str) and ranks.strip().isdigit():
        ranks = int(ranks)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise NbtUsageError(f"ranks must be a positive integer (the number of ranks to start), got {ranks!r}")
    return ranks
