"""``Trace``: the events of one or many ranks of a PyTorch profiler (Kineto) trace.

A Trace holds, per rank, one columnar pandas frame of complete ("X") events and the
rank's metadata. Names and categories are interned as pandas categoricals, so a
trace with hundreds of thousands of events stays small. Times are kept exactly as the
Chrome trace format gives them: microseconds, as float64 (Kineto writes ns-resolution
traces as fractional microseconds).

Columns of ``trace.events[rank]`` (one row per complete event, sorted by ``ts``):

==============  ========  =========================================================
ts              float64   start, µs (trace clock; not aligned across ranks)
dur             float64   duration, µs
name            category  operator / kernel / annotation name
cat             category  Kineto category (cpu_op, kernel, gpu_memcpy, cuda_runtime ...)
pid, tid        int64     process and thread (GPU events: device and stream lane); -1 if not numeric
stream          int64     GPU stream (``args.stream``), -1 for host events
device          int64     device index (``args.device``), -1 when absent
correlation     int64     links a kernel to its launching runtime call, -1 when absent
external_id     int64     links GPU work to the CPU operator, -1 when absent
==============  ========  =========================================================

``trace.collectives[rank]`` has one row per event that carries collective metadata
(``Collective name`` and friends, written by ``record_param_comms`` and NCCL kernels):
``row`` (index into the events frame), ``collective``, ``in_msg_nelems``,
``out_msg_nelems``, ``group_size``, ``dtype``, ``pg_name``, ``pg_desc``, ``pg_ranks``.

``trace.steps`` has one row per ``ProfilerStep#N`` annotation on the host:
``rank``, ``step``, ``ts``, ``dur`` (µs).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import TraceError
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.trace.records import RankInfo, empty_collectives

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.step_load import StepLoad

__all__ = ["KernelBreakdown", "RankInfo", "StragglerReport", "Trace"]

_FORMAT_VERSION = 1


# repr: the Result text summary, not a dump of the frames; eq: identity (frames have no truth value)
@dataclass(repr=False, eq=False)
class Trace(Result):
    """Events of one or many ranks; see the module docstring for the columns.

    Build one with :func:`nbtoolkit.load_trace` or :func:`nbtoolkit.profile`; analyse it with
    ``nbt.comm_comp_overlap``, ``nbt.temporal_breakdown``, ``nbt.kernel_breakdown``,
    ``nbt.idle_breakdown``, ``nbt.stragglers``; save it with :meth:`save`.
    """

    events: dict[int, pd.DataFrame]
    info: dict[int, RankInfo]
    collectives: dict[int, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    value: Any = field(default=None, repr=False)  # what the profiled function returned last (not saved)
    step_metrics: Any = field(default=None, repr=False)  # StepMetrics of profile(metrics=True); not saved
    loop: Any = field(default=None, repr=False)  # LoopOutcome of profile(loop=True); not saved
    # rank -> StepLoad: the machine's load around each step nbt.profile recorded (saved); empty for
    # traces of other tools. nbt.compare leaves the steps other work disturbed out.
    step_load: dict[int, StepLoad] = field(default_factory=dict, repr=False)
    _steps: pd.DataFrame | None = field(default=None, repr=False)
    _step_labels: list[str] | None = field(default=None, repr=False)

    # ----------------------------------------------------------------- access
    @property
    def ranks(self) -> list[int]:
        """Ranks present, ascending."""
        return sorted(self.events)

    def rank_events(self, rank: int) -> pd.DataFrame:
        """The events frame of one rank (a clear error for a rank that is not there)."""
        if rank not in self.events:
            raise TraceError(f"rank {rank} is not in this trace; ranks present: {self.ranks}")
        return self.events[rank]

    @property
    def device_type(self) -> str:
        """The device type of the ranks (``cpu`` when no rank ran GPU/accelerator kernels)."""
        kinds = {i.device_type for i in self.info.values()}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def has_gpu_kernels(self) -> bool:
        return any(bool((frame["stream"].to_numpy() >= 0).any()) for frame in self.events.values())

    @property
    def steps(self) -> pd.DataFrame:
        """One row per ``ProfilerStep#N`` on the host: rank, step, ts, dur (µs), sorted."""
        if self._steps is None:
            self._steps = _find_steps(self)
        return self._steps

    @property
    def step_labels(self) -> list[str]:
        """The distinct ProfilerStep labels of all ranks, sorted (computed once: HTA's last-step rule
        reads their count for every rank, and a loop over every rank per rank is quadratic)."""
        if self._step_labels is None:
            from nbtoolkit.core.profiler_steps import profiler_step_names

            labels: set[str] = set()
            for frame in self.events.values():
                labels.update(profiler_step_names(frame["name"].cat.categories))
            self._step_labels = sorted(labels)
        return self._step_labels

    def step_times_ms(self) -> pd.DataFrame:
        """Step times in milliseconds: one row per step, one column per rank."""
        steps = self.steps
        table = steps.pivot_table(index="step", columns="rank", values="dur", aggfunc="max") / 1e3
        table.columns = [f"rank {c}" for c in table.columns]
        return table

    def event_args(self, rank: int) -> Any:
        """Arguments of ``rank``'s events that the frame does not keep (an ``EventArgs``: ``syncs``,
        ``shapes``), read from its trace file by :mod:`nbtoolkit.trace.kineto_args` (empty frames when
        there is none).

        The critical path and the roofline take them from here: the analyses read no files.
        """
        from nbtoolkit.trace.kineto_args import event_args

        return event_args(self, rank)

    # ---------------------------------------------------------------- summary
    def top_operators(self, n: int = 10, *, rank: int | None = None) -> pd.DataFrame:
        """Host operators (``cpu_op``) by self CPU time: name, calls, self_us, total_us."""
        from nbtoolkit.trace.top import top_operators

        return top_operators(self._frames(rank), n)

    def top_kernels(self, n: int = 10, *, rank: int | None = None) -> pd.DataFrame:
        """GPU/accelerator kernels by total time: name, calls, total_us, mean_us."""
        from nbtoolkit.trace.top import top_kernels

        return top_kernels(self._frames(rank), n)

    def _frames(self, rank: int | None) -> list[pd.DataFrame]:
        """The events frame of ``rank`` (a clear error for a rank that is not there), or of every rank."""
        return [self.rank_events(r) for r in ([rank] if rank is not None else self.ranks)]

    def _report_figures(self) -> list[Any]:
        """Figures nbt.report embeds with this trace: the timeline of its first ranks."""
        from nbtoolkit.trace.timeline_figure import timeline

        return [timeline(self)]

    def _header_lines(self) -> list[str]:
        n_events = sum(len(f) for f in self.events.values())
        ranks = self.ranks
        shown = ", ".join(map(str, ranks[:16])) + (" ..." if len(ranks) > 16 else "")
        first = self.info[ranks[0]] if ranks else None
        lines = [
            f"Trace: {len(ranks)} rank(s) [{shown}], {n_events:,} events, device {self.device_type}"
            + (f", backend {first.backend}" if first and first.backend else "")
            + (f", world size {first.world_size}" if first and first.world_size else ""),
        ]
        return lines

    def _notes(self) -> list[str]:
        notes = list(self.notes)
        for r in self.ranks:
            notes += [f"rank {r}: {note}" for note in self.info[r].notes]
        return notes

    def _text(self) -> str:
        lines = self._header_lines()
        steps = self.steps
        if len(steps):
            table = self.step_times_ms()
            lines.append("Step times (ms):")
            lines += ["  " + line for line in table.round(3).to_string().splitlines()]
        else:
            lines.append("Steps: no ProfilerStep#N annotations in the trace")
        ops = self.top_operators(10)
        if len(ops):
            lines.append("Top operators by self CPU time:")
            for row in ops.itertuples(index=False):
                lines.append(
                    f"  {row.self_us / 1e3:10.3f} ms self  {row.total_us / 1e3:10.3f} ms total"
                    f"  {row.calls:6d} calls  {_short(row.name)}"
                )
        if self.has_gpu_kernels:
            kernels = self.top_kernels(10)
            lines.append("Top kernels by total time:")
            for row in kernels.itertuples(index=False):
                lines.append(f"  {row.total_us / 1e3:10.3f} ms  {row.calls:6d} calls  {_short(row.name)}")
        notes = self._notes()
        if notes:
            lines.append("Notes:")
            lines += [f"  - {note}" for note in notes]
        return "\n".join(lines)

    def _html(self) -> str:
        parts = [f"<div class='nbt-trace'><b>{escape(self._header_lines()[0])}</b>"]
        if len(self.steps):
            table = self.step_times_ms().round(3).reset_index()
            parts.append("<p>Step times (ms)</p>" + html_table(table, float_format="{:,.3f}"))
        ops = self.top_operators(10)
        if len(ops):
            ops = ops.assign(self_ms=ops["self_us"] / 1e3, total_ms=ops["total_us"] / 1e3)
            parts.append(
                "<p>Top operators by self CPU time</p>"
                + html_table(ops[["name", "calls", "self_ms", "total_ms"]], float_format="{:,.3f}")
            )
        if self.has_gpu_kernels:
            kernels = self.top_kernels(10)
            kernels = kernels.assign(total_ms=kernels["total_us"] / 1e3, mean_us=kernels["mean_us"])
            parts.append(
                "<p>Top kernels by total time</p>"
                + html_table(kernels[["name", "calls", "total_ms", "mean_us"]], float_format="{:,.3f}")
            )
        notes = self._notes()
        if notes:
            parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
        parts.append("</div>")
        return "".join(parts)

    # --------------------------------------------------------------- combine
    @classmethod
    def combine(cls, traces: Iterable[Trace]) -> Trace:
        """One multi-rank Trace from per-rank Traces (e.g. ``nbt.profile`` run on every rank).

        Ranks come from each trace (``distributedInfo`` when torch.distributed was initialised
        while profiling); two traces holding the same rank are a TraceError.
        """
        events: dict[int, pd.DataFrame] = {}
        info: dict[int, RankInfo] = {}
        collectives: dict[int, pd.DataFrame] = {}
        step_load: dict[int, StepLoad] = {}
        notes: list[str] = []
        for trace in traces:
            if not isinstance(trace, Trace):
                raise TraceError(f"Trace.combine() takes Traces, got a {type(trace).__name__}")
            for rank in trace.ranks:
                if rank in events:
                    raise TraceError(
                        f"rank {rank} appears in two of the traces to combine ({info[rank].source} and "
                        f"{trace.info[rank].source}); was torch.distributed initialised on every rank?"
                    )
                events[rank] = trace.events[rank]
                info[rank] = trace.info[rank]
                collectives[rank] = trace.collectives.get(rank, empty_collectives())
                if rank in trace.step_load:
                    step_load[rank] = trace.step_load[rank]
            notes += [n for n in trace.notes if n not in notes]
        if not events:
            raise TraceError("Trace.combine() got no traces")
        return cls(events=events, info=info, collectives=collectives, notes=notes, step_load=step_load)

    # -------------------------------------------------------------- save/load
    def save(self, path: str | Path) -> Path:
        """Write the trace to a folder: one Parquet file per rank plus ``trace.json`` metadata."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from nbtoolkit.core.errors import SaveError
        from nbtoolkit.core.paths import path_errors
        from nbtoolkit.core.saved import folder_to_save

        folder = folder_to_save(path, "trace.json", what="Trace")
        with path_errors(folder, "save the Trace into", error=SaveError):
            for rank, frame in self.events.items():
                pq.write_table(
                    pa.Table.from_pandas(frame, preserve_index=False), folder / f"rank{rank}.events.parquet"
                )
                coll = self.collectives.get(rank)
                if coll is not None and len(coll):
                    pq.write_table(
                        pa.Table.from_pandas(coll, preserve_index=False),
                        folder / f"rank{rank}.collectives.parquet",
                    )
            meta: dict[str, Any] = {
                "nbtoolkit_trace": _FORMAT_VERSION,
                "notes": self.notes,
                "ranks": [self.info[r].to_json() for r in self.ranks],
            }
            if self.step_load:  # written only when there is one: older readers see the same file
                meta["step_load"] = {str(r): load.to_json() for r, load in sorted(self.step_load.items())}
            (folder / "trace.json").write_text(json.dumps(meta, indent=1, default=str))
        return folder

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a folder written by :meth:`save`; a damaged or edited one is a TraceError naming the file."""
        from nbtoolkit.core.saved import check_version, read_json, saved_folder
        from nbtoolkit.trace.trace_saved import check_meta, read_rank, read_step_load

        folder, meta_path = saved_folder(path, "trace.json", what="Trace", error=TraceError)
        meta = read_json(meta_path, what="Trace", error=TraceError)
        check_version(meta.get("nbtoolkit_trace"), _FORMAT_VERSION, meta_path, what="Trace", error=TraceError)
        if meta.get("nbtoolkit_trace") != _FORMAT_VERSION:
            raise TraceError(
                f"{meta_path}: not a saved nbtoolkit trace (format {str(meta.get('nbtoolkit_trace'))[:40]!r})"
            )
        notes, infos = check_meta(meta, meta_path)
        events: dict[int, pd.DataFrame] = {}
        collectives: dict[int, pd.DataFrame] = {}
        info: dict[int, RankInfo] = {}
        for fields in infos:
            rank = fields["rank"]
            info[rank] = RankInfo(**fields)
            events[rank], coll = read_rank(folder, rank)
            collectives[rank] = coll if coll is not None else empty_collectives()
        step_load = read_step_load(meta, meta_path, ranks=set(info))
        return cls(events=events, info=info, collectives=collectives, notes=notes, step_load=step_load)


