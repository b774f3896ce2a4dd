"""`MemoryTimeline`: allocated bytes over time, by category, module and phase.

One model for CPU runs captured here (``nbt.memory_timeline``) and for CUDA allocator
snapshots recorded on GPUs (``nbt.load_memory_snapshot(path).timeline()``).

The data is one frame of memory events, in the order they happened:

=============  =====================================================================
column         meaning
=============  =====================================================================
time_us        float, microseconds since the first recorded event (memory that existed
               before recording started is put at time 0 with ``action="preexisting"``)
action         ``preexisting`` | ``alloc`` | ``free`` | ``recategorize`` (torch's
               INCREMENT_VERSION: the same bytes move from one category to another)
delta_bytes    int, +bytes for preexisting/alloc, -bytes for free; a recategorize is a
               pair of rows (-bytes old category, +bytes new category)
category       one of :data:`CATEGORIES`
tensor         int, identity of the allocation: its alloc and free rows share it
module         fully qualified module path (``encoder.layers.0.attn``), "" if none
phase          ``before`` (preexisting) | ``forward`` | ``backward`` | ``optimizer`` | ``other``
shape          shape and dtype of the tensor when known (``[64, 128] float32``), else ""
source         innermost user-code frame that allocated it (``train.py:42 in step``), or ""
stack_id       index into :attr:`MemoryTimeline.stacks` (the allocating stack), -1 if none
=============  =====================================================================

Everything derived (per-category series, peaks, what is alive at the peak, per-module and
per-phase tables) is computed by the pure functions of :mod:`nbtoolkit.memory.timeline_analysis`;
the methods here are thin conveniences over them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes
from nbtoolkit.memory.schema import CATEGORIES, EVENT_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MemoryComparison",
    "MemoryTimeline",
]

_FORMAT_VERSION = 1
# what MemoryTimeline.save writes: the events' dtypes (category as text) and the metadata's defaults
_SAVED_DTYPES = {
    "time_us": "float64", "action": "category", "delta_bytes": "int64", "category": "str", "tensor": "int64",
    "module": "category", "phase": "category", "shape": "category", "source": "category", "stack_id": "int64",
}
_SAVED_DEFAULTS: dict[str, Any] = {
    "stacks": [], "device": "cpu", "source": "", "notes": [], "category_method": "torch.profiler",
}


def empty_events() -> pd.DataFrame:
    """An events frame with the right columns and dtypes and no rows."""
    import pandas as pd

    return normalize_events(pd.DataFrame({c: [] for c in EVENT_COLUMNS}))


def _as_text_categorical(values: Any) -> Any:
    """A categorical of strings ("" for missing) without a per-row string round trip."""
    import pandas as pd

    if isinstance(values.dtype, pd.CategoricalDtype):
        categorical = values.array
        categories = [("" if c is None else str(c)) for c in categorical.categories]
        if len(set(categories)) == len(categories):
            codes = categorical.codes.copy()
            if (codes < 0).any():  # missing values become ""
                if "" not in categories:
                    categories.append("")
                codes[codes < 0] = categories.index("")
            return pd.Categorical.from_codes(codes, categories=categories)
        values = values.astype(object)
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    categories = ["" if u is None else str(u) for u in uniques]
    if (codes < 0).any():
        if "" not in categories:
            categories.append("")
        codes[codes < 0] = categories.index("")
    if len(set(categories)) != len(categories):  # e.g. 1 and "1" both became "1"
        return pd.Categorical(pd.Series(values).astype(object).fillna("").astype(str).to_numpy(dtype=object))
    return pd.Categorical.from_codes(codes, categories=categories)


def normalize_events(frame: pd.DataFrame) -> pd.DataFrame:
    """Give an events frame the documented columns and dtypes (missing text columns become "").

    Text columns are pandas categoricals: a million events repeat a few hundred module
    names and a handful of phases, and categorical codes keep grouping and plotting fast.
    """
    import numpy as np
    import pandas as pd

    n = len(frame)
    defaults: dict[str, Any] = {
        "time_us": 0.0,
        "action": "alloc",
        "delta_bytes": 0,
        "category": "unknown",
        "tensor": -1,
        "module": "",
        "phase": "other",
        "shape": "",
        "source": "",
        "stack_id": -1,
    }
    columns: dict[str, Any] = {}
    for name, kind in (
        ("time_us", "float64"),
        ("delta_bytes", "int64"),
        ("tensor", "int64"),
        ("stack_id", "int64"),
    ):
        if name in frame.columns:
            columns[name] = np.asarray(frame[name].to_numpy(), dtype=kind)
        else:
            columns[name] = np.full(n, defaults[name], dtype=kind)
    for name in ("action", "module", "phase", "shape", "source"):
        if name in frame.columns:
            columns[name] = _as_text_categorical(frame[name])
        else:
            columns[name] = pd.Categorical.from_codes(np.zeros(n, dtype="int8"), categories=[defaults[name]])
    raw_category = (
        _as_text_categorical(frame["category"])
        if "category" in frame.columns
        else pd.Categorical.from_codes(np.zeros(n, dtype="int8"), categories=["unknown"])
    )
    bad = sorted(set(raw_category.categories) - set(CATEGORIES) - {""})
    if bad:
        raise NbtUsageError(f"unknown memory categories {bad}: use one of {list(CATEGORIES)}")
    columns["category"] = raw_category.set_categories(list(CATEGORIES))
    if columns["category"].isna().any():  # "" (missing) means unknown
        columns["category"] = columns["category"].fillna("unknown")
    return pd.DataFrame({name: columns[name] for name in EVENT_COLUMNS})


@dataclass(repr=False)
class MemoryTimeline(Result):
    """Allocated bytes over time, by category, module and phase, on one device.

    Build one with ``nbt.memory_timeline(fn)`` (CPU, or CUDA when available) or with
    ``nbt.load_memory_snapshot(path).timeline()`` (a CUDA allocator snapshot).

    Attributes:
        events: the event frame (columns documented in this module's docstring).
        stacks: interned allocation stacks, innermost frame first, one line per frame.
        device: the device the memory lives on (``cpu``, ``cuda:0``).
        source: where the data came from (``torch.profiler``, a snapshot path).
        notes: what the capture wants the reader to know (partial run, heuristics used).
        category_method: how categories were decided (``torch.profiler`` or ``heuristic``).
        value: what the captured function returned last (captures only; not saved).
        allocator_snapshot: on CUDA, the allocator history recorded alongside (not saved).
    """

    events: pd.DataFrame
    stacks: list[str] = field(default_factory=list)
    device: str = "cpu"
    source: str = ""
    notes: list[str] = field(default_factory=list)
    category_method: str = "torch.profiler"
    #: what the captured function returned last (not saved)
    value: Any = field(default=None, compare=False)
    #: on CUDA, the allocator history recorded alongside (a MemorySnapshot; not saved)
    allocator_snapshot: Any = field(default=None, compare=False)
    #: for allocator snapshots: bytes reserved from CUDA over time (time_us, reserved_bytes; not saved)
    reserved: Any = field(default=None, compare=False)
    #: with memory_timeline(loop=True): the training loop's LoopOutcome (not saved)
    loop: Any = field(default=None, compare=False)
    #: allocations torch's profiler took for a storage still live, because that storage's free
    #: happened on another thread, unrecorded: their categories are unreliable (0: none; not saved)
    reused_storages: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        self.events = normalize_events(self.events)

    # -- derived views (pure functions in analysis.memory, imported here so `import nbtoolkit` stays light) --
    def by_category(self, *, coalesce: bool = True) -> pd.DataFrame:
        """Allocated bytes over time per category: columns ``time_us``, one per category, ``total``.

        With ``coalesce`` one row per distinct time (the state after all events at that
        time, as torch's ``export_memory_timeline`` does); otherwise one row per event.
        """
        from nbtoolkit.memory.timeline_analysis import category_series

        return category_series(self.events, coalesce=coalesce)

    @property
    def peak_bytes(self) -> int:
        """Highest total allocated bytes over the run (the running sum of ``delta_bytes``)."""
        from nbtoolkit.memory.timeline_analysis import peak

        return int(peak(self.events)[1])

    @property
    def peak_time(self) -> float:
        """``time_us`` at which :attr:`peak_bytes` was first reached."""
        from nbtoolkit.memory.timeline_analysis import peak

        index = peak(self.events)[0]
        return float(self.events["time_us"].iloc[index]) if index >= 0 else 0.0

    def category_peaks(self) -> pd.DataFrame:
        """Per category: its own peak (``peak_bytes``) and its bytes at the total peak (``at_peak_bytes``)."""
        from nbtoolkit.memory.timeline_analysis import category_peaks

        return category_peaks(self.events)

    def alive_at_peak(self, top: int = 20) -> pd.DataFrame:
        """The largest allocations live at the peak: bytes, category, module, phase, shape, stack."""
        from nbtoolkit.memory.timeline_analysis import alive_at_peak

        frame = alive_at_peak(self.events, top=top)
        frame["stack"] = [self.stacks[i] if 0 <= i < len(self.stacks) else "" for i in frame["stack_id"]]
        return frame

    def by_module(self) -> pd.DataFrame:
        """Per module path: bytes allocated, bytes alive at the peak, by category."""
        from nbtoolkit.memory.timeline_analysis import module_attribution

        return module_attribution(self.events)

    def by_phase(self) -> pd.DataFrame:
        """Per phase (before/forward/backward/optimizer/other): allocated, freed, peak within the phase."""
        from nbtoolkit.memory.timeline_analysis import phase_attribution

        return phase_attribution(self.events)

    def compare(
        self, other: MemoryTimeline, *, labels: tuple[str, str] = ("before", "after")
    ) -> MemoryComparison:
        """Peaks of this timeline (before) against ``other`` (after), per category and in total."""
        from nbtoolkit.memory.timeline_analysis import compare_peaks

        table = compare_peaks(self.events, other.events, labels=labels)
        return MemoryComparison(table=table, labels=labels)

    # -- Mosaic-style analyses (nbtoolkit.memory.breakdown / memory_diff) --------
    def peak_stack(self) -> Any:
        """The peak, what is alive at it and the stacks that allocated it (a PeakStack)."""
        from nbtoolkit.memory.breakdown import timeline_peak_stack

        return timeline_peak_stack(self)

    def memory_by(self, by: str = "category", *, pattern: str | None = None) -> pd.DataFrame:
        """Memory grouped by category, module, phase, stack or a regex ``pattern`` over frames."""
        from nbtoolkit.memory.breakdown import group_memory

        return group_memory(self, by, pattern=pattern)

    def diff(self, other: Any, *, labels: tuple[str, str] = ("a", "b")) -> Any:
        """What grew from this timeline to ``other``, by category and by stack (a MemoryDiff)."""
        from nbtoolkit.memory.diff import memory_diff

        return memory_diff(self, other, labels=labels)

    def figure(self, **options: Any) -> Any:
        """The stacked-area plot by category with phase bands and a module lane (plotly)."""
        from nbtoolkit.memory.figures import timeline_figure

        return timeline_figure(self, **options)

    def _report_figures(self) -> list[Any]:
        return [self.figure()]

    # -- persistence -----------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the timeline to one Parquet file (events, plus stacks and metadata in the schema)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from nbtoolkit.core.errors import SaveError
        from nbtoolkit.core.paths import path_errors
        from nbtoolkit.core.saved import file_to_save

        target = file_to_save(path, what="MemoryTimeline")
        frame = self.events.copy()
        frame["category"] = frame["category"].astype(str)
        table = pa.Table.from_pandas(frame, preserve_index=False)
        meta = {
            "format": "nbtoolkit.MemoryTimeline",
            "version": _FORMAT_VERSION,
            "stacks": self.stacks,
            "device": self.device,
            "source": self.source,
            "notes": self.notes,
            "category_method": self.category_method,
        }
        table = table.replace_schema_metadata({b"nbtoolkit": json.dumps(meta).encode()})
        with path_errors(target, "save the MemoryTimeline to", error=SaveError):
            pq.write_table(table, target)
        return target

    @classmethod
    def load(cls, path: str | Path) -> MemoryTimeline:
        """Read a timeline written by :meth:`save`; a damaged or edited file is a SnapshotError naming it."""
        from nbtoolkit.core.errors import SnapshotError
        from nbtoolkit.core.paths import path_errors, shown_path, user_path
        from nbtoolkit.core.saved import (
            TEXT,
            check_fields,
            check_range,
            check_version,
            list_of,
            read_frame,
            read_schema_json,
        )

        source = user_path(path, error=SnapshotError)
        with path_errors(source, "read the memory timeline", error=SnapshotError):
            if source.is_dir():
                raise SnapshotError(
                    f"{shown_path(source)} is a folder; a saved MemoryTimeline is one .parquet file "
                    "(a saved MemorySnapshot folder loads with nbt.MemorySnapshot.load)"
                )
            if not source.is_file():
                raise SnapshotError(
                    f"no memory timeline file at {shown_path(source)}: "
                    "save one with MemoryTimeline.save(path)"
                )
        raw = read_schema_json(source, b"nbtoolkit", what="memory timeline", error=SnapshotError) or {}
        if raw.get("format") != "nbtoolkit.MemoryTimeline":
            raise SnapshotError(
                f"{shown_path(source)} is a Parquet file but not a MemoryTimeline saved by nbtoolkit"
            )
        check_version(raw.get("version"), _FORMAT_VERSION, source, what="MemoryTimeline", error=SnapshotError)
        meta = check_fields(
            raw,
            {name: (list_of(TEXT) if name in ("stacks", "notes") else TEXT, default)
             for name, default in _SAVED_DEFAULTS.items()},
            where=shown_path(source),
            error=SnapshotError,
        )
        events = read_frame(source, _SAVED_DTYPES, what="MemoryTimeline", error=SnapshotError)
        try:
            events = normalize_events(events)
        except NbtUsageError as exc:
            raise SnapshotError(f"{shown_path(source)}: the saved MemoryTimeline is damaged: {exc}") from None
        check_range(events, "stack_id", -1, len(meta["stacks"]), where=shown_path(source),
                    what="MemoryTimeline", error=SnapshotError, meaning="-1 or an index into the stacks")
        check_range(events, "time_us", -math.inf, math.inf, where=shown_path(source),
                    what="MemoryTimeline", error=SnapshotError, meaning="finite times")
        return cls(events=events, **meta)

    # -- display -----------------------------------------------------------------------
    def _text(self) -> str:
        n_alloc = int((self.events["action"] == "alloc").sum())
        lines = [
            (
                f"MemoryTimeline on {self.device}: {len(self.events):,} events ({n_alloc:,} allocations), "
                f"peak {format_bytes(self.peak_bytes)} at {self.peak_time / 1e3:,.3f} ms"
            ),
            f"categories from {self.category_method}",
            f"  {'category':<16} {'at the peak':>12} {'own peak':>12}",
        ]
        lines.extend(
            f"  {r.category!s:<16} {format_bytes(int(r.at_peak_bytes)):>12} "
            f"{format_bytes(int(r.peak_bytes)):>12}"
            for r in self.category_peaks().itertuples()
            if r.at_peak_bytes or r.peak_bytes
        )
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)

    def _html(self) -> str:
        import pandas as pd

        peaks = self.category_peaks()
        peaks = peaks[(peaks["peak_bytes"] > 0) | (peaks["at_peak_bytes"] > 0)]
        table = pd.DataFrame(
            {
                "category": peaks["category"].astype(str),
                "at the peak": [format_bytes(v) for v in peaks["at_peak_bytes"]],
                "own peak": [format_bytes(v) for v in peaks["peak_bytes"]],
            }
        )
        alive = self.alive_at_peak(top=10)
        alive_table = pd.DataFrame(
            {
                "size": [format_bytes(v) for v in alive["bytes"]],
                "category": alive["category"].astype(str),
                "module": alive["module"],
                "phase": alive["phase"],
                "shape": alive["shape"],
                "source": alive["source"],
            }
        )
        notes = "".join(f"<p><i>{escape(n)}</i></p>" for n in self.notes)
        return (
            f"<div class='nbt-memory'><b>MemoryTimeline</b> on {escape(self.device)}: "
            f"{len(self.events):,} events, peak <b>{escape(format_bytes(self.peak_bytes))}</b> at "
            f"{self.peak_time / 1e3:,.3f} ms (categories from {escape(self.category_method)})"
            f"{html_table(table)}<p>Largest allocations alive at the peak:</p>{html_table(alive_table)}"
            f"{notes}</div>"
        )


@dataclass(repr=False)
class MemoryComparison(Result):
    """Peak memory of two timelines side by side (e.g. before/after an optimization).

    ``table`` has one row per category plus ``total``: ``<before>_bytes``, ``<after>_bytes``
    (each the category's bytes at that run's total peak), ``delta_bytes`` and ``change_pct``.
    """

    table: pd.DataFrame
    labels: tuple[str, str] = ("before", "after")

    def _display_frame(self) -> pd.DataFrame:
        import pandas as pd

        a, b = self.labels
        return pd.DataFrame(
            {
                "category": self.table["category"],
                a: [format_bytes(v) for v in self.table[f"{a}_bytes"]],
                b: [format_bytes(v) for v in self.table[f"{b}_bytes"]],
                "change": [format_bytes(v) for v in self.table["delta_bytes"]],
                "change %": [f"{v:+.1f}%" if not math.isnan(v) else "n/a" for v in self.table["change_pct"]],
            }
        )

    def _text(self) -> str:
        frame = self._display_frame()
        return "Peak memory at the total peak, by category\n" + frame.to_string(index=False)

    def _html(self) -> str:
        return "<b>Peak memory at the total peak, by category</b>" + html_table(self._display_frame())
