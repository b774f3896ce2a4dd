"""Results of the memory analyses: the peak and its stack, a diff of two runs, imbalance across ranks.

Plain data (frames and a few numbers) made by :mod:`nbtoolkit.memory.diff` and
:mod:`nbtoolkit.memory.breakdown`; each shows itself as a table in a notebook and
exports itself for sharing and for tools: :meth:`to_json` (a string, numbers in bytes) and
:meth:`to_markdown` (a GitHub table, sizes with units). Figures come from
:mod:`nbtoolkit.memory.report_figures` through ``.figure()``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_bytes

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MemoryDiff", "MemoryImbalance", "PeakStack", "frame_markdown", "frame_records"]

_BYTE_COLUMNS_SUFFIX = "_bytes"


def frame_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain JSON values (numpy ints become ints, NaN becomes None)."""
    import math

    rows = []
    for record in frame.to_dict(orient="records"):
        clean: dict[str, Any] = {}
        for key, raw in record.items():
            value = raw.item() if hasattr(raw, "item") else raw
            clean[str(key)] = None if isinstance(value, float) and math.isnan(value) else value
        rows.append(clean)
    return rows


def frame_markdown(frame: pd.DataFrame, *, max_rows: int = 30) -> str:
    """A GitHub-flavoured Markdown table; ``*_bytes`` columns shown with units, ``|`` escaped."""
    import pandas as pd

    shown = frame.head(max_rows)
    header = [str(c) for c in shown.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for record in shown.itertuples(index=False):
        cells = []
        for name, value in zip(header, record, strict=True):
            if name.endswith(_BYTE_COLUMNS_SUFFIX) and isinstance(value, (int, float)) and not pd.isna(value):
                text = format_bytes(int(value))
            else:
                text = str(value)
            cells.append(text.replace("|", "\\|").replace("\n", " ← "))
        lines.append("| " + " | ".join(cells) + " |")
    if len(frame) > max_rows:
        lines.append(f"\n({len(frame) - max_rows} more rows)")
    return "\n".join(lines)


def _display(frame: pd.DataFrame) -> pd.DataFrame:
    shown = frame.copy()
    for column in shown.columns:
        if str(column).endswith(_BYTE_COLUMNS_SUFFIX):
            shown[column] = [format_bytes(int(v)) for v in shown[column]]
    return shown


@dataclass(repr=False)
class PeakStack(Result):
    """What is alive at the peak and the stacks that allocated it.

    ``alive``: one row per allocation live at the peak (``bytes, category, stack``...), largest first.
    ``by_stack``: bytes live at the peak per full stack (``stack, bytes, allocations``), largest first.
    ``stack``: the full stack (outermost call last, one frame a line) of the largest allocation.
    """

    peak_bytes: int
    peak_time_us: float
    alive: pd.DataFrame
    by_stack: pd.DataFrame
    stack: str
    device: str = ""

    def figure(self, **options: Any) -> Any:
        """The bytes live at the peak as an icicle of their stacks (outermost frame at the top)."""
        from nbtoolkit.memory.report_figures import peak_icicle

        return peak_icicle(self, **options)

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": "nbtoolkit.PeakStack",
                "device": self.device,
                "peak_bytes": self.peak_bytes,
                "peak_time_us": self.peak_time_us,
                "stack": self.stack,
                "by_stack": frame_records(self.by_stack),
            }
        )

    @property
    def python_stack(self) -> str:
        """The Python frames of :attr:`stack` (the user's own lines), with a count of the native
        (C++) frames left out; the whole stack when it has no Python frame. The views show this:
        a snapshot recorded with ``context="all"`` puts dozens of allocator frames first."""
        lines = self.stack.splitlines()
        python = [line for line in lines if ".py:" in line]
        if not python or len(python) == len(lines):
            return self.stack
        hidden = len(lines) - len(python)
        return "\n".join([*python, f"({hidden} native frames left out; .stack has them all)"])

    def to_markdown(self) -> str:
        where = self.device or "the device"
        head = f"**Peak {format_bytes(self.peak_bytes)}** on {where} at {self.peak_time_us:,.0f} µs"
        lines = self.python_stack.splitlines()
        stack = "\n".join(f"    {line}" for line in lines) or "    (no stack recorded)"
        return f"{head}\n\nLargest allocation's stack:\n\n{stack}\n\n{frame_markdown(self.by_stack)}"

    def _text(self) -> str:
        return (
            f"Peak {format_bytes(self.peak_bytes)} at {self.peak_time_us:,.0f} us: "
            f"{len(self.alive)} allocations live\n"
            f"largest allocation's stack:\n{self.python_stack or '(none)'}"
        )

    def _html(self) -> str:
        return (
            f"<b>Peak {escape(format_bytes(self.peak_bytes))}</b> — largest allocation's stack:"
            f"<pre>{escape(self.python_stack or '(no stack recorded)')}</pre>"
            f"{html_table(_display(self.by_stack))}"
        )