@dataclass(repr=False, eq=False)
class KernelBreakdown(Result):
    """Device time per kernel type (``by_type``) and per kernel (``by_kernel``).

    See ``nbt.kernel_breakdown`` for the definitions.
    """

    by_type: pd.DataFrame
    by_kernel: pd.DataFrame

    def _text(self) -> str:
        if not len(self.by_type):
            return "Kernel breakdown: no device kernels in the trace"
        lines = ["Kernel time by type (all ranks):"]
        lines += [
            f"  {row.sum_us / 1e3:12.3f} ms  {row.percentage:5.1f} %  {row.kernel_type}"
            for row in self.by_type.itertuples(index=False)
        ]
        top = self.by_kernel.sort_values(["sum_us", "name"], ascending=[False, True]).head(10)
        lines.append("Top kernels:")
        lines += [
            f"  rank {row.rank}  {row.sum_us / 1e3:10.3f} ms  {row.calls:6d} calls  {row.kernel_type:13s}"
            f"  {_short(str(row.name), 70)}"
            for row in top.itertuples(index=False)
        ]
        return "\n".join(lines)

    def _html(self) -> str:
        if not len(self.by_type):
            return "<p>Kernel breakdown: no device kernels in the trace</p>"
        top = self.by_kernel.sort_values(["sum_us", "name"], ascending=[False, True]).head(20)
        return (
            "<p><b>Kernel time by type</b> (all ranks, µs)</p>"
            + html_table(self.by_type)
            + "<p><b>Top kernels</b> (µs)</p>"
            + html_table(top)
        )


