"""Where ranks go: a placement group with the user's strategy, and named ranks that outlive a kernel.

- ``strategy``: ``"pack"`` puts ranks on as few nodes as possible (NCCL inside a node is
  fastest), ``"spread"`` over as many nodes as possible; ``"strict_pack"`` /
  ``"strict_spread"`` make that a requirement (Ray's four placement strategies).
- ``name``: the ranks become *detached named actors* (``<name>.rank<N>``) and the placement
  group ``<name>.ranks``, in the Ray namespace ``nbtoolkit``. They keep running when the
  notebook's kernel exits or restarts; :func:`find_named_ranks` finds them again.
"""

from __future__ import annotations

import os
from typing import Any

from nbtoolkit.cluster.state import PLACEMENT_STRATEGIES as STRATEGIES
from nbtoolkit.core.errors import ClusterError, NbtUsageError

__all__ = [
    "LOCAL_RANKS_PER_CPU",
    "LOCAL_RANK_BYTES",
    "STRATEGIES",
    "check_local_room",
    "find_named_ranks",
    "parse_strategy",
    "place_bundles",
    "rank_actor_name",
    "wait_until_names_free",
]

#: Memory one rank of a local cluster takes: a Ray worker with torch and a gloo group (measured:
#: 300 MB RSS on torch 2.13, 550 MB once DeepSpeed is imported), and what Ray's own processes take.
LOCAL_RANK_BYTES = 300 * 2**20
_RAY_BASE_BYTES = 512 * 2**20
#: Ranks a local cluster may start per CPU core (ranks on one core take turns; past this they crawl).
LOCAL_RANKS_PER_CPU = 8


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (Linux), else None."""
    try:
        with open("/proc/meminfo") as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_local_room(world_size: int) -> None:
    """Fail at once when this machine cannot run ``world_size`` local ranks (CPUs, memory).

    Without it, Ray accepts any number of logical CPUs and the placement waits out its timeout
    (10**6 ranks: 119 s and ~6 GB before "no room").
    """
    cpus = os.cpu_count() or 1
    limits = {f"{cpus} CPU cores x {LOCAL_RANKS_PER_CPU} ranks per core": cpus * LOCAL_RANKS_PER_CPU}
    available = _available_memory()
    if available is not None:
        fit = max(0, (available - _RAY_BASE_BYTES) // LOCAL_RANK_BYTES)
        limits[
            f"{available / 2**30:.1f} GiB of memory available, about {LOCAL_RANK_BYTES // 2**20} MiB per rank"
        ] = fit
    why, most = min(limits.items(), key=lambda item: item[1])
    if world_size > most:
        raise ClusterError(
            f"this machine cannot run {world_size:,} local ranks: it has room for at most {most} ({why}). "
            "Ask for fewer ranks, or connect to a larger cluster with Cluster.connect(address)."
        )


def parse_strategy(strategy: str) -> str:
    """Ray's spelling (``"SPREAD"``) of a strategy given as ``"spread"``; a clear error otherwise."""
    if not isinstance(strategy, str) or strategy.lower() not in STRATEGIES:
        raise NbtUsageError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    return strategy.upper()


def rank_actor_name(name: str, rank: int) -> str:
    return f"{name}.rank{rank}"


def _group_name(name: str) -> str:
    return f"{name}.ranks"


def place_bundles(
    world_size: int, bundle: dict[str, float], *, strategy: str, name: str | None, timeout_s: float
) -> Any:
    """A ready placement group of ``world_size`` bundles, or ClusterError saying what is missing."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    options: dict[str, Any] = {"strategy": parse_strategy(strategy)}
    _check_feasible(world_size, bundle, options["strategy"])
    if name is not None:
        options.update(name=_group_name(name), lifetime="detached")
    group = placement_group([dict(bundle) for _ in range(world_size)], **options)
    try:
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    except BaseException:  # Ctrl-C while waiting: a group left behind would hold its CPUs for good
        remove_placement_group(group)
        raise
    if not ready:
        remove_placement_group(group)
        have = {k: v for k, v in ray.available_resources().items() if k in {"CPU", "GPU"}}
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        raise ClusterError(
            f"the cluster has no room for {world_size} ranks placed {strategy!r} (each needs {bundle}; "
            f"{nodes} nodes alive, free now: {have}): stop other work on it, ask for fewer ranks, "
            "or choose another strategy"
        )
    return group


def _check_feasible(world_size: int, bundle: dict[str, float], strategy: str) -> None:
    """Fail at once when the alive nodes together can never hold the ranks (e.g. after a node was lost)."""
    import ray

    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    have = {kind: sum(node.get(kind, 0.0) for node in nodes) for kind in bundle}
    short = {kind: need * world_size - have[kind] for kind, need in bundle.items()}
    missing = {kind: amount for kind, amount in short.items() if amount > 0}
    if missing:
        raise ClusterError(
            f"the cluster cannot hold {world_size} ranks: its {len(nodes)} alive nodes lack "
            + ", ".join(f"{amount:g} {kind}" for kind, amount in missing.items())
            + ". Ask for fewer ranks, or bring back the missing nodes."
        )
    if strategy == "STRICT_SPREAD" and len(nodes) < world_size:
        raise ClusterError(
            f"'strict_spread' needs one node per rank: {world_size} ranks, {len(nodes)} nodes alive. "
            "Ask for fewer ranks or use 'spread'."
        )


def wait_until_names_free(name: str, world_size: int, *, timeout_s: float = 15.0) -> None:
    """Wait until killed ranks named ``name`` are gone from Ray's registry (it frees names lazily)."""
    import time

    import ray

    deadline = time.monotonic() + timeout_s
    for rank in range(world_size):
        while time.monotonic() < deadline:
            try:
                ray.get_actor(rank_actor_name(name, rank))
            except ValueError:  # no such actor: the name is free
                break
            time.sleep(0.2)


def find_named_ranks(name: str) -> tuple[list[Any], Any] | None:
    """The actors ``<name>.rank0..N-1`` and their placement group, or None when none is left.

    Raises ClusterError when only some ranks are left (a node was lost while the kernel was
    away): the survivors cannot form the old group, so the message says which are gone.
    """
    import ray
    from ray.util.placement_group import get_placement_group

    def lookup(rank: int) -> Any:
        try:
            return ray.get_actor(rank_actor_name(name, rank))
        except ValueError:  # Ray's "Failed to look up actor": no such name
            return None

    first = lookup(0)
    if first is None:
        return None
    world_size = int(ray.get(first.node_info.remote(), timeout=30)["world_size"])
    actors = [first] + [lookup(rank) for rank in range(1, world_size)]
    gone = [rank for rank, actor in enumerate(actors) if actor is None]
    if gone:
        # The survivors cannot form the old group again: stop them, so the name is free.
        for actor in actors:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        raise ClusterError(
            f"ranks {gone} of the {world_size} ranks named {name!r} are gone (their node or process "
            "died); the others were stopped. Connect again for fresh ranks."
        )
    try:
        group = get_placement_group(_group_name(name))
    except ValueError:  # the ranks outlived their group: nothing holds their resources
        group = None
    return actors, group
