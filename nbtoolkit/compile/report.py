"""``GraphReport``: the graphs, graph breaks, recompiles and failures of torch.compile'd code.

Made by :func:`nbtoolkit.capture_graphs` (live, in this process) or
:func:`nbtoolkit.load_compile_log` (from TORCH_TRACE logs); both read torch's own
structured compile events with one parser (``nbtoolkit.compile.log_events``).

Frames (pandas, one row per event, in the order torch logged them):

``graphs``      one row per FX graph dynamo produced: compile id, function, file, op count,
                compile time (s), the graph's readable code (``fx_code``).
``breaks``      one row per graph break: type and ``gbNNNN`` id of torch's registry, reason,
                explanation, hints, where it is (``user_file``/``user_line``/``user_function``:
                the innermost frame outside torch), the source line and a few lines around
                it, the user's own call site when that place is a library's code
                (``call_file``/``call_line``/``call_source_line``), where inside torch it was
                (``inside_torch``), link to the registry page; after a live capture also
                ``eager_us_per_step`` (see :mod:`nbtoolkit.compile.break_cost`).
``recompiles``  one row per recompile: the compile id, the previous compile whose guard
                failed, and the failed guard.
``failures``    tlparse's "Failures and Restarts": one row per restart reason and per compile
                failure (``failure_type`` is ``RestartAnalysis`` or e.g. ``BackendCompilerFailed``).
``compiles``    one row per ``compilation_metrics`` record (a finished compile attempt) with
                tlparse's status (ok, break, empty, error).

A GraphReport is plain data: it saves to a folder (Parquet frames plus a JSON header)
and loads back anywhere.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_seconds

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GraphComparison", "GraphReport"]

_FRAMES = ("graphs", "breaks", "recompiles", "failures", "compiles")
_FORMAT = "nbtoolkit.GraphReport/1"


def _first_sentence(text: Any, limit: int = 170) -> str:
    """The first sentence of a hint, for one-line text displays ("e.g." and "i.e." end none)."""
    first = re.split(r"(?<!\be\.g)(?<!\bi\.e)\. ", str(text or ""), maxsplit=1)[0].rstrip(".")
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _middle_half(times: list[float]) -> tuple[float, float] | None:
    """The 25th and 75th percentiles of step times (None for fewer than two)."""
    import numpy as np

    finite = [t for t in times if _is_number(t) and math.isfinite(t)]
    if len(finite) < 2:
        return None
    low, high = np.percentile(finite, [25, 75])
    return float(low), float(high)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))


def _with_added_columns(frame: pd.DataFrame, added: dict[str, str], *, where: str) -> pd.DataFrame:
    """``frame`` with the columns added after format 1: checked where saved, nulls where not."""
    from nbtoolkit.core.errors import NbtUsageError

    frame = frame.copy()
    for column, dtype in added.items():
        if column not in frame.columns:
            frame[column] = None if dtype == "object" else float("nan")
            frame[column] = frame[column].astype(dtype)
            continue
        values = frame[column]
        if dtype == "object":
            ok = all(
                v is None or isinstance(v, str) or (isinstance(v, float) and math.isnan(v)) for v in values
            )
        else:
            try:
                frame[column] = values.astype(dtype)
                ok = True
            except (TypeError, ValueError):
                ok = False
        if not ok:
            raise NbtUsageError(
                f"{where}: the saved GraphReport is damaged: the column {column!r} has values of the "
                "wrong type; save it again"
            )
    return frame


@dataclass(repr=False)  # Result's __repr__ (the text summary) must win over the dataclass one
class GraphReport(Result):
    """Graphs, breaks, recompiles and compile failures of one run (or of a set of logs)."""

    graphs: pd.DataFrame
    breaks: pd.DataFrame
    recompiles: pd.DataFrame
    failures: pd.DataFrame
    compiles: pd.DataFrame
    compile_ids: list[str] = field(default_factory=list)
    source: str = ""
    notes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    # Measured by a live capture (None when read from logs):
    first_call_s: float | None = None  # the first call, compile included (wall clock)
    step_time_s: float | None = None  # median wall time of the timed compiled steps that compiled nothing
    eager_step_time_s: float | None = None  # median wall time of the same step run eagerly
    steps: int = 0
    error: str | None = None  # the exception the captured code raised, if any
    profiled_step_time_s: float | None = None  # mean wall time of a step under the profiler (costs' base)
    first_call_compile_s: float | None = None  # compile time of the compiles the first call ran
    step_times_s: list[float] = field(default_factory=list)  # every timed compiled step, in order
    eager_step_times_s: list[float] = field(default_factory=list)  # every timed eager step (interleaved)
    timed_step_compiles: list[int] = field(default_factory=list)  # compiles run by each timed compiled step
    loop: Any = field(default=None, compare=False)  # capture_graphs(loop=True): its LoopOutcome (not saved)

    # ------------------------------------------------------------------ summaries
    @property
    def compile_time_s(self) -> float:
        """Total whole-frame compile time of all compiles (s), as torch's compilation_metrics sum."""
        if self.compiles.empty:
            return float(self.graphs["compile_time_s"].fillna(0).sum()) if not self.graphs.empty else 0.0
        return float(self.compiles["compile_time_s"].fillna(0).sum())

    @property
    def speedup(self) -> float | None:
        """Eager step time / compiled step time, when the two differ beyond the measured spread.

        None when either was not measured, or when the middle halves (25th to 75th percentile)
        of the interleaved compiled and eager step times overlap: the difference is then within
        the noise (the rule of :class:`nbtoolkit.recompute.comparison.Comparison`).
        """
        if not self.step_time_s or not self.eager_step_time_s or self.speedup_within_noise is not False:
            return None
        return self.eager_step_time_s / self.step_time_s

    @property
    def speedup_within_noise(self) -> bool | None:
        """True when compiled and eager step times' middle halves overlap; None without the step times."""
        compiled = _middle_half(self._clean_step_times())
        eager = _middle_half(self.eager_step_times_s)
        if compiled is None or eager is None:
            return None
        return compiled[0] <= eager[1] and eager[0] <= compiled[1]

    def _clean_step_times(self) -> list[float]:
        """The timed compiled steps that compiled nothing (all of them when each compiled)."""
        if len(self.timed_step_compiles) != len(self.step_times_s):
            return list(self.step_times_s)
        clean = [t for t, n in zip(self.step_times_s, self.timed_step_compiles, strict=True) if n == 0]
        return clean or list(self.step_times_s)

    @property
    def restarts(self) -> int:
        return (
            int((self.failures["failure_type"] == "RestartAnalysis").sum()) if not self.failures.empty else 0
        )

    @property
    def compile_failures(self) -> pd.DataFrame:
        """The failures where compiling itself went wrong (e.g. BackendCompilerFailed, a crash).

        Not restarts, and not ``Unsupported``: that is Dynamo's graph-break exception. torch
        logs the compile attempt a break aborted as a failure (tlparse lists it, and
        ``failures`` keeps it), but nothing failed for the user: the break is in ``breaks``,
        and a frame Dynamo gave up on because of it is in :attr:`frames_given_up`.
        """
        failures = self.failures
        if failures.empty:
            return failures
        return failures[~failures["failure_type"].isin(["RestartAnalysis", "Unsupported"])]

    @property
    def frames_given_up(self) -> pd.DataFrame:
        """Compile attempts a graph break ended without a partial graph: the frame runs eagerly.

        Dynamo usually restarts after a break and compiles the frame up to it; when the break
        sits where it cannot (in a loop, or inside a nested call), it skips the whole frame,
        and only the functions that frame calls get compiled on their own. Rows of
        ``failures`` with ``failure_type`` ``Unsupported`` whose attempt did not restart, plus
        ``frame``: the skipped function and its place, from ``compiles``.
        """
        import numpy as np

        failures = self.failures
        if failures.empty:
            return failures.assign(frame=[])
        is_restart = (failures["failure_type"] == "RestartAnalysis").to_numpy()
        attempt = list(zip(failures["rank"], failures["compile_id"], strict=True))  # ids repeat across ranks
        restarted = {a for a, restart in zip(attempt, is_restart, strict=True) if restart}
        not_restarted = np.array([a not in restarted for a in attempt], dtype=bool)
        given_up = failures[(failures["failure_type"] == "Unsupported").to_numpy() & not_restarted]
        frames: dict[tuple[Any, Any], str] = {}
        if not self.compiles.empty:
            c = self.compiles
            frames = {
                (rank, cid): f"{function} ({file}:{line})"
                for rank, cid, function, file, line in zip(
                    c["rank"], c["compile_id"], c["function"], c["file"], c["line"], strict=True
                )
            }
        keys = zip(given_up["rank"], given_up["compile_id"], strict=True)
        return given_up.assign(frame=[frames.get(key, "?") for key in keys])

    def break_summary(self) -> pd.DataFrame:
        """One row per distinct break (type + user location), counted, ranked by measured cost.

        See :func:`nbtoolkit.compile.break_summary.break_summary` for the columns and ranking.
        """
        from nbtoolkit.compile.break_summary import break_summary

        return break_summary(self.breaks)

    def compare(
        self, other: GraphReport, *, labels: tuple[str, str] = ("before", "after")
    ) -> GraphComparison:
        """This report (before) next to ``other`` (after): graphs, breaks, compile and step times."""
        return GraphComparison(before=self, after=other, labels=labels)

    def explorer(self) -> Any:
        """The graph-break explorer widget (ipywidgets): ranked breaks, source, hints, graphs around."""
        from nbtoolkit.compile.figures import graph_break_explorer

        return graph_break_explorer(self)

    def code_view(self) -> Any:
        """A widget showing the FX code of the graph picked in a dropdown."""
        from nbtoolkit.compile.figures import graph_code_view

        return graph_code_view(self)

    def compile_time_chart(self) -> Any:
        """Plotly bar chart of the compile time of each compile, coloured by status."""
        from nbtoolkit.compile.figures import compile_time_chart

        return compile_time_chart(self)

    def _report_figures(self) -> list[Any]:
        """Figures nbt.report embeds with this report: the compile-time chart."""
        return [self.compile_time_chart()] if not self.compiles.empty else []

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | Path) -> Path:
        """Write the report to folder ``path`` (Parquet frames + ``report.json``); returns the folder."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from nbtoolkit.core.errors import SaveError
        from nbtoolkit.core.paths import path_errors
        from nbtoolkit.core.saved import folder_to_save

        folder = folder_to_save(path, "report.json", what="GraphReport")
        header = {
            "format": _FORMAT,
            "compile_ids": self.compile_ids,
            "source": self.source,
            "notes": self.notes,
            "ranks": self.ranks,
            "first_call_s": self.first_call_s,
            "step_time_s": self.step_time_s,
            "eager_step_time_s": self.eager_step_time_s,
            "steps": self.steps,
            "error": self.error,
            "profiled_step_time_s": self.profiled_step_time_s,
            "first_call_compile_s": self.first_call_compile_s,
            "step_times_s": self.step_times_s,
            "eager_step_times_s": self.eager_step_times_s,
            "timed_step_compiles": self.timed_step_compiles,
        }
        with path_errors(folder, "save the GraphReport into", error=SaveError):
            for name in _FRAMES:
                frame = getattr(self, name)
                pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), folder / f"{name}.parquet")
            (folder / "report.json").write_text(json.dumps(header, indent=1))
        return folder

    @classmethod
    def load(cls, path: str | Path) -> GraphReport:
        """Read a report written by :meth:`save`; a damaged or edited one is an NbtUsageError naming it."""
        from nbtoolkit.compile.schema import ADDED_COLUMNS, FRAME_COLUMNS, REPORT_FIELDS
        from nbtoolkit.core.errors import NbtUsageError
        from nbtoolkit.core.paths import shown_path
        from nbtoolkit.core.saved import check_fields, check_version, read_frame, read_json, saved_folder

        folder, head_path = saved_folder(path, "report.json", what="GraphReport", error=NbtUsageError)
        header = read_json(head_path, what="GraphReport", error=NbtUsageError)
        found = str(header.get("format"))
        if found.startswith("nbtoolkit.GraphReport/") and found.rpartition("/")[2].isdigit():
            version = int(found.rpartition("/")[2][:6])
            check_version(version, 1, head_path, what="GraphReport", error=NbtUsageError)
        if header.get("format") != _FORMAT:
            raise NbtUsageError(
                f"{shown_path(head_path)} has format {str(header.get('format'))[:60]!r}, expected {_FORMAT!r}"
            )
        fields = check_fields(header, REPORT_FIELDS, where=shown_path(head_path), error=NbtUsageError)
        frames = {}
        for name in _FRAMES:
            columns = FRAME_COLUMNS[name]
            added = ADDED_COLUMNS.get(name, ())
            required = {c: t for c, t in columns.items() if c not in added}
            file = folder / f"{name}.parquet"
            frame = read_frame(file, required, what="GraphReport", error=NbtUsageError)
            frame = _with_added_columns(frame, {c: columns[c] for c in added}, where=shown_path(file))
            frames[name] = frame.astype({c: "object" for c, t in columns.items() if t == "object"})
        return cls(**frames, **fields)

    # ------------------------------------------------------------------ display
    def _headline(self) -> list[tuple[str, str]]:
        rows = [
            ("graphs", f"{len(self.graphs)}"),
            ("graph breaks", f"{len(self.breaks)} ({self.break_summary().shape[0]} distinct)"),
            ("recompiles", f"{len(self.recompiles)}"),
            ("restarts", f"{self.restarts}"),
            ("compile failures", f"{len(self.compile_failures)}"),
            ("compile time", self._compile_time_text()),
        ]
        if not self.frames_given_up.empty:
            rows.insert(5, ("frames run eagerly after a break", f"{len(self.frames_given_up)}"))
        if self.ranks:
            rows.insert(0, ("ranks", ", ".join(str(r) for r in self.ranks)))
        rows.extend(self._timing_rows())
        between = self.eager_between_graphs_s
        if between is not None:
            # both measured under the profiler, so the share compares like with like
            base = self.profiled_step_time_s
            share = f" ({between / base:.0%} of a profiled step)" if base else ""
            rows.append(("eager code caused by graph breaks, per step", format_seconds(between) + share))
        return rows

    def _compile_time_text(self) -> str:
        """All compiles' time, split into the first call's and the later calls' where measured."""
        total = self.compile_time_s
        text = format_seconds(total)
        first = self.first_call_compile_s
        if first is not None and self.first_call_s is not None:
            later = max(total - first, 0.0)
            text += f" ({format_seconds(first)} in the first call"
            text += f", {format_seconds(later)} in later calls)" if later > 0 else ")"
        return text

    def _timing_rows(self) -> list[tuple[str, str]]:
        """First call, step times and compiled vs eager, worded so that the numbers add up."""
        rows = []
        if self.first_call_s is not None:
            value = format_seconds(self.first_call_s)
            compiling = self.first_call_compile_s
            if compiling is not None and compiling <= self.first_call_s:
                value += (
                    f" = {format_seconds(compiling)} compiling + "
                    f"{format_seconds(self.first_call_s - compiling)} running"
                )
            rows.append(("first call (compile included)", value))
        n = len(self.step_times_s) or self.steps
        if self.step_time_s is not None:
            compiled = sum(1 for c in self.timed_step_compiles if c)
            if compiled == 0:
                how = f"median of {n}"
            elif compiled < n:
                verb = "it is" if compiled == 1 else "they are"
                how = f"median of {n - compiled} of {n}; {compiled} compiled, so {verb} left out"
            else:
                how = f"median of {n}; every timed step compiled (recompiles): compile time included"
            rows.append((f"step time compiled ({how})", format_seconds(self.step_time_s)))
        if self.eager_step_time_s is not None:
            m = len(self.eager_step_times_s) or self.steps
            label = f"step time eager (median of {m}" + (", interleaved)" if self.step_times_s else ")")
            rows.append((label, format_seconds(self.eager_step_time_s)))
            within = self.speedup_within_noise
            speedup = self.speedup
            if speedup is not None:
                word = "faster" if speedup >= 1 else "slower"
                ratio = speedup if speedup >= 1 else 1 / speedup
                rows.append(("compiled vs eager", f"{ratio:.2f}× {word} (beyond the measured spread)"))
            elif within:
                rows.append(
                    ("compiled vs eager", "no difference beyond the measured spread (quartiles overlap)")
                )
        return rows

    @property
    def eager_between_graphs_s(self) -> float | None:
        """Measured host time per step in eager code caused by the breaks (s); None when not measured."""
        if "eager_us_per_step" not in self.breaks.columns:
            return None
        measured = self.breaks["eager_us_per_step"].dropna()
        return float(measured.sum()) / 1e6 if len(measured) else None

    def _text(self) -> str:
        lines = [f"GraphReport of {self.source}" if self.source else "GraphReport"]
        if self.error:
            lines.append(f"  the code raised: {self.error.splitlines()[0] if self.error else ''}")
        for label, value in self._headline():
            lines.append(f"  {label}: {value}")
        summary = self.break_summary()
        if not summary.empty:
            lines.append("  breaks (most costly first):")
            for row in summary.head(10).itertuples(index=False):
                cost = getattr(row, "eager_us_per_step", float("nan"))
                cost_text = f", {cost:,.0f} µs/step eager" if _is_number(cost) else ""
                where = f"{row.user_file}:{row.user_line}" if row.user_file else "?"
                lines.append(f"    {row.count}× {row.gb_type} at {where}{cost_text}")
                if isinstance(row.source_line, str) and row.source_line:
                    lines.append(f"        {row.source_line}")
                if isinstance(row.call_file, str) and row.call_file:
                    call = f"{row.call_file}:{row.call_line}"
                    code = f": {row.call_source_line}" if isinstance(row.call_source_line, str) else ""
                    lines.append(f"        called from {call}{code}")
                lines.append(f"        fix: {_first_sentence(row.fix)}")
        if not self.frames_given_up.empty:
            lines.append("  frames run eagerly after a break (Dynamo gave up; calls inside may compile):")
            for row in self.frames_given_up.head(5).itertuples(index=False):
                first = str(row.description).splitlines()[0] if row.description else ""
                lines.append(f"    [{row.compile_id}] {row.frame}, after the break at {row.source}: {first}")
        if not self.compile_failures.empty:
            lines.append("  compile failures:")
            for row in self.compile_failures.head(5).itertuples(index=False):
                first = str(row.description).splitlines()[0] if row.description else ""
                lines.append(f"    [{row.compile_id}] {row.failure_type}: {first}")
        if not self.recompiles.empty:
            lines.append("  recompiles:")
            lines.extend(
                f"    [{row.compile_id}] {row.function}: {row.failed_guard}"
                for row in self.recompiles.head(5).itertuples(index=False)
            )
        lines.extend(f"  note: {note}" for note in self.notes[:5])
        return "\n".join(lines)

    def _html(self) -> str:
        parts = [f"<div class='nbt-graph-report'><h4>GraphReport {escape(self.source)}</h4>"]
        if self.error:
            first = escape(self.error.splitlines()[0])
            parts.append(f"<p style='color:#b00'><b>The code raised:</b> <code>{first}</code></p>")
        parts.append("<table class='nbt-table'>")
        for label, value in self._headline():
            parts.append(f"<tr><th style='text-align:left'>{escape(label)}</th><td>{escape(value)}</td></tr>")
        parts.append("</table>")
        summary = self.break_summary()
        if not summary.empty:
            cols = [
                c
                for c in (
                    "count",
                    "gb_type",
                    "gb_id",
                    "user_file",
                    "user_line",
                    "source_line",
                    "call_file",
                    "call_line",
                    "inside_torch",
                    "eager_us_per_step",
                    "fix",
                )
                if c in summary.columns
            ]
            parts.append("<h5>Graph breaks, most costly first</h5>")
            parts.append(html_table(summary[cols]))
        if not self.frames_given_up.empty:
            parts.append("<h5>Frames run eagerly after a break</h5>")
            parts.append(html_table(self.frames_given_up[["compile_id", "frame", "source", "description"]]))
        if not self.compile_failures.empty:
            parts.append("<h5>Compile failures</h5>")
            parts.append(
                html_table(self.compile_failures[["compile_id", "failure_type", "description", "source"]])
            )
        if not self.recompiles.empty:
            parts.append("<h5>Recompiles</h5>")
            parts.append(
                html_table(self.recompiles[["compile_id", "function", "previous_compile_id", "failed_guard"]])
            )
        if not self.graphs.empty:
            parts.append("<h5>Graphs</h5>")
            parts.append(
                html_table(self.graphs[["compile_id", "function", "file", "op_count", "compile_time_s"]])
            )
        parts.extend(f"<p><i>note: {escape(note)}</i></p>" for note in self.notes[:10])
        parts.append("</div>")
        return "".join(parts)


