"""``Roofline``: achieved FLOP/s and bytes/s per op class and module against the device's roofs.

Plain data made by ``nbt.roofline``; the chart is drawn by :mod:`nbtoolkit.trace.roofline_figure`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtoolkit.core.result import Result, escape, html_table
from nbtoolkit.core.units import format_flop_rate

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RATE_COLUMNS", "Roofline"]

# The columns every table of a Roofline shares after its key columns.
RATE_COLUMNS = ("calls", "time_us", "flops", "bytes", "intensity", "tflops_per_s", "gb_per_s",
                "peak_tflops", "ridge", "bound", "pct_of_roof")


@dataclass(repr=False, eq=False)
class Roofline(Result):
    """Roofline figures of one rank; see ``nbt.roofline`` for the definitions.

    Attributes:
        ops: one row per op instance that ran kernels (or, on a CPU, per leaf op): ``name``,
            ``op_class``, ``precision``, ``module`` and ``RATE_COLUMNS``.
        by_class: the same summed per ``op_class`` and ``precision``.
        by_module: the same summed per module (``nn.Module: ...`` annotations), when recorded.
        collectives: algorithmic and bus bandwidth per collective and message size.
        device: the device name; ``bandwidth`` its DRAM bytes/s (None when unknown).
        flop_check: per aten op, FLOPs per step from the shapes and from torch's FLOP counter
            (when the trace came from ``nbt.profile(..., metrics=True)``).
    """

    rank: int
    device: str
    bandwidth: float | None
    ops: pd.DataFrame
    by_class: pd.DataFrame
    by_module: pd.DataFrame
    collectives: pd.DataFrame
    flop_check: pd.DataFrame | None = None
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def frames(self) -> dict[str, pd.DataFrame]:
        """The result's tables by name, to save or export."""
        tables = {"ops": self.ops, "by_class": self.by_class, "by_module": self.by_module,
                  "collectives": self.collectives}
        if self.flop_check is not None:
            tables["flop_check"] = self.flop_check
        return tables

    def figure(self) -> Any:
        """The roofline chart (plotly): one point per op class, the roofs of each precision."""
        from nbtoolkit.trace.roofline_figure import roofline_figure

        return roofline_figure(self)

    def _headline(self) -> str:
        bw = f", memory {self.bandwidth / 1e9:,.0f} GB/s" if self.bandwidth else ""
        return f"Roofline of rank {self.rank} on {self.device or 'an unknown device'}{bw}"

    def _class_lines(self) -> list[str]:
        lines = []
        for row in self.by_class.itertuples(index=False):
            rate = format_flop_rate(row.tflops_per_s * 1e12)
            roof = f"{row.pct_of_roof:5.1f} % of roof" if row.pct_of_roof == row.pct_of_roof else "  no roof"
            lines.append(f"  {row.op_class:14s} {row.precision or '-':5s} {row.time_us / 1e3:10.3f} ms  "
                         f"{rate:>14s}  {row.gb_per_s:9.1f} GB/s  {row.bound or '-':8s} {roof}")
        return lines

    def _text(self) -> str:
        lines = [self._headline()]
        if len(self.by_class):
            lines.append("By op class (kernel time, or host time on a CPU; achieved rate; bound; "
                         "share of the roof):")
            lines += self._class_lines()
        if len(self.collectives):
            lines.append("Collectives (median call; bandwidth in GB/s):")
            lines += [
                f"  {row.collective:14s} n={row.group_size:<3d} {row.size_bytes:>14,d} B"
                f"  {row.calls:4d} calls  algbw {row.algbw_gbps:8.2f}  busbw {row.busbw_gbps:8.2f}"
                for row in self.collectives.itertuples(index=False)
            ]
        lines += [f"Source: {s}" for s in self.sources]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _html(self) -> str:
        parts = [f"<div class='nbt-roofline'><b>{escape(self._headline())}</b>"]
        if len(self.by_class):
            parts.append("<p>By op class</p>" + html_table(self.by_class, float_format="{:,.2f}"))
        if len(self.by_module):
            parts.append("<p>By module</p>" + html_table(self.by_module, float_format="{:,.2f}"))
        if len(self.collectives):
            parts.append("<p>Collectives</p>" + html_table(self.collectives, float_format="{:,.2f}"))
        parts += [f"<p><i>{escape(s)}</i></p>" for s in self.sources + self.notes]
        return "".join(parts) + "</div>"
