"""Figures of the memory analyses: the peak's stacks as an icicle, a diff, imbalance across ranks.

Each returns a plotly ``Figure``; text from stacks and file names is HTML-escaped before it goes
into labels and hovers. Sizes carry their unit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from nbtoolkit.core.result import escape
from nbtoolkit.core.units import format_bytes
from nbtoolkit.memory.figures import CATEGORY_COLORS

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

__all__ = ["diff_figure", "imbalance_figure", "peak_icicle"]


# What the figures read of the reports of nbtoolkit.memory.reports. Named here rather than
# imported: the reports' figure() methods import this module, and importing them back (even for
# annotations) would close an import cycle.
class PeakStack(Protocol):
    peak_bytes: int
    by_stack: pd.DataFrame


class MemoryDiff(Protocol):
    by_category: pd.DataFrame
    by_stack: pd.DataFrame
    labels: tuple[str, str]

    def reading(self) -> str: ...


class MemoryImbalance(Protocol):
    peaks: pd.DataFrame
    top_rank: int
    baseline_rank: int
    category: str
    category_delta_bytes: int

_ROOT = "peak"


def icicle_nodes(by_stack: Any, *, max_stacks: int = 40, max_depth: int = 16) -> dict[str, list[Any]]:
    """Nodes of the icicle: ``ids``, ``labels``, ``parents``, ``values`` (bytes), outermost frame first.

    A stack's lines are innermost first; the icicle reads from the outermost call down, so
    they are reversed. Each node's value is the sum of the stacks through it (``branchvalues="total"``).
    Stacks past ``max_stacks`` (smallest) are summed into one "other stacks" node.
    """
    values: dict[str, int] = {}
    labels: dict[str, str] = {}
    parents: dict[str, str] = {}
    order: list[str] = []
    path_ids: dict[tuple[str, str], str] = {}
    total = 0

    def add(node: str, label: str, parent: str, size: int) -> None:
        if node not in values:
            values[node] = 0
            labels[node] = label
            parents[node] = parent
            order.append(node)
        values[node] += size

    rows = list(by_stack[["stack", "bytes"]].itertuples(index=False))
    shown, rest = rows[:max_stacks], rows[max_stacks:]
    for stack, raw_size in shown:
        size = int(raw_size)
        total += size
        frames = [line for line in str(stack).splitlines() if line][::-1][:max_depth] or [
            "(no stack recorded)"
        ]
        parent = _ROOT
        for frame in frames:
            # Ids are short (the figure stores every id): one per distinct path from the root.
            node = path_ids.setdefault((parent, frame), f"n{len(path_ids)}")
            add(node, frame, parent, size)
            parent = node
    other = sum(int(size) for _, size in rest)
    if other:
        total += other
        add("other", f"{len(rest)} other stacks", _ROOT, other)
    return {
        "ids": [_ROOT, *order],
        "labels": [f"peak ({format_bytes(total)})", *(labels[n] for n in order)],
        "parents": ["", *(parents[n] for n in order)],
        "values": [total, *(values[n] for n in order)],
    }


def peak_icicle(peak: PeakStack, *, max_stacks: int = 40, max_depth: int = 16) -> go.Figure:
    """The bytes alive at the peak as an icicle of their stacks (outermost call at the top)."""
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    nodes = icicle_nodes(peak.by_stack, max_stacks=max_stacks, max_depth=max_depth)
    figure = StaticFigure(
        go.Icicle(
            ids=nodes["ids"],
            labels=[escape(label) for label in nodes["labels"]],
            parents=nodes["parents"],
            values=nodes["values"],
            branchvalues="total",
            customdata=[format_bytes(v) for v in nodes["values"]],
            hovertemplate="%{label}<br>%{customdata} live at the peak<extra></extra>",
            tiling={"orientation": "v"},
            root={"color": "lightgrey"},
        )
    )
    figure.update_layout(
        title=f"Alive at the peak ({format_bytes(peak.peak_bytes)}), by allocating stack",
        margin={"t": 50, "l": 10, "r": 10, "b": 10},
        height=520,
    )
    return figure


def _first_line(stack: str) -> str:
    lines = str(stack).splitlines()
    return lines[0] if lines else "(no stack recorded)"


def diff_figure(diff: MemoryDiff, *, top_stacks: int = 12) -> go.Figure:
    """Change per category at the peak (left) and the stacks that changed most (right)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nbtoolkit.core.static_figure import StaticFigure

    a, b = diff.labels
    figure = make_subplots(
        rows=1, cols=2, column_widths=[0.4, 0.6], subplot_titles=("by category, at the peak", "by stack"),
        figure=StaticFigure(),
    )
    cats = diff.by_category
    figure.add_trace(
        go.Bar(
            y=list(cats["category"]),
            x=list(cats["delta_bytes"] / 2**20),
            orientation="h",
            marker={"color": [CATEGORY_COLORS.get(str(c), "grey") for c in cats["category"]]},
            customdata=[format_bytes(int(v)) for v in cats["delta_bytes"]],
            hovertemplate=f"%{{y}}: %{{customdata}} ({escape(a)} → {escape(b)})<extra></extra>",
            name="category",
        ),
        row=1,
        col=1,
    )
    stacks = diff.by_stack.head(top_stacks)
    figure.add_trace(
        go.Bar(
            y=[escape(_first_line(s)) for s in stacks["stack"]][::-1],
            x=list(stacks["delta_bytes"] / 2**20)[::-1],
            orientation="h",
            marker={"color": ["crimson" if v > 0 else "seagreen" for v in stacks["delta_bytes"]][::-1]},
            customdata=[
                [format_bytes(int(v)), escape(str(s)).replace("\n", "<br>")]
                for v, s in zip(stacks["delta_bytes"], stacks["stack"], strict=True)
            ][::-1],
            hovertemplate="%{customdata[0]}<br>%{customdata[1]}<extra></extra>",
            name="stack",
        ),
        row=1,
        col=2,
    )
    figure.update_xaxes(title_text="change (MiB)")
    figure.update_layout(
        title=escape(diff.reading()), showlegend=False, template="plotly_white", height=440, margin={"t": 70}
    )
    return figure


