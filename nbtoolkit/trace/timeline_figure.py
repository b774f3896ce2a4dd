"""``timeline``: lanes of a few ranks of a Trace (host operators, device streams by kernel type).

Below the Trace: it reads the trace through :class:`TimelineTrace` (what it needs of one) and
imports nothing that imports the Trace, so ``Trace._report_figures`` can draw it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from nbtoolkit.core.profiler_steps import PROFILER_STEP_PREFIX

if TYPE_CHECKING:
    import pandas as pd

    from nbtoolkit.trace.records import RankInfo

__all__ = ["TimelineTrace", "timeline"]


class TimelineTrace(Protocol):
    """What :func:`timeline` reads of a :class:`~nbtoolkit.trace.trace.Trace`."""

    @property
    def events(self) -> dict[int, pd.DataFrame]: ...

    @property
    def info(self) -> dict[int, RankInfo]: ...

    @property
    def ranks(self) -> list[int]: ...

    @property
    def steps(self) -> pd.DataFrame: ...


COLOURS = {
    "compute": "#4C78A8",
    "communication": "#E45756",
    "memory": "#54A24B",
    "other": "#9D9D9D",
    "host": "#72B7B2",
}


def _lanes(trace: TimelineTrace, rank: int) -> list[tuple[str, str, np.ndarray, np.ndarray, list[str]]]:
    """(lane label, kind, starts, ends, names) for one rank, device lanes first."""
    from nbtoolkit.trace import kernel_types as k

    frame = trace.events[rank]
    out = []
    stream = frame["stream"].to_numpy()
    device = frame[stream >= 0]
    if len(device):
        kinds = k.kernel_types(device["name"])
        mapping = {
            k.COMPUTATION: "compute",
            k.COMMUNICATION: "communication",
            k.MEMORY: "memory",
            k.OTHER: "other",
        }
        for s in sorted(device["stream"].unique()):
            on = (device["stream"] == s).to_numpy()
            for hta_kind, kind in mapping.items():
                sel = on & (kinds == hta_kind)
                if sel.any():
                    rows = device[sel]
                    out.append(
                        (
                            f"rank {rank} · stream {s}",
                            kind,
                            rows["ts"].to_numpy(),
                            (rows["ts"] + rows["dur"]).to_numpy(),
                            rows["name"].astype(str).tolist(),
                        )
                    )
    host = frame[(stream < 0) & ~frame["name"].astype(str).str.startswith(PROFILER_STEP_PREFIX)]
    names = host["name"]
    comm_flags = np.array([str(c).startswith(k.COMM_PREFIXES) for c in names.cat.categories] + [False])
    is_comm = comm_flags[names.cat.codes.to_numpy()]
    threads = trace.info[rank].thread_names
    for (pid, tid), rows_index in host.groupby(["pid", "tid"], sort=True).indices.items():
        label = threads.get(f"{pid}:{tid}", f"thread {tid}")
        label = f"rank {rank} · {label}"
        for kind, sel in (("host", ~is_comm[rows_index]), ("communication", is_comm[rows_index])):
            rows = host.iloc[rows_index[sel]]
            if len(rows):
                out.append(
                    (
                        label,
                        kind,
                        rows["ts"].to_numpy(),
                        (rows["ts"] + rows["dur"]).to_numpy(),
                        rows["name"].astype(str).tolist(),
                    )
                )
    return out


def _decimate(
    starts: np.ndarray, ends: np.ndarray, names: list[str], gap: float
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Merge intervals closer than ``gap``; a merged segment is labelled with its event count."""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    running = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[:1] = True
    new[1:] = s[1:] > running[:-1] + gap
    firsts = np.flatnonzero(new)
    lasts = np.r_[firsts[1:], len(s)] - 1
    counts = lasts - firsts + 1
    labels = [
        names[order[f]] if c == 1 else f"{c} events, e.g. {names[order[f]]}"
        for f, c in zip(firsts, counts, strict=True)
    ]
    return s[firsts], running[lasts], labels


def timeline(trace: TimelineTrace, *, ranks: list[int] | None = None, resolution: int = 2000) -> Any:
    """Per-rank lane timeline as a plotly figure (see the module docstring).

    Args:
        ranks: ranks to draw (default: all, up to 16).
        resolution: segments per lane and kind at most; smaller is faster.
    """
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    chosen = list(ranks) if ranks is not None else trace.ranks[:16]
    unknown = [r for r in chosen if r not in trace.events]
    if unknown:
        from nbtoolkit.core.errors import TraceError

        raise TraceError(
            f"ranks {unknown} are not in this trace (ranks present: {trace.ranks[:32]}); lanes of "
            "hundreds of ranks are unreadable: pick a few, e.g. the slowest from nbt.stragglers(...)"
        )
    lanes = [lane for r in chosen for lane in _lanes(trace, r)]
    if not lanes:
        return StaticFigure()
    origin = min(float(lane[2].min()) for lane in lanes)
    span = max(float(lane[3].max()) for lane in lanes) - origin
    gap = span / max(resolution, 1)
    labels: list[str] = []
    for lane in lanes:
        if lane[0] not in labels:
            labels.append(lane[0])
    y_of = {label: i for i, label in enumerate(labels)}
    segments: dict[str, tuple[list[float], list[float], list[str]]] = {}
    for label, kind, starts, ends, names in lanes:
        s, e, text = _decimate(starts, ends, names, gap)
        xs, ys, hover = segments.setdefault(kind, ([], [], []))
        y = y_of[label]
        for a, b, t in zip((s - origin) / 1e3, (e - origin) / 1e3, text, strict=True):
            xs += [a, b, None]  # type: ignore[list-item]  # None breaks the line between segments
            ys += [y, y, None]  # type: ignore[list-item]
            hover += [t, t, ""]
    fig = StaticFigure()
    for kind in ("compute", "communication", "memory", "other", "host"):
        if kind in segments:
            xs, ys, hover = segments[kind]
            fig.add_trace(
                go.Scattergl(
                    x=xs,
                    y=ys,
                    mode="lines",
                    name=kind,
                    line={"color": COLOURS[kind], "width": 10},
                    hovertext=hover,
                    hoverinfo="text+x",
                )
            )
    steps = trace.steps
    first_rank = chosen[0] if chosen else None
    for i, row in enumerate(steps[steps["rank"] == first_rank].itertuples(index=False)):
        fig.add_vrect(
            x0=(row.ts - origin) / 1e3,
            x1=(row.ts + row.dur - origin) / 1e3,
            fillcolor="#F2CF5B" if i % 2 == 0 else "#B8B0AC",
            opacity=0.15,
            line_width=0,
            annotation_text=f"step {row.step}",
            annotation_position="top left",
        )
    fig.update_layout(
        title=f"Timeline of {len(chosen)} rank(s) (ms from the first event)",
        xaxis_title="time (ms)",
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(len(labels))),
            "ticktext": labels,
            "autorange": "reversed",
        },
        height=max(250, 40 * len(labels) + 120),
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
    )
    return fig
