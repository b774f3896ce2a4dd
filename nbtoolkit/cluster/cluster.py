"""``nbt.Cluster``: N rank workers over Ray that feel like one notebook.

    cl = nbt.Cluster.local(ranks=2)           # starts a local Ray cluster (token auth on)
    cl.run("import torch; dist.get_rank()")   # [0, 1]: one value per rank, in rank order
    tr = cl.profile(step_fn, steps=3)         # a multi-rank Trace, analysed like a local one
    cl.status(); cl.restart(); cl.close()

Every rank is a Ray actor placed by a placement group (one GPU each when the cluster has
GPUs) and a member of one ``torch.distributed`` group (NCCL on GPUs, gloo otherwise),
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Each rank keeps a namespace
across calls, pre-filled with ``rank``, ``world_size``, ``torch``, ``dist`` and ``device``.

Every public method of the class is defined here; the work is done by plain functions of
the live rank group: its lifecycle (:mod:`nbtoolkit.cluster.lifecycle`), running code and
instruments on the ranks (:mod:`nbtoolkit.cluster.running`), moving variables and files
(:mod:`nbtoolkit.cluster.transfer`). Its results are model objects (:mod:`nbtoolkit.cluster.state`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.cluster import lifecycle, running, transfer
from nbtoolkit.cluster.group_types import OutputCallback
from nbtoolkit.cluster.rank_spec import RankSpec
from nbtoolkit.cluster.running import Step
from nbtoolkit.cluster.shipping import RESULT_MAX_BYTES
from nbtoolkit.cluster.state import (
    COLLECTIVE_TIMEOUT_S,
    DEFAULT_RANKS,
    PROFILE_STEPS,
    START_TIMEOUT_S,
    ClusterStatus,
    FetchedFiles,
    RemoteRun,
)
from nbtoolkit.cluster.transfer import FETCH_MAX_BYTES
from nbtoolkit.core.errors import ClusterError, NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig, measure_config
from nbtoolkit.core.result import Result, escape

if TYPE_CHECKING:
    from nbtoolkit.cluster.connection import Attachment
    from nbtoolkit.cluster.ranks import RankGroup
    from nbtoolkit.memory.rank_memory import RankMemory
    from nbtoolkit.trace.summary import TraceSummary
    from nbtoolkit.trace.trace import Trace

__all__ = ["Cluster"]

#: Object store of a local cluster: results travel through it, traces are the largest.
OBJECT_STORE_MB = 256


# The cluster the magics (and Cluster.current()) use: the last one started or connected.
_current: Cluster | None = None


class Cluster(Result):
    """N rank workers over Ray forming one torch.distributed group; see the module docstring."""

    #: Seconds without progress on any rank before a running cell shows the hang diagnosis
    #: (None: $NBT_HANG_AFTER_S, else 30; 0 turns it off). A call's ``hang_after_s`` wins.
    hang_after_s: float | None = None
    #: The most bytes (pickled) one rank's value may send back (``RESULT_MAX_BYTES``, 256 MiB);
    #: a call's ``max_result_bytes`` wins. Raise it for larger values: ``cluster.max_result_bytes = N``.
    max_result_bytes: int = RESULT_MAX_BYTES

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
        world_size, attachment = lifecycle.attach_local_ranks(
            ranks, gpus=gpus, object_store_mb=object_store_mb, strategy=strategy
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

        lifecycle.check_connect(address, token, token_file, name, strategy)
        if token_file is not None:
            token = read_token_file(token_file)
        attachment = connect(address, token)

        return cls._ranks_on(
            attachment,
            lambda: lifecycle.ranks_for(cluster_resources(), ranks),
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
        self._group = lifecycle.start_group(
            self._world_size,
            gpus=self._gpus,
            collective_timeout_s=self.collective_timeout_s,
            start_timeout_s=self.start_timeout_s,
            strategy=self.strategy,
            name=self.name,
        )

    def _reattach(self, name: str) -> bool:
        """Take over the ranks named ``name`` if they are running; say so either way."""
        group = lifecycle.reattach_group(name, self._world_size, start_timeout_s=self.start_timeout_s)
        if group is None:
            return False
        self._group = group
        self._world_size = group.world_size
        self.collective_timeout_s = group.collective_timeout_s or self.collective_timeout_s
        self.reattached = True
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
        return lifecycle.save_token(self.token, path)

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
        return lifecycle.cluster_status(self._live_attachment(), self._world_size, self._group)

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

    # ---- running code on the ranks (the work: nbtoolkit.cluster.running) ----
    def execute(
        self,
        code_or_fn: Step,
        *,
        ranks: RankSpec = None,
        on_output: OutputCallback | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        hang_after_s: float | None = None,
        on_hang: str = "wait",
        max_result_bytes: int | None = None,
    ) -> RemoteRun:
        """Run a cell (source text, in each rank's namespace) or call a function on each rank.

        Never raises for a failure on the ranks: the returned :class:`RemoteRun` holds
        values, remote tracebacks and dead ranks (``.raise_for_errors()``). ``on_output``
        receives ``(rank, stream, text)`` as the ranks print.

        When no rank makes progress (no collective completes, nothing is printed) for
        ``hang_after_s`` seconds (default :attr:`hang_after_s`), the hang diagnosis is shown
        (:meth:`hang_report`'s text); then the call keeps waiting (``on_hang="wait"``:
        Ctrl-C stops it) or stops like Ctrl-C (``on_hang="interrupt"``).

        A rank whose value pickles to more than ``max_result_bytes`` (default
        :attr:`max_result_bytes`) sends back an error naming its size instead; the rank stays usable.
        """
        return running.execute(
            self._live_group(),
            self._world_size,
            code_or_fn,
            ranks=ranks,
            on_output=on_output,
            args=args,
            kwargs=kwargs,
            hang_after_s=hang_after_s if hang_after_s is not None else self.hang_after_s,
            on_hang=on_hang,
            max_result_bytes=max_result_bytes if max_result_bytes is not None else self.max_result_bytes,
        )

    def run(
        self,
        code_or_fn: Step,
        *,
        ranks: RankSpec = None,
        on_output: OutputCallback | None = None,
        hang_after_s: float | None = None,
        on_hang: str = "wait",
        max_result_bytes: int | None = None,
    ) -> list[Any]:
        """One result per rank, in rank order; raises :class:`RemoteCellError` if any rank failed.

        ``hang_after_s``, ``on_hang`` and ``max_result_bytes``: see :meth:`execute`.
        """
        result = self.execute(
            code_or_fn,
            ranks=ranks,
            on_output=on_output,
            hang_after_s=hang_after_s,
            on_hang=on_hang,
            max_result_bytes=max_result_bytes,
        )
        result.raise_for_errors()
        return result.value_list()

    def run_cell(
        self,
        source: str,
        *,
        ranks: RankSpec = None,
        profile: bool = False,
        steps: int = PROFILE_STEPS,
        memory: bool = False,
        model: str | None = None,
        optimizer: str | None = None,
        hang_after_s: float | None = None,
        on_hang: str = "wait",
    ) -> RemoteRun | Trace | RankMemory | None:
        """Run a notebook cell on the ranks the way ``%%nbt remote`` does.

        Each line a rank prints appears as ``[rank N] line`` while the cell runs; a progress
        line appears when the cell runs longer than a few seconds. Returns the
        :class:`RemoteRun` (None when no rank gave a value, like a cell without a final
        expression), with ``profile=True`` a multi-rank Trace of ``steps`` runs, with
        ``memory=True`` a RankMemory (``model``/``optimizer``: variable names on the ranks).
        Raises :class:`~nbtoolkit.core.errors.RemoteCellError` when the cell failed on any rank.
        ``hang_after_s``/``on_hang``: the stall diagnosis of a plain run (see :meth:`execute`).
        """
        from nbtoolkit.cluster.output import RankPrefixedPrinter
        from nbtoolkit.core.progress import CELL_DELAY_S, DelayedProgress

        if profile and memory:
            raise NbtUsageError("choose one of profile and memory (--profile, --memory): not both")
        if (model or optimizer) and not memory:
            raise NbtUsageError("model and optimizer (--model, --optimizer) name variables for memory only")
        printer = RankPrefixedPrinter()
        try:
            with DelayedProgress(f"running on {ranks or 'all'} ranks", delay_s=CELL_DELAY_S):
                if profile:
                    return self.profile(source, steps=steps, ranks=ranks, on_output=printer)
                if memory:
                    names = {k: v for k, v in (("model", model), ("optimizer", optimizer)) if v}
                    return self.memory(source, ranks=ranks, on_output=printer, **names)
                result = self.execute(
                    source, ranks=ranks, on_output=printer, hang_after_s=hang_after_s, on_hang=on_hang
                )
                result.raise_for_errors()  # inside: the progress line then ends with "stopped"
        finally:
            printer.flush()
        return result if result.has_values else None

    def _tool(
        self,
        name: str,
        code_or_fn: Step,
        ranks: RankSpec,
        options: dict[str, Any],
        on_output: OutputCallback | None,
    ) -> RemoteRun:
        """Run ``nbtoolkit.cluster.rank_tools.<name>`` around the step on each rank; raise on failure."""
        running.check_step(code_or_fn)
        return running.run_tool(
            self._live_group(), self._world_size, name, code_or_fn, ranks=ranks, options=options,
            on_output=on_output, hang_after_s=self.hang_after_s,
        )

    def profile(
        self,
        code_or_fn: Step,
        *,
        steps: int | None = None,
        warmup: int | None = None,
        ranks: RankSpec = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        save_dir: str | Path | None = None,
        on_output: OutputCallback | None = None,
        config: MeasureConfig | None = None,
    ) -> Trace:
        """Profile ``warmup + steps`` runs of the step on every rank; return one multi-rank Trace.

        Each rank records a torch.profiler Chrome trace (the warmup runs unrecorded), ships
        it back gzipped, and the notebook reads the per-rank files with
        :func:`nbtoolkit.load_trace`. ``save_dir`` keeps those files (``rank<N>.json.gz``).
        ``config``: a :class:`~nbtoolkit.MeasureConfig` giving ``steps`` and ``warmup``
        (``steps=``/``warmup=`` given as well win); defaults ``MeasureConfig()``'s.
        """
        measure = measure_config(config, steps=steps, warmup=warmup)
        options = {
            "steps": measure.steps,
            "warmup": measure.warmup,
            "record_shapes": record_shapes,
            "profile_memory": profile_memory,
            "with_stack": with_stack,
        }
        result = self._tool("profile_to_bytes", code_or_fn, ranks, options, on_output)
        return running.traces_of(result, save_dir)

    def memory(
        self,
        code_or_fn: Step,
        *,
        ranks: RankSpec = None,
        on_output: OutputCallback | None = None,
        **options: Any,
    ) -> RankMemory:
        """:func:`nbtoolkit.memory_timeline` of the step on every rank: a :class:`RankMemory`.

        The result is a sequence of one MemoryTimeline per rank, in rank order, with a
        per-rank peak table and figure. ``options`` go to ``memory_timeline`` (``steps``,
        ``device``); ``model`` and ``optimizer`` may be given as names of variables in the
        ranks' namespaces.
        """
        result = self._tool("memory_timeline_on_rank", code_or_fn, ranks, options, on_output)
        return running.rank_memory(result)

    def graphs(
        self,
        code_or_fn: Step,
        *,
        ranks: RankSpec = None,
        on_output: OutputCallback | None = None,
        **options: Any,
    ) -> list[Any]:
        """:func:`nbtoolkit.capture_graphs` of the step on every rank: one GraphReport per rank."""
        return self._tool("capture_graphs_on_rank", code_or_fn, ranks, options, on_output).value_list()

    def step_metrics(
        self,
        code_or_fn: Step,
        *,
        ranks: RankSpec = None,
        on_output: OutputCallback | None = None,
        **options: Any,
    ) -> list[Any]:
        """:func:`nbtoolkit.step_metrics` of the step on every rank: one StepMetrics per rank.

        A per-rank table: ``nbtoolkit.metrics.step_metrics.metrics_frame(results, label="rank")``;
        a chart: ``nbt.mfu_chart(results)``.
        """
        return self._tool("step_metrics_on_rank", code_or_fn, ranks, options, on_output).value_list()

    # ---- moving data (the work: nbtoolkit.cluster.transfer) ----
    def push(self, values: dict[str, Any], *, ranks: RankSpec = None) -> None:
        """Set variables in the namespace of each rank (``values`` maps name -> value).

        Prints one line saying which variables went to which ranks (as ``%nbt push`` shows).
        """
        chosen = transfer.push_targets(values, ranks, self._world_size)
        transfer.push(self._live_group(), chosen, values, everyone=ranks is None)

    def pull(self, name: str, *, ranks: RankSpec = None) -> list[Any]:
        """A variable's value from each rank, in rank order."""
        transfer.check_variable_name(name)
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
        return transfer.save_fetched(result, pattern, into)

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

    def load_trace(self, where: str | Path, **options: Any) -> Trace:
        """The multi-rank Trace of the rank traces ``where`` names, summarized on their nodes.

        The same type as ``nbt.load_trace(folder)`` of many ranks (a RankFolderTrace: every
        ``nbt.*`` analysis takes it, answered from the per-rank summaries); a rank's events are
        read on its node when asked for (``trace.events[rank]``). Options as :meth:`summarize_traces`.
        """
        from nbtoolkit.trace.rank_folder_trace import from_summary

        summary = self.summarize_traces(where, **options)
        return from_summary(summary, read_ranks=lambda ranks: self.load_trace_ranks(summary, ranks))

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
        return lifecycle.cluster_line(self._attachment, self._world_size, self._group)

    def _html(self) -> str:
        return f"<div class='nbt-cluster'><b>nbtoolkit</b> {escape(self._text())}</div>"