def imbalance_figure(report: MemoryImbalance) -> go.Figure:
    """Each rank's peak stacked by category; the top rank and the category that differs marked."""
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    peaks = report.peaks
    ranks = [f"rank {r}" for r in peaks["rank"]]
    figure = StaticFigure()
    for column in [c for c in peaks.columns if c not in ("rank", "peak_bytes")]:
        category = column.removesuffix("_bytes")
        differing = category == report.category
        figure.add_trace(
            go.Bar(
                x=ranks,
                y=peaks[column] / 2**30,
                name=category + (" (differs most)" if differing else ""),
                marker={
                    "color": CATEGORY_COLORS.get(category, "grey"),
                    "line": {"width": 3 if differing else 0, "color": "black"},
                },
                customdata=[format_bytes(int(v)) for v in peaks[column]],
                hovertemplate=f"%{{x}} {category}: %{{customdata}}<extra></extra>",
            )
        )
    top = peaks.loc[peaks["rank"] == report.top_rank, "peak_bytes"].iloc[0]
    figure.add_annotation(
        x=f"rank {report.top_rank}",
        y=float(top) / 2**30,
        text=(
            f"highest: +{format_bytes(report.category_delta_bytes)} {escape(report.category)} "
            f"vs rank {report.baseline_rank}"
        ),
        showarrow=True,
        arrowhead=2,
        ay=-40,
    )
    figure.update_layout(
        barmode="stack",
        title="Peak per rank, by category",
        yaxis_title="bytes at the peak (GiB)",
        template="plotly_white",
        height=420,
        margin={"t": 60},
    )
    return figure
