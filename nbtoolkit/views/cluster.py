"""Views of the cluster: status table, per-rank cell results, the ZeRO sweep chart.

All text that came from the ranks (values, tracebacks, hostnames) is escaped.
Plotly is imported inside the functions that build figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbtoolkit.model._result import escape

if TYPE_CHECKING:
    from nbtoolkit.cluster.cluster import ClusterStatus, RemoteRun

__all__ = ["remote_run_html", "status_html", "sweep_figure"]

_STATE_COLOURS = {
    "idle": "#2e7d32",
    "busy": "#1565c0",
    "dead": "#c62828",
    "broken": "#ef6c00",
    "unresponsive": "#ef6c00",
}


def status_html(status: ClusterStatus) -> str:
    """The status as a header line and a table with one coloured row per rank."""
    h = status.header
    head = (
        f"<p><b>Cluster</b> at <code>{escape(h['address'])}</code> ({escape(h['origin'])}): "
        f"{h['world_size']} ranks, backend <code>{escape(h['backend'])}</code>"
        + (f", master <code>{escape(h['master'])}</code>" if h.get("master") else "")
        + "</p>"
    )
    cols = ["rank", "state", "pid", "ip", "device", "cells run", "busy", "cause"]
    rows = []
    for row in status.rows:
        colour = _STATE_COLOURS.get(row["state"], "#555")
        busy = f"{row['busy_s']:.1f} s" if row.get("busy_s") else ""
        cells = [
            f"<td>{row['rank']}</td>",
            f"<td style='color:{colour};font-weight:bold'>{escape(row['state'])}</td>",
            f"<td>{row['pid']}</td>",
            f"<td>{escape(row['ip'])}</td>",
            f"<td>{escape(row['device'])}</td>",
            f"<td style='text-align:right'>{row['cells_run']}</td>",
            f"<td style='text-align:right'>{busy}</td>",
            f"<td>{escape(row.get('cause') or '')}</td>",
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    table = (
        "<table class='nbt-table'><thead><tr>"
        + "".join(f"<th>{c}</th>" for c in cols)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
    return head + table


def remote_run_html(run: RemoteRun) -> str:
    """One block per rank: its value (repr), or its error's traceback, or how it died."""
    blocks = []
    for rank in run.ranks:
        if rank in run.dead:
            body = f"<span style='color:#c62828'>died: {escape(run.dead[rank])}</span>"
        elif rank in run.errors:
            body = f"<pre style='color:#c62828;margin:0'>{escape(run.errors[rank])}</pre>"
        elif run.values.get(rank) is not None:
            body = f"<pre style='margin:0'>{escape(_repr(run.values[rank]))}</pre>"
        else:
            continue
        blocks.append(
            f"<div style='display:flex;gap:.5em'><b style='white-space:nowrap'>[rank {rank}]</b>{body}</div>"
        )
    return "<div class='nbt-remote'>" + "".join(blocks) + "</div>" if blocks else escape(run._text())


def _repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 2000 else text[:2000] + "…"


def sweep_figure(table: Any, *, title: str = "ZeRO configurations") -> Any:
    """Grouped bars per configuration: step time and exposed communication (ms), and peak memory (MB).

    ``table`` is a ZeroSweep table with columns config, step_time_ms, exposed_comm_ms, peak_mb.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    labels = [str(c) for c in table["config"]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per step (ms)", "peak memory per rank (MB)"))
    fig.add_trace(go.Bar(name="step time", x=labels, y=table["step_time_ms"], marker_color="#1565c0"), 1, 1)
    if "exposed_comm_ms" in table and table["exposed_comm_ms"].notna().any():
        fig.add_trace(
            go.Bar(
                name="exposed communication", x=labels, y=table["exposed_comm_ms"], marker_color="#ef6c00"
            ),
            1,
            1,
        )
    fig.add_trace(go.Bar(name="peak memory", x=labels, y=table["peak_mb"], marker_color="#2e7d32"), 1, 2)
    fig.update_layout(title=title, barmode="group", height=380, margin={"t": 60, "b": 120})
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="MB", row=1, col=2)
    return fig