@dataclass(repr=False)
class MemoryDiff(Result):
    """What grew from ``a`` to ``b``: at the peak, by category and by allocating stack.

    ``by_category``: ``category, a_bytes, b_bytes, delta_bytes`` (bytes live at each run's peak).
    ``by_stack``: ``stack, a_bytes, b_bytes, delta_bytes``, only stacks whose bytes changed,
    largest change first. ``totals``: ``peak``, and for snapshots ``reserved``/``allocated``.
    A diff of a run with itself is :attr:`empty`.
    """

    by_category: pd.DataFrame
    by_stack: pd.DataFrame
    totals: pd.DataFrame
    labels: tuple[str, str] = ("a", "b")
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """True when nothing differs: no category, stack or total changed."""
        return bool(
            (self.by_category["delta_bytes"] == 0).all()
            and self.by_stack.empty
            and (self.totals["delta_bytes"] == 0).all()
        )

    @property
    def peak_delta_bytes(self) -> int:
        row = self.totals[self.totals["total"] == "peak"]
        return int(row["delta_bytes"].iloc[0]) if len(row) else 0

    def grew(self) -> pd.DataFrame:
        """Categories whose bytes at the peak grew, largest growth first."""
        grown = self.by_category[self.by_category["delta_bytes"] > 0]
        return grown.sort_values("delta_bytes", ascending=False).reset_index(drop=True)

    def reading(self) -> str:
        if self.empty:
            return f"no difference between {self.labels[0]} and {self.labels[1]}"
        a, b = self.labels
        delta = self.peak_delta_bytes
        change = "grew" if delta > 0 else "shrank" if delta < 0 else "stayed"
        words = f"the peak {change} by {format_bytes(abs(delta))} from {a} to {b}"
        changed = self.by_category.loc[self.by_category["delta_bytes"].abs().idxmax()]
        if int(changed["delta_bytes"]):
            words += f"; most in {changed['category']} ({format_bytes(int(changed['delta_bytes']))})"
        if not self.by_stack.empty:
            top = str(self.by_stack["stack"].iloc[0]).splitlines()
            words += f"; top stack: {top[0] if top else '(no stack)'}"
        return words

    def figure(self, **options: Any) -> Any:
        """Bars of the change per category and for the stacks that changed most (plotly)."""
        from nbtoolkit.memory.report_figures import diff_figure

        return diff_figure(self, **options)

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": "nbtoolkit.MemoryDiff",
                "labels": list(self.labels),
                "empty": self.empty,
                "totals": frame_records(self.totals),
                "by_category": frame_records(self.by_category),
                "by_stack": frame_records(self.by_stack),
                "notes": self.notes,
            }
        )

    def to_markdown(self) -> str:
        a, b = self.labels
        return (
            f"### Memory diff: {a} → {b}\n\n{self.reading()}\n\n{frame_markdown(self.totals)}\n\n"
            f"By category (at each peak)\n\n{frame_markdown(self.by_category)}\n\n"
            f"By stack (changed only)\n\n{frame_markdown(self.by_stack, max_rows=15)}"
        )

    def _text(self) -> str:
        return f"MemoryDiff {self.labels[0]} -> {self.labels[1]}: {self.reading()}\n" + _display(
            self.by_category
        ).to_string(index=False)

    def _html(self) -> str:
        return (
            f"<div class='nbt-memory'><b>Memory diff</b> "
            f"{escape(self.labels[0])} → {escape(self.labels[1])}: "
            f"{escape(self.reading())}{html_table(_display(self.totals))}{html_table(_display(self.by_category))}"
            f"{html_table(_display(self.by_stack), max_rows=10)}</div>"
        )


@dataclass(repr=False)
class MemoryImbalance(Result):
    """Which rank peaks highest and why.

    ``peaks``: per rank ``rank, peak_bytes`` and each category's bytes at that rank's peak.
    ``top_rank`` peaks highest; ``baseline_rank`` is the rank with the median peak it is compared
    with. ``category``: the category whose bytes at the peak differ most between the two;
    ``by_stack``: stacks whose bytes live at the peak differ (``stack, top_bytes, baseline_bytes,
    delta_bytes``), largest first.
    """

    peaks: pd.DataFrame
    top_rank: int
    baseline_rank: int
    category: str
    category_delta_bytes: int
    by_stack: pd.DataFrame
    ratio: float

    def reading(self) -> str:
        top = self.peaks.loc[self.peaks["rank"] == self.top_rank, "peak_bytes"].iloc[0]
        if self.top_rank == self.baseline_rank or self.ratio <= 1.0:
            return f"all {len(self.peaks)} ranks peak at {format_bytes(int(top))}"
        words = (
            f"rank {self.top_rank} peaks highest at {format_bytes(int(top))}, {self.ratio:.2f}x the lowest; "
            f"against rank {self.baseline_rank} (the median) it holds "
            f"{format_bytes(self.category_delta_bytes)} "
            f"more {self.category}"
        )
        if not self.by_stack.empty:
            first = str(self.by_stack["stack"].iloc[0]).splitlines()
            words += f", most from {first[0] if first else '(no stack)'}"
        return words

    def figure(self, **options: Any) -> Any:
        """Peak per rank, stacked by category, the top rank and the differing category marked."""
        from nbtoolkit.memory.report_figures import imbalance_figure

        return imbalance_figure(self, **options)

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": "nbtoolkit.MemoryImbalance",
                "top_rank": self.top_rank,
                "baseline_rank": self.baseline_rank,
                "ratio": self.ratio,
                "category": self.category,
                "category_delta_bytes": self.category_delta_bytes,
                "peaks": frame_records(self.peaks),
                "by_stack": frame_records(self.by_stack),
            }
        )

    def to_markdown(self) -> str:
        return (
            f"### Memory imbalance across {len(self.peaks)} ranks\n\n{self.reading()}\n\n"
            f"{frame_markdown(self.peaks)}\n\nStacks that differ (rank {self.top_rank} vs "
            f"rank {self.baseline_rank})\n\n{frame_markdown(self.by_stack, max_rows=10)}"
        )

    def _text(self) -> str:
        return f"MemoryImbalance: {self.reading()}\n" + _display(self.peaks).to_string(index=False)

    def _html(self) -> str:
        return (
            f"<div class='nbt-memory'><b>Memory imbalance</b>: {escape(self.reading())}"
            f"{html_table(_display(self.peaks))}{html_table(_display(self.by_stack), max_rows=8)}</div>"
        )
