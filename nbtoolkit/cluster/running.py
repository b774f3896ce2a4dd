"""Running code on the ranks: cells, functions, and nbtoolkit's instruments (profile, memory, graphs, FLOPs).

Part of :class:`nbtoolkit.cluster.cluster.Cluster` (a mixin): the methods here need only the
cluster's live rank group. Values and errors come back as a :class:`RemoteRun`; instruments
gather one result per rank (a multi-rank Trace, a RankMemory, a list of reports).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.cluster.group_types import OutputCallback
from nbtoolkit.cluster.rank_spec import RankSpec, parse_ranks
from nbtoolkit.cluster.shipping import RESULT_MAX_BYTES
from nbtoolkit.cluster.state import PROFILE_STEPS, RemoteRun
from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import DEFAULT_WARMUP

if TYPE_CHECKING:
    from nbtoolkit.cluster.hang_watch import StallWatch
    from nbtoolkit.cluster.ranks import RankGroup
    from nbtoolkit.memory.rank_memory import RankMemory
    from nbtoolkit.trace.trace import Trace

__all__ = ["ClusterRunning"]
Step = str | Callable[..., Any]  # cell source run in each rank's namespace, or a function


def _byte_limit(value: Any) -> int:
    """``max_result_bytes`` checked: a positive whole number of bytes."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise NbtUsageError(
            f"max_result_bytes must be a positive number of bytes (e.g. 2**30 for 1 GiB), got {value!r}"
        )
    return value


class ClusterRunning:
    """The running half of :class:`~nbtoolkit.cluster.cluster.Cluster`; see its methods."""

    _world_size: int
    #: Seconds without progress on any rank before a running cell shows the hang diagnosis
    #: (None: $NBT_HANG_AFTER_S, else 30; 0 turns it off). A call's ``hang_after_s`` wins.
    hang_after_s: float | None = None
    #: The most bytes (pickled) one rank's value may send back (``RESULT_MAX_BYTES``, 256 MiB);
    #: a call's ``max_result_bytes`` wins. Raise it for larger values: ``cluster.max_result_bytes = N``.
    max_result_bytes: int = RESULT_MAX_BYTES

    def _live_group(self) -> RankGroup:  # provided by Cluster (its lifecycle owns the ranks)
        raise NotImplementedError

    def _stall_watch(self, hang_after_s: float | None, on_hang: str) -> StallWatch | None:
        from nbtoolkit.cluster.hang_watch import StallWatch, hang_after

        seconds = hang_after(hang_after_s if hang_after_s is not None else self.hang_after_s)
        watch = StallWatch(seconds, on_hang=on_hang)
        return watch if watch.enabled else None

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
        group = self._live_group()
        chosen = parse_ranks(ranks, self._world_size)
        watch = self._stall_watch(hang_after_s, on_hang)
        limit = _byte_limit(max_result_bytes if max_result_bytes is not None else self.max_result_bytes)
        if isinstance(code_or_fn, str):
            raw = group.call(chosen, "run_cell", code_or_fn, limit, on_output=on_output, watch=watch)
        elif callable(code_or_fn):
            raw = group.call(
                chosen, "run_function", code_or_fn, args, kwargs or {}, limit, on_output=on_output,
                watch=watch,
            )
        else:
            raise NbtUsageError(f"run takes cell source (str) or a function, got {type(code_or_fn).__name__}")
        return RemoteRun(chosen, raw)

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
        kwargs: dict[str, Any],
        on_output: OutputCallback | None,
    ) -> RemoteRun:
        """Run ``nbtoolkit.cluster.rank_tools.<name>`` around the step on each rank; raise on failure."""
        if not (isinstance(code_or_fn, str) or callable(code_or_fn)):
            raise NbtUsageError(f"expected cell source (str) or a function, got {type(code_or_fn).__name__}")
        group = self._live_group()
        chosen = parse_ranks(ranks, self._world_size)
        raw = group.call(
            chosen,
            "run_tool",
            "nbtoolkit.cluster.rank_tools",
            name,
            code_or_fn,
            kwargs,
            on_output=on_output,
            watch=self._stall_watch(None, "wait"),
        )
        result = RemoteRun(chosen, raw)
        result.raise_for_errors()
        return result

    def profile(
        self,
        code_or_fn: Step,
        *,
        steps: int = PROFILE_STEPS,
        warmup: int = DEFAULT_WARMUP,
        ranks: RankSpec = None,
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
        options = {
            "steps": steps,
            "warmup": warmup,
            "record_shapes": record_shapes,
            "profile_memory": profile_memory,
            "with_stack": with_stack,
        }
        result = self._tool("profile_to_bytes", code_or_fn, ranks, options, on_output)
        from nbtoolkit.trace.kineto import load_trace

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
        from nbtoolkit.memory.rank_memory import RankMemory

        result = self._tool("memory_timeline_on_rank", code_or_fn, ranks, options, on_output)
        return RankMemory(timelines={rank: result.values[rank] for rank in result.ranks})

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
