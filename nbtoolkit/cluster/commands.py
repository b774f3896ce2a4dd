"""``%nbt cluster ACTION [TARGET]`` as one function, so that a script gets what the magic shows.

    cluster_command("start", "4")                      # a local cluster of 4 ranks
    cluster_command("connect", "head:6379", token_file="~/.ray/token")
    cluster_command("status"); cluster_command("restart"); cluster_command("stop")
    cluster_command("why")                             # the hang diagnosis (HangReport)

Slow actions (start, connect, restart) show a one-line progress note in a notebook when
they take longer than a second; outside a kernel nothing is shown.
"""

from __future__ import annotations

from pathlib import Path

from nbtoolkit.cluster.cluster import Cluster
from nbtoolkit.cluster.hang import HangReport
from nbtoolkit.cluster.rank_spec import rank_count
from nbtoolkit.cluster.state import CLUSTER_ACTIONS, COLLECTIVE_TIMEOUT_S, ClusterStatus
from nbtoolkit.core.errors import NbtUsageError

__all__ = ["cluster_command"]


def cluster_command(
    action: str,
    target: str | None = None,
    *,
    token_file: str | Path | None = None,
    ranks: int | None = None,
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
    strategy: str = "pack",
    name: str | None = None,
) -> Cluster | ClusterStatus | HangReport | None:
    """Start, connect to, inspect, restart or stop the notebook's cluster.

    - ``start [N]``: a local Ray cluster with N ranks (``target``, or ``ranks``; default 2);
      returns the :class:`Cluster`.
    - ``connect ADDRESS``: attach to ``ray://HEAD:10001`` (from outside the cluster) or
      ``HEAD:6379`` (from a node) and start ``ranks`` ranks (default: one per GPU, else per
      CPU) placed by ``strategy``; ``token_file`` holds the cluster's token; ``name`` keeps
      the ranks across kernel restarts (see :meth:`Cluster.connect`). Returns the :class:`Cluster`.
    - ``status``: the current cluster's :class:`ClusterStatus`, asked of the ranks live.
    - ``restart``: fresh ranks on the current cluster; returns its status.
    - ``why``: the hang diagnosis (:meth:`Cluster.hang_report`): live, or of the last stall.
    - ``stop``: stop the ranks (and the Ray cluster, if this process started it); prints
      ``cluster stopped`` and returns None.
    """
    from nbtoolkit.core.progress import DelayedProgress

    if action not in CLUSTER_ACTIONS:
        raise NbtUsageError(f"unknown cluster action {action!r}: use one of {', '.join(CLUSTER_ACTIONS)}")
    if action == "start":
        count = rank_count(target if target is not None else ranks)
        with DelayedProgress(f"starting a local Ray cluster with {count} ranks"):
            return Cluster.local(ranks=count, collective_timeout_s=collective_timeout_s, strategy=strategy)
    if action == "connect":
        if not target:
            raise NbtUsageError("`cluster connect ADDRESS` needs the head's host:port")
        with DelayedProgress(f"connecting to {target} and starting ranks"):
            return Cluster.connect(
                target,
                token_file=token_file,
                ranks=ranks,
                collective_timeout_s=collective_timeout_s,
                strategy=strategy,
                name=name,
            )
    if target:
        raise NbtUsageError(f"`cluster {action}` takes no argument, got {target!r}")
    cluster = Cluster.current()
    if action == "status":
        return cluster.status()
    if action == "why":
        report: HangReport = cluster.hang_report()
        return report
    if action == "restart":
        with DelayedProgress(f"restarting {cluster.world_size} ranks"):
            cluster.restart()
        return cluster.status()
    cluster.close()  # stop
    print("cluster stopped")
    return None
