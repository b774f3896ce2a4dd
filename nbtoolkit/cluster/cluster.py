"""``nbt.Cluster``: N rank workers over Ray that feel like one notebook.

    cl = nbt.Cluster.local(ranks=2)           # starts a local Ray cluster (token auth on)
    cl.run("import torch; dist.get_rank()")   # [0, 1]: one value per rank, in rank order
    tr = cl.profile(step_fn, steps=3)         # a multi-rank Trace, analysed like a local one
    cl.status(); cl.restart(); cl.close()

Every rank is a Ray actor placed by a placement group (one GPU each when the cluster has
GPUs) and a member of one ``torch.distributed`` group (NCCL on GPUs, gloo otherwise),
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Each rank keeps a namespace
across calls, pre-filled with ``rank``, ``world_size``, ``torch``, ``dist`` and ``device``.

This module holds the cluster's lifecycle (start, connect, status, restart, close). The
class gets its other jobs from two mixins: running code and instruments on the ranks
(:mod:`nbtoolkit.cluster.running`) and moving variables and files (:mod:`nbtoolkit.cluster.transfer`).
Its results are model objects (:mod:`nbtoolkit.cluster.state`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.cluster.rank_spec import rank_count
from nbtoolkit.cluster.state import (
    COLLECTIVE_TIMEOUT_S,
    DEFAULT_RANKS,
    START_TIMEOUT_S,
    ClusterStatus,
)
from nbtoolkit.cluster.transfer import ClusterTransfer
from nbtoolkit.core.errors import ClusterError, NbtUsageError
from nbtoolkit.core.result import Result, escape

if TYPE_CHECKING:
    from nbtoolkit.cluster.connection import Attachment
    from nbtoolkit.cluster.ranks import RankGroup
    from nbtoolkit.trace.summary import TraceSummary
    from nbtoolkit.trace.trace import Trace

__all__ = ["Cluster"]

#: Object store of a local cluster: results travel through it, traces are the largest.
OBJECT_STORE_MB = 256

def ranks_for(resources: dict[str, Any], ranks: int | str | None) -> int:
    """How many ranks ``connect`` starts: ``ranks``, else one per GPU, else one per CPU slot."""
    if ranks is not None:
        return rank_count(ranks)
    return rank_count(int(resources.get("GPU", 0)) or int(resources.get("CPU", 0)) or None)


# The cluster the magics (and Cluster.current()) use: the last one started or connected.
_current: Cluster | None = None


class Cluster(ClusterTransfer, Result):
    """N rank workers over Ray forming one torch.distributed group; see the module docstring."""

    def __init__(
        self,
        attachment: Attachment,
        world_size: int,
        *,
        gpus: bool | None,
        collective_timeout_s: float,
        start_timeout_s: float,
        strategy: str = "pack",
        name: str | None = None,
    ) -> None:
        self._attachment: Attachment | None = attachment
        self._world_size = world_size
        self._gpus = gpus
        self.collective_timeout_s = collective_timeout_s
        self.start_timeout_s = start_timeout_s
        self.strategy = strategy
        self.name = name
        #: True when ``connect(name=...)`` found the ranks a previous kernel left running.
        self.reattached = False
        self._group: RankGroup | None = None
        if name is None or not self._reattach(name):
            self._start_ranks()
        global _current
        _current = self

    @classmethod
    def current(cls) -> Cluster:
        """The cluster started or connected last in this process (what ``%%nbt remote`` uses)."""
        if _current is None or _current.closed:
            raise ClusterError(
                "no cluster is running in this notebook: start one with `%nbt cluster start 2` "
                "(or nbt.Cluster.local(ranks=2)), or connect with `%nbt cluster connect ADDRESS`"
            )
        return _current

    # ---- construction ----
    @classmethod
    def local(
        cls,
        ranks: int | str = DEFAULT_RANKS,
        *,
        gpus: bool | None = None,
        collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        object_store_mb: int = OBJECT_STORE_MB,
        strategy: str = "pack",
    ) -> Cluster:
        """Start a local Ray cluster (or use the one this process is attached to) with ``ranks`` ranks.

        The cluster gets exactly ``ranks`` CPUs (one per rank), no dashboard, and token
        authentication with a random token (``cluster.token``). ``gpus=None`` uses one GPU
        per rank when the machine has enough of them (NCCL), else CPUs (gloo).
        ``collective_timeout_s`` bounds how long a rank waits for a peer in a collective.
        ``ranks`` may be given as text (``"4"``, as a magic line has it). ``strategy``
        places the ranks (see :meth:`connect`).
        """
        from nbtoolkit.cluster.connection import attach_local
        from nbtoolkit.cluster.placement import check_local_room, parse_strategy

        world_size = rank_count(ranks)
        parse_strategy(strategy)
        check_local_room(world_size)
        num_gpus = None if gpus is None else (world_size if gpus else 0)
        attachment = attach_local(
            num_cpus=world_size, num_gpus=num_gpus, object_store_bytes=object_store_mb * 1024 * 1024
        )
        return cls._ranks_on(
            attachment,
            lambda: world_size,
            gpus=gpus,
            collective_timeout_s=collective_timeout_s,
            start_timeout_s=start_timeout_s,
            strategy=strategy,
        )

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        token: str | None = None,
        token_file: str | Path | None = None,
        ranks: int | None = None,
        gpus: bool | None = None,
        collective_timeout_s: float = COLLECTIVE_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        strategy: str = "pack",
        name: str | None = None,
    ) -> Cluster:
        """Attach to the Ray cluster at ``address`` and start ranks on it.

        ``address`` is either
        - ``ray://HEAD:10001``, the head's Ray Client server, from a notebook outside the
          cluster (only that port must be reachable); or
        - ``HEAD:6379``, the head's GCS, from a kernel on one of the cluster's nodes.

        ``token`` is the cluster's auth token, or ``token_file`` a file holding it (what
        :meth:`save_token` writes); else RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
        ~/.ray/auth_token. A wrong or missing token fails within seconds with
        "authentication failed"; an address where nothing answers within 5 s.

        ``ranks`` defaults to one per GPU of the cluster, else one per CPU. They are placed
        by a placement group with ``strategy`` ``"pack"`` (few nodes) or ``"spread"`` (many
        nodes), or their ``strict_`` forms. With ``name``, the ranks outlive this kernel:
        connecting again with the same name (after a kernel restart) re-attaches to them,
        their namespaces intact (``cluster.reattached``); when none are left, new ones start.
        """
        from nbtoolkit.cluster.connection import cluster_resources, connect, read_token_file
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
        if token_file is not None:
            token = read_token_file(token_file)
        attachment = connect(address, token)

        return cls._ranks_on(
            attachment,
            lambda: ranks_for(cluster_resources(), ranks),
            gpus=gpus,
            collective_timeout_s=collective_timeout_s,
            start_timeout_s=start_timeout_s,
            strategy=strategy,
            name=name,
        )

    @classmethod
    def _ranks_on(cls, attachment: Attachment, world_size: Callable[[], int], **options: Any) -> Cluster:
        """Start ranks on an attached Ray cluster; if that fails, the attachment is released."""
        from nbtoolkit.cluster.connection import detach

        try:
            return cls(attachment, world_size(), **options)
        except BaseException:
            detach(attachment)
            raise

    def _start_ranks(self) -> None:
        from nbtoolkit.cluster.connection import cluster_resources
        from nbtoolkit.cluster.ranks import RankGroup

        use_gpus = self._gpus
        if use_gpus is None:
            use_gpus = cluster_resources().get("GPU", 0) >= self._world_size
        self._group = RankGroup(
            self._world_size,
            use_gpus=bool(use_gpus),
            collective_timeout_s=self.collective_timeout_s,
            start_timeout_s=self.start_timeout_s,
            strategy=self.strategy,
            name=self.name,
        )

    def _reattach(self, name: str) -> bool:
        """Take over the ranks named ``name`` if they are running; say so either way."""
        from nbtoolkit.cluster.placement import find_named_ranks
        from nbtoolkit.cluster.ranks import RankGroup

        found = find_named_ranks(name)
        if found is None:
            print(f"no ranks named {name!r} are running on this cluster: starting {self._world_size} new")
            return False
        actors, placement = found
        self._group = RankGroup.attach(actors, placement, start_timeout_s=self.start_timeout_s)
        self._world_size = self._group.world_size
        self.collective_timeout_s = self._group.collective_timeout_s or self.collective_timeout_s
        self.reattached = True
        print(f"re-attached to the {self._world_size} ranks named {name!r} (their namespaces are kept)")
        return True

    # ---- properties ----
    @property
    def address(self) -> str:
        """``host:port`` of the Ray cluster's head (what ``Cluster.connect`` takes)."""
        return self._live_attachment().address

    @property
    def token(self) -> str | None:
        """The cluster's auth token (for connecting from elsewhere); not shown in displays."""
        return self._live_attachment().token

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def backend(self) -> str:
        return self._live_group().backend

    @property
    def pids(self) -> list[int]:
        """Process id of each rank worker, in rank order."""
        return [info.pid for info in self._live_group().ranks]

    @property
    def closed(self) -> bool:
        return self._attachment is None

    def save_token(self, path: str | Path) -> Path:
        """Write the token to ``path`` readable by its owner only (for ``--token-file``)."""
        token = self.token
        if not token:
            raise ClusterError("this cluster has no auth token to save")
        target = Path(path).expanduser()
        target.touch(mode=0o600, exist_ok=True)
        target.chmod(0o600)
        target.write_text(token)
        return target

    def _live_attachment(self) -> Attachment:
        if self._attachment is None:
            raise ClusterError(
                "this Cluster is closed: start a new one with Cluster.local() or Cluster.connect()"
            )
        return self._attachment

    def _live_group(self) -> RankGroup:
        self._live_attachment()
        if self._group is None:
            raise ClusterError("this Cluster has no ranks: run cluster.restart()")
        return self._group

    # ---- status and lifecycle ----
    def status(self) -> ClusterStatus:
        """Each rank's state (idle, busy, dead, broken), pid, node and device; asks the ranks live."""
        attachment = self._live_attachment()
        header = {
            "address": attachment.address,
            "origin": "started by this notebook" if attachment.started_here else "connected",
            "world_size": self._world_size,
            "backend": self._group.backend if self._group else "-",
            "master": self._group.master if self._group and hasattr(self._group, "master") else None,
            "nodes": len({info.ip for info in self._group.ranks}) if self._group else 0,
        }
        rows = []
        if self._group is not None:
            for entry in self._group.states():
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

    def restart(self) -> Cluster:
        """Fresh ranks (new processes, empty namespaces, a new process group) on the same cluster."""
        self._live_attachment()
        if self._group is not None:
            self._group.kill()
            self._group = None
            if self.name is not None:  # the new ranks take the same names
                from nbtoolkit.cluster.placement import wait_until_names_free

                wait_until_names_free(self.name, self._world_size)
        self._start_ranks()
        return self

    def close(self) -> None:
        """Stop the ranks; stop the Ray cluster if this notebook started it, else disconnect."""
        if self._attachment is None:
            return
        from nbtoolkit.cluster.connection import detach

        try:
            if self._group is not None:
                self._group.kill()
        finally:
            global _current
            if _current is self:
                _current = None
            self._group = None
            attachment, self._attachment = self._attachment, None
            detach(attachment)

    def hang_report(self) -> Any:
        """Why the ranks are stuck: a HangReport (``.frame()`` per rank, ``.verdicts``, its text).

        Live while a cell runs (call it from another thread); after a cell, the diagnosis of
        its last stall or Ctrl-C. See :mod:`nbtoolkit.cluster.hang_watch`.
        """
        from nbtoolkit.cluster.hang_watch import hang_report

        return hang_report(self._live_group())

    def summarize_traces(self, where: str | Path, **options: Any) -> TraceSummary:
        """Summarize the rank traces ``where`` names on the nodes holding them (a TraceSummary).

        Each node parses its own files; only per-rank summaries come back
        (:mod:`nbtoolkit.cluster.summarize_traces`). Options as ``nbt.summarize_traces``:
        ``cache=``, ``on_error=``, ``include_last_step=``.
        """
        from nbtoolkit.cluster.summarize_traces import summarize_on_cluster

        return summarize_on_cluster(self, str(where), **options)

    def load_trace_ranks(self, summary: TraceSummary, ranks: list[int], *, cache: bool = False) -> Trace:
        """The events of a few ranks of a cluster-made TraceSummary, read on their nodes (for lanes)."""
        from nbtoolkit.cluster.summarize_traces import load_ranks_on_cluster

        return load_ranks_on_cluster(self, summary, list(ranks), cache=cache)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- display ----
    def _text(self) -> str:
        if self._attachment is None:
            return "Cluster (closed)"
        group = self._group
        backend = group.backend if group else "-"
        states = [i.state for i in group.ranks] if group else []
        summary = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states)) or "no ranks"
        origin = "local, started here" if self._attachment.started_here else "connected"
        address = self._attachment.address
        return f"Cluster at {address} ({origin}): {self._world_size} ranks, {backend} ({summary})"

    def _html(self) -> str:
        return f"<div class='nbt-cluster'><b>nbtoolkit</b> {escape(self._text())}</div>"
