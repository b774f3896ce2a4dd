"""``nbt.Cluster``: N rank workers over Ray that feel like one notebook.

    cl = nbt.Cluster.local(ranks=2)           # starts a local Ray cluster (token auth on)
    cl.run("import torch; dist.get_rank()")   # [0, 1]: one value per rank, in rank order
    tr = cl.profile(step_fn, steps=3)         # a multi-rank Trace, analysed like a local one
    cl.status(); cl.restart(); cl.close()

Every rank is a Ray actor placed by a placement group (one GPU each when the cluster has
GPUs) and a member of one ``torch.distributed`` group (NCCL on GPUs, gloo otherwise),
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Each rank keeps a namespace
across calls, pre-filled with ``rank``, ``world_size``, ``torch``, ``dist`` and ``device``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.errors import ClusterError, NbtUsageError
from nbtoolkit.model._result import Result, escape

if TYPE_CHECKING:
    from nbtoolkit.cluster.connection import Attachment
    from nbtoolkit.cluster.ranks import RankCallResult, RankGroup
    from nbtoolkit.model.rank_memory import RankMemory
    from nbtoolkit.model.trace import Trace

__all__ = ["Cluster", "ClusterStatus", "RemoteCellError", "RemoteRun", "parse_ranks"]

OutputCallback = Callable[[int, str, str], None]

# The cluster the magics (and Cluster.current()) use: the last one started or connected.
_current: Cluster | None = None


def parse_ranks(spec: str | int | Sequence[int] | None, world_size: int) -> list[int]:
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


def _group_tracebacks(errors: dict[int, str]) -> list[tuple[list[int], str]]:
    groups: dict[str, list[int]] = {}
    for rank in sorted(errors):
        groups.setdefault(errors[rank], []).append(rank)
    return [(ranks, text) for text, ranks in groups.items()]


def _rank_label(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class RemoteCellError(ClusterError):
    """A cell failed on one or more ranks: a Python exception, a rank that died, or an interrupt.

    ``errors`` maps rank -> the remote traceback text; ``dead`` maps rank -> why its
    process is gone. The message shows each failing rank's traceback once (ranks with the
    same traceback share one block).
    """

    def __init__(self, run: RemoteRun) -> None:
        self.run = run
        self.errors = dict(run.errors)
        self.dead = dict(run.dead)
        super().__init__(run.failure_text())


class RemoteRun(Result):
    """What one call on the ranks gave back: values, errors, deaths, timings."""

    def __init__(self, ranks: list[int], raw: RankCallResult) -> None:
        self.ranks = ranks
        self.values: dict[int, Any] = {}
        self.errors: dict[int, str] = {}
        self.elapsed_s: dict[int, float] = {}
        for rank, outcome in raw.outcomes.items():
            self.values[rank] = outcome.get("value")
            self.elapsed_s[rank] = float(outcome.get("elapsed_s", 0.0))
            if outcome.get("error"):
                self.errors[rank] = str(outcome["error"])
        self.dead = {f.rank: f.cause for f in raw.dead}
        self.stuck = list(raw.stuck)
        self.freed = list(raw.freed)
        self.regroup_error = raw.regroup_error
        self.interrupted = raw.interrupted

    @property
    def ok(self) -> bool:
        return not (self.errors or self.dead or self.stuck or self.interrupted)

    def value_list(self) -> list[Any]:
        """The values in rank order (None for a rank that failed)."""
        return [self.values.get(r) for r in self.ranks]

    def failure_text(self) -> str:
        failed = sorted(set(self.errors) | set(self.dead) | set(self.stuck))
        parts = []
        if self.interrupted:
            parts.append(f"interrupted (Ctrl-C) on {_rank_label(self.ranks)}")
        if self.dead:
            deaths = "; ".join(f"rank {r} died: {cause}" for r, cause in sorted(self.dead.items()))
            parts.append(
                deaths + ". Its process is gone and the process group is broken: run "
                "cluster.restart() (or `%nbt cluster restart`) for fresh ranks"
            )
        if self.freed and self.regroup_error:
            parts.append(
                f"{_rank_label(self.freed)} kept waiting in a collective for ranks that had stopped; "
                "nbtoolkit closed the process group to free it, but forming a new one failed "
                f"({self.regroup_error}): run cluster.restart() for fresh ranks"
            )
        elif self.freed:
            parts.append(
                f"{_rank_label(self.freed)} kept waiting in a collective for ranks that had stopped; "
                "nbtoolkit closed the process group to free it and formed a new one. Every rank kept "
                "its variables, but objects built on the old group (DDP models, DeepSpeed engines, "
                "subgroups) must be built again"
            )
        if self.stuck:
            parts.append(
                f"{_rank_label(self.stuck)} did not stop and may be blocked in a collective "
                "until its timeout: run cluster.restart() for fresh ranks"
            )
        head = (
            f"the cell failed on {len(failed)} of {len(self.ranks)} ranks" if failed else "the cell stopped"
        )
        lines = [head + (": " + "; ".join(parts) if parts else "")]
        for ranks, text in _group_tracebacks(self.errors):
            lines.append(f"--- {_rank_label(ranks)} ---")
            lines.append(text)
        return "\n".join(lines)

    def raise_for_errors(self) -> None:
        if not self.ok:
            raise RemoteCellError(self)

    def _text(self) -> str:
        lines = []
        for rank in self.ranks:
            if rank in self.dead:
                lines.append(f"[rank {rank}] died: {self.dead[rank]}")
            elif rank in self.errors:
                lines.append(f"[rank {rank}] error: {self.errors[rank].splitlines()[-1]}")
            elif self.values.get(rank) is not None:
                lines.append(f"[rank {rank}] {_short_repr(self.values[rank])}")
        return "\n".join(lines) or f"ran on {_rank_label(self.ranks)}: no values"

    def _html(self) -> str:
        from nbtoolkit.views.cluster import remote_run_html

        return remote_run_html(self)


def _short_repr(value: Any, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


class ClusterStatus(Result):
    """A snapshot of the cluster: address, backend, and one row per rank."""

    def __init__(self, header: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        self.header = header
        self.rows = rows

    def frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.rows)

    def _text(self) -> str:
        h = self.header
        lines = [
            f"Cluster at {h['address']} ({h['origin']}): {h['world_size']} ranks, backend {h['backend']}"
            + (f", master {h['master']}" if h.get("master") else ""),
        ]
        for row in self.rows:
            extra = f" — {row['cause']}" if row.get("cause") else ""
            busy = f", busy for {row['busy_s']:.1f} s" if row.get("busy_s") else ""
            lines.append(
                f"  rank {row['rank']}: {row['state']} (pid {row['pid']}, {row['ip']}, {row['device']}, "
                f"{row['cells_run']} cells run{busy}){extra}"
            )
        return "\n".join(lines)

    def _html(self) -> str:
        from nbtoolkit.views.cluster import status_html

        return status_html(self)


class Cluster(Result):
    """N rank workers over Ray forming one torch.distributed group; see the module docstring."""

    def __init__(
        self,
        attachment: Attachment,
        world_size: int,
        *,
        gpus: bool | None,
        collective_timeout_s: float,
        start_timeout_s: float,
    ) -> None:
        self._attachment: Attachment | None = attachment
        self._world_size = world_size
        self._gpus = gpus
        self.collective_timeout_s = collective_timeout_s
        self.start_timeout_s = start_timeout_s
        self._group: RankGroup | None = None
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
        ranks: int = 2,
        *,
        gpus: bool | None = None,
        collective_timeout_s: float = 120.0,
        start_timeout_s: float = 120.0,
        object_store_mb: int = 256,
    ) -> Cluster:
        """Start a local Ray cluster (or use the one this process is attached to) with ``ranks`` ranks.

        The cluster gets exactly ``ranks`` CPUs (one per rank), no dashboard, and token
        authentication with a random token (``cluster.token``). ``gpus=None`` uses one GPU
        per rank when the machine has enough of them (NCCL), else CPUs (gloo).
        ``collective_timeout_s`` bounds how long a rank waits for a peer in a collective.
        """
        from nbtoolkit.cluster.connection import attach_local

        world_size = _check_ranks(ranks)
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
        )

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        token: str | None = None,
        ranks: int | None = None,
        gpus: bool | None = None,
        collective_timeout_s: float = 120.0,
        start_timeout_s: float = 120.0,
    ) -> Cluster:
        """Attach to the Ray cluster at ``address`` (``host:port``) and start ranks on it.

        ``token`` is the cluster's auth token (else RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
        ~/.ray/auth_token). A wrong or missing token fails within seconds with
        "authentication failed". ``ranks`` defaults to the cluster's GPU count, or 2.
        """
        from nbtoolkit.cluster.connection import cluster_resources, connect

        if not isinstance(address, str) or ":" not in address:
            raise NbtUsageError(f"address must be 'host:port' of the Ray head (GCS), got {address!r}")
        attachment = connect(address.removeprefix("ray://"), token)
        return cls._ranks_on(
            attachment,
            lambda: _check_ranks(ranks if ranks is not None else int(cluster_resources().get("GPU", 0)) or 2),
            gpus=gpus,
            collective_timeout_s=collective_timeout_s,
            start_timeout_s=start_timeout_s,
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
        )

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

    # ---- running code ----
    def execute(
        self,
        code_or_fn: str | Callable[..., Any],
        *,
        ranks: str | int | Sequence[int] | None = None,
        on_output: OutputCallback | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> RemoteRun:
        """Run a cell (source text, in each rank's namespace) or call a function on each rank.

        Never raises for a failure on the ranks: the returned :class:`RemoteRun` holds
        values, remote tracebacks and dead ranks (``.raise_for_errors()``). ``on_output``
        receives ``(rank, stream, text)`` as the ranks print.
        """
        group = self._live_group()
        chosen = parse_ranks(ranks, self._world_size)
        if isinstance(code_or_fn, str):
            raw = group.call(chosen, "run_cell", code_or_fn, on_output=on_output)
        elif callable(code_or_fn):
            raw = group.call(chosen, "run_function", code_or_fn, args, kwargs or {}, on_output=on_output)
        else:
            raise NbtUsageError(f"run takes cell source (str) or a function, got {type(code_or_fn).__name__}")
        return RemoteRun(chosen, raw)

    def run(
        self,
        code_or_fn: str | Callable[..., Any],
        *,
        ranks: str | int | Sequence[int] | None = None,
        on_output: OutputCallback | None = None,
    ) -> list[Any]:
        """One result per rank, in rank order; raises :class:`RemoteCellError` if any rank failed."""
        result = self.execute(code_or_fn, ranks=ranks, on_output=on_output)
        result.raise_for_errors()
        return result.value_list()

    def _tool(
        self,
        name: str,
        code_or_fn: str | Callable[..., Any],
        ranks: str | int | Sequence[int] | None,
        kwargs: dict[str, Any],
        on_output: OutputCallback | None,
    ) -> RemoteRun:
        if not (isinstance(code_or_fn, str) or callable(code_or_fn)):
            raise NbtUsageError(f"expected cell source (str) or a function, got {type(code_or_fn).__name__}")
        group = self._live_group()
        chosen = parse_ranks(ranks, self._world_size)
        raw = group.call(
            chosen, "run_tool", "nbtoolkit.cluster.rank_tools", name, code_or_fn, kwargs, on_output=on_output
        )
        result = RemoteRun(chosen, raw)
        result.raise_for_errors()
        return result

    def profile(
        self,
        code_or_fn: str | Callable[..., Any],
        *,
        steps: int = 3,
        warmup: int = 1,
        ranks: str | int | Sequence[int] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        save_dir: str | Path | None = None,
        on_output: OutputCallback | None = None,
    ) -> Trace:
        """Profile ``warmup + steps`` runs of the step on every rank; return one multi-rank Trace.

        Each rank records a torch.profiler Chrome trace (the warmup runs unrecorded), ships
        it back gzipped, and the notebook reads the per-rank files with
        :func:`nbtoolkit.load_trace`. ``save_dir`` keeps those files (``rank<N>.json.gz``).
        """
        if steps < 1 or warmup < 0:
            raise NbtUsageError(f"steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
        result = self._tool(
            "profile_to_bytes",
            code_or_fn,
            ranks,
            {
                "steps": steps,
                "warmup": warmup,
                "record_shapes": record_shapes,
                "profile_memory": profile_memory,
                "with_stack": with_stack,
            },
            on_output,
        )
        from nbtoolkit.io.kineto import load_trace

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

    def memory(
        self,
        code_or_fn: str | Callable[..., Any],
        *,
        ranks: str | int | Sequence[int] | None = None,
        on_output: OutputCallback | None = None,
        **options: Any,
    ) -> RankMemory:
        """:func:`nbtoolkit.memory_timeline` of the step on every rank: a :class:`RankMemory`.

        The result is a sequence of one MemoryTimeline per rank, in rank order, with a
        per-rank peak table and figure. ``options`` go to ``memory_timeline`` (``steps``,
        ``device``); ``model`` and ``optimizer`` may be given as names of variables in the
        ranks' namespaces.
        """
        from nbtoolkit.model.rank_memory import RankMemory

        result = self._tool("memory_timeline_on_rank", code_or_fn, ranks, options, on_output)
        return RankMemory(timelines={rank: result.values[rank] for rank in result.ranks})

    def graphs(
        self,
        code_or_fn: str | Callable[..., Any],
        *,
        ranks: str | int | Sequence[int] | None = None,
        on_output: OutputCallback | None = None,
        **options: Any,
    ) -> list[Any]:
        """:func:`nbtoolkit.capture_graphs` of the step on every rank: one GraphReport per rank."""
        return self._tool("capture_graphs_on_rank", code_or_fn, ranks, options, on_output).value_list()

    def step_metrics(
        self,
        code_or_fn: str | Callable[..., Any],
        *,
        ranks: str | int | Sequence[int] | None = None,
        on_output: OutputCallback | None = None,
        **options: Any,
    ) -> list[Any]:
        """:func:`nbtoolkit.step_metrics` of the step on every rank: one StepMetrics per rank.

        A per-rank table: ``nbtoolkit.model.metrics.metrics_frame(results, label="rank")``;
        a chart: ``nbt.mfu_chart(results)``.
        """
        return self._tool("step_metrics_on_rank", code_or_fn, ranks, options, on_output).value_list()

    # ---- variables ----
    def push(self, values: dict[str, Any], *, ranks: str | int | Sequence[int] | None = None) -> None:
        """Set variables in the namespace of each rank (``values`` maps name -> value)."""
        bad = [name for name in values if not str(name).isidentifier()]
        if bad:
            raise NbtUsageError(f"cannot push {bad}: names must be Python identifiers")
        chosen = parse_ranks(ranks, self._world_size)
        RemoteRun(chosen, self._live_group().call(chosen, "push", dict(values))).raise_for_errors()

    def pull(self, name: str, *, ranks: str | int | Sequence[int] | None = None) -> list[Any]:
        """A variable's value from each rank, in rank order."""
        if not name.isidentifier():
            raise NbtUsageError(f"cannot pull {name!r}: give a variable name")
        return self.run(name, ranks=ranks)

    # ---- files ----
    def fetch(
        self,
        pattern: str,
        *,
        into: str | Path | None = None,
        ranks: str | int | Sequence[int] | None = None,
        max_bytes: int = 1 << 30,
    ) -> list[Path]:
        """Copy the files matching ``pattern`` on each rank into a folder of the notebook's machine.

        For what the ranks wrote themselves: profiler traces, CUDA memory snapshots,
        ``TORCH_TRACE`` compile logs. ``{rank}`` in the pattern becomes each rank's number
        (ranks of a local cluster share one file system), ``~`` is expanded and ``**``
        matches folders recursively. Each file lands as ``rank<N>-<name>`` in ``into`` (a new
        temporary folder by default), so ``nbt.load_trace(folder)`` and
        ``nbt.load_compile_log(folder)`` see one rank per file. At most ``max_bytes`` per rank.
        Returns the local paths, sorted.
        """
        from nbtoolkit.cluster.rank_tools import read_matching_files

        result = self.execute(read_matching_files, args=(pattern, max_bytes), ranks=ranks)
        result.raise_for_errors()
        if not any(result.values.get(rank) for rank in result.ranks):
            raise ClusterError(
                f"no file matches {pattern!r} on {_rank_label(result.ranks)}: check the path on the ranks "
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
        return sorted(written)

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


def _check_ranks(ranks: int) -> int:
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise NbtUsageError(f"ranks must be a positive integer, got {ranks!r}")
    return ranks