@dataclass(repr=False)
class GraphComparison(Result):
    """Two GraphReports side by side: graphs, breaks, compile time and step time eager vs compiled."""

    before: GraphReport
    after: GraphReport
    labels: tuple[str, str] = ("before", "after")

    def table(self) -> pd.DataFrame:
        """One row per metric with both values and the change (after - before); times in seconds."""
        import pandas as pd

        def speedup(r: GraphReport) -> float | None:
            return r.speedup  # None where compiled and eager differ by less than the measured spread

        metrics: list[tuple[str, Any, Any]] = [
            ("graphs", len(self.before.graphs), len(self.after.graphs)),
            ("graph breaks", len(self.before.breaks), len(self.after.breaks)),
            ("distinct breaks", len(self.before.break_summary()), len(self.after.break_summary())),
            ("recompiles", len(self.before.recompiles), len(self.after.recompiles)),
            (
                "frames run eagerly after a break",
                len(self.before.frames_given_up),
                len(self.after.frames_given_up),
            ),
            ("compile failures", len(self.before.compile_failures), len(self.after.compile_failures)),
            ("compile time (s)", self.before.compile_time_s, self.after.compile_time_s),
            ("step time compiled (s)", self.before.step_time_s, self.after.step_time_s),
            ("step time eager (s)", self.before.eager_step_time_s, self.after.eager_step_time_s),
            ("speedup compiled vs eager (×)", speedup(self.before), speedup(self.after)),
        ]
        rows = []
        for name, a, b in metrics:
            change = b - a if _is_number(a) and _is_number(b) else None
            rows.append({"metric": name, self.labels[0]: a, self.labels[1]: b, "change": change})
        return pd.DataFrame(rows, dtype=object)  # object: counts stay ints next to times

    def fixed_breaks(self) -> pd.DataFrame:
        """Distinct breaks (type + location) present before and gone after."""
        before = self.before.break_summary()
        after = self.after.break_summary()
        keys = set(zip(after["gb_type"], after["user_file"], after["user_line"], strict=True))
        mask = [
            (t, f, ln) not in keys
            for t, f, ln in zip(before["gb_type"], before["user_file"], before["user_line"], strict=True)
        ]
        return before[mask]

    def _rows(self) -> list[tuple[str, str, str, str]]:
        """(label, before, after, change) as display strings, each with its unit."""

        def show(name: str, v: Any) -> str:
            if not _is_number(v):
                return "-" if v is None or name.endswith(")") else f"{v}"
            if name.endswith("(s)"):
                return format_seconds(float(v))
            if name.endswith("(×)"):
                return f"{v:.2f}×"
            return f"{v}"

        out = []
        for name, a, b, change in self.table().itertuples(index=False):
            label = name.replace(" (s)", "").replace(" (×)", "")
            delta = "-"
            if _is_number(change):
                delta = ("+" if change > 0 else "") + show(name, change)
            out.append((label, show(name, a), show(name, b), delta))
        return out

    def _text(self) -> str:
        a, b = self.labels
        lines = [f"{'':32}{a:>16}{b:>16}{'change':>16}"]
        for label, x, y, d in self._rows():
            lines.append(f"{label:32}{x:>16}{y:>16}{d:>16}")
        fixed = self.fixed_breaks()
        if not fixed.empty:
            lines.append(
                "fixed: "
                + "; ".join(
                    f"{t} at line {ln}" for t, ln in zip(fixed["gb_type"], fixed["user_line"], strict=True)
                )
            )
        return "\n".join(lines)

    def _html(self) -> str:
        a, b = self.labels
        head = f"<tr><th></th><th>{escape(a)}</th><th>{escape(b)}</th><th>change</th></tr>"
        body = "".join(
            f"<tr><th style='text-align:left'>{escape(label)}</th><td>{escape(x)}</td>"
            f"<td>{escape(y)}</td><td>{escape(d)}</td></tr>"
            for label, x, y, d in self._rows()
        )
        html = f"<table class='nbt-table'>{head}{body}</table>"
        fixed = self.fixed_breaks()
        if not fixed.empty:
            items = "".join(
                f"<li>{escape(t)} at line {escape(ln)}</li>"
                for t, ln in zip(fixed["gb_type"], fixed["user_line"], strict=True)
            )
            html += f"<p>Fixed breaks:</p><ul>{items}</ul>"
        return html