@dataclass(repr=False, eq=False)
class StragglerReport(Result):
    """Per-rank step/work/communication-wait times and the slowest rank; see ``nbt.stragglers``."""

    table: pd.DataFrame
    slowest_rank: int
    slowdown_pct: float
    threshold_pct: float

    @property
    def has_straggler(self) -> bool:
        return bool(self.table["is_straggler"].any())

    def _headline(self) -> str:
        if len(self.table) < 2:
            return f"Stragglers: one rank only (rank {self.slowest_rank}); nothing to compare"
        if self.has_straggler:
            return (
                f"Straggler: rank {self.slowest_rank} works {self.slowdown_pct:.1f} % longer per step "
                "than the median rank; the others wait for it in collectives"
            )
        return (
            f"No straggler: the slowest rank ({self.slowest_rank}) is {self.slowdown_pct:.1f} % above "
            f"the median (threshold {self.threshold_pct:g} %)"
        )

    def _shown(self) -> tuple[pd.DataFrame, str]:
        """The rows a display lists, and the line that says which: every rank of a small job, in
        rank order; of a large one the slowest ranks first (in rank order, rank 129 of 256 was
        below the 64 rows an HTML table shows, and 4,096 rows of text bury the answer)."""
        table = self.table
        if len(table) <= _RANKS_LISTED_WHOLE:
            return table, ""
        slowest = table.sort_values(["slowdown_pct", "rank"], ascending=[False, True], kind="stable")
        return slowest.head(_SLOWEST_LISTED), (
            f"the {_SLOWEST_LISTED} slowest of {len(table):,} ranks, slowest first "
            "(report.table has every rank, in rank order)"
        )

    def _text(self) -> str:
        shown, which = self._shown()
        lines = [self._headline(), *([which] if which else []), shown.round(3).to_string(index=False)]
        return "\n".join(lines)

    def _html(self) -> str:
        shown, which = self._shown()
        return (
            f"<p><b>{escape(self._headline())}</b></p>"
            + (f"<p>{escape(which)}</p>" if which else "")
            + html_table(shown, max_rows=_RANKS_LISTED_WHOLE, float_format="{:,.3f}")
        )


#: a straggler report lists every rank up to this many; above, the slowest ranks
_RANKS_LISTED_WHOLE = 32
_SLOWEST_LISTED = 12


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _find_steps(trace: Trace) -> pd.DataFrame:
    from nbtoolkit.core.profiler_steps import host_steps, steps_table

    return steps_table(host_steps(rank, trace.events[rank]) for rank in trace.ranks)
