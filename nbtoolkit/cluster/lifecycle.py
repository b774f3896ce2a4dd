"""Starting, re-attaching and inspecting a Cluster's ranks: plain functions behind its lifecycle.

:class:`nbtoolkit.cluster.cluster.Cluster` holds the attachment and the live
:class:`~nbtoolkit.cluster.ranks.RankGroup`; these functions attach a local Ray cluster,
make a group (new, or the named ranks a previous kernel left running), check what
``Cluster.connect`` is given, and read a group's live state into a
:class:`~nbtoolkit.cluster.state.ClusterStatus` (or one line).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.cluster.rank_spec import rank_count
from nbtoolkit.cluster.state import ClusterStatus
from nbtoolkit.core.errors import ClusterError, NbtUsageError

if TYPE_CHECKING:
    from nbtoolkit.cluster.connection import Attachment
    from nbtoolkit.cluster.ranks import RankGroup

__all__ = [
    "attach_local_ranks",
    "check_connect",
    "cluster_line",
    "cluster_status",
    "ranks_for",
    "reattach_group",
    "save_token",
    "start_group",
]


def ranks_for(resources: dict[str, Any], ranks: int | str | None) -> int:
    """How many ranks ``connect`` starts: ``ranks``, else one per GPU, else one per CPU slot."""
    if ranks is not None:
        return rank_count(ranks)
    return rank_count(int(resources.get("GPU", 0)) or int(resources.get("CPU", 0)) or None)


def attach_local_ranks(
    ranks: int | str, *, gpus: bool | None, object_store_mb: int, strategy: str
) -> tuple[int, Attachment]:
    """Check room for ``ranks`` ranks, start (or join) the local Ray cluster: (world size, attachment)."""
    from nbtoolkit.cluster.connection import attach_local
    from nbtoolkit.cluster.placement import check_local_room, parse_strategy

    world_size = rank_count(ranks)
    parse_strategy(strategy)
    check_local_room(world_size)
    num_gpus = None if gpus is None else (world_size if gpus else 0)
    attachment = attach_local(
        num_cpus=world_size, num_gpus=num_gpus, object_store_bytes=object_store_mb * 1024 * 1024
    )
    return world_size, attachment


def check_connect(address: Any, token: str | None, token_file: Any, name: Any, strategy: str) -> None:
    """What ``Cluster.connect`` is given, checked before anything is contacted."""
    from nbtoolkit.cluster.placement import parse_strategy

    if not isinstance(address, str) or ":" not in address.removeprefix("ray://"):
        raise NbtUsageError(
            "address must be 'ray://HEAD:10001' (Ray Client, from outside the cluster) or "
            f"'HEAD:6379' (the head's GCS, from a cluster node), got {address!r}"
        )
    if token is not None and token_file is not None:
        raise NbtUsageError("give the cluster's token or a token file, not both")
    if name is not None and not (isinstance(name, str) and name.replace("-", "_").isidentifier()):
        raise NbtUsageError(f"name must be letters, digits, '-' or '_', got {name!r}")
    parse_strategy(strategy)


def start_group(
    world_size: int,
    *,
    gpus: bool | None,
    collective_timeout_s: float,
    start_timeout_s: float,
    strategy: str,
    name: str | None,
) -> RankGroup:
    """New ranks on the attached cluster; ``gpus`` None: one GPU each when the cluster has enough."""
    from nbtoolkit.cluster.connection import cluster_resources
    from nbtoolkit.cluster.ranks import RankGroup

    use_gpus = gpus
    if use_gpus is None:
        use_gpus = cluster_resources().get("GPU", 0) >= world_size
    return RankGroup(
        world_size,
        use_gpus=bool(use_gpus),
        collective_timeout_s=collective_timeout_s,
        start_timeout_s=start_timeout_s,
        strategy=strategy,
        name=name,
    )


def reattach_group(name: str, world_size: int, *, start_timeout_s: float) -> RankGroup | None:
    """The running ranks named ``name`` as a group, else None; prints which it is."""
    from nbtoolkit.cluster.placement import find_named_ranks
    from nbtoolkit.cluster.ranks import RankGroup

    found = find_named_ranks(name)
    if found is None:
        print(f"no ranks named {name!r} are running on this cluster: starting {world_size} new")
        return None
    actors, placement = found
    group = RankGroup.attach(actors, placement, start_timeout_s=start_timeout_s)
    print(f"re-attached to the {group.world_size} ranks named {name!r} (their namespaces are kept)")
    return group


def cluster_status(attachment: Attachment, world_size: int, group: RankGroup | None) -> ClusterStatus:
    """Each rank's state (idle, busy, dead, broken, unresponsive), pid, node and device, asked live."""
    header = {
        "address": attachment.address,
        "origin": "started by this notebook" if attachment.started_here else "connected",
        "world_size": world_size,
        "backend": group.backend if group else "-",
        "master": group.master if group and hasattr(group, "master") else None,
        "nodes": len({info.ip for info in group.ranks}) if group else 0,
    }
    rows = []
    if group is not None:
        for entry in group.states():
            info, live = entry["info"], entry["live"]
            state = info.state
            if state not in {"dead", "broken"} and live.get("busy_s") is not None:
                state = "busy"
            if live.get("unresponsive"):
                state = "unresponsive"
            rows.append(
                {
                    "rank": info.rank,
                    "state": state,
                    "pid": info.pid,
                    "node": info.host,
                    "ip": info.ip,
                    "device": live.get("device")
                    or (f"cuda:{info.gpu_ids[0]}" if info.gpu_ids else "cpu"),
                    "cells_run": int(live.get("cells_run") or 0),
                    "busy_s": live.get("busy_s"),
                    "cause": info.cause,
                }
            )
    return ClusterStatus(header, rows)


def cluster_line(attachment: Attachment | None, world_size: int, group: RankGroup | None) -> str:
    """The one-line display of a cluster: where, how many ranks, their backend and states."""
    if attachment is None:
        return "Cluster (closed)"
    backend = group.backend if group else "-"
    states = [i.state for i in group.ranks] if group else []
    summary = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states)) or "no ranks"
    origin = "local, started here" if attachment.started_here else "connected"
    return f"Cluster at {attachment.address} ({origin}): {world_size} ranks, {backend} ({summary})"


def save_token(token: str | None, path: str | Path) -> Path:
    """Write ``token`` to ``path`` readable by its owner only (for ``--token-file``)."""
    if not token:
        raise ClusterError("this cluster has no auth token to save")
    target = Path(path).expanduser()
    target.touch(mode=0o600, exist_ok=True)
    target.chmod(0o600)
    target.write_text(token)
    return target
