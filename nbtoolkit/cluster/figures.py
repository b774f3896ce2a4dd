"""Views of the cluster: the ZeRO sweep chart.

The status table and per-rank cell results are HTML of the model objects themselves
(:mod:`nbtoolkit.cluster.state`); ``status_html`` and ``remote_run_html`` stay here for old
callers. Plotly is imported inside the functions that build figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbtoolkit.cluster.state import ClusterStatus, RemoteRun

__all__ = ["remote_run_html", "status_html", "sweep_figure"]


def status_html(status: ClusterStatus) -> str:
    """The status as a header line and a table with one coloured row per rank.

    Kept for old callers: the HTML is the status's own (``ClusterStatus._html``, in the model).
    """
    return status._html()


def remote_run_html(run: RemoteRun) -> str:
    """One block per rank: its value, its error's traceback, or how it died.

    Kept for old callers: the HTML is the run's own (``RemoteRun._html``, in the model).
    """
    return run._html()


def sweep_figure(table: Any, *, title: str = "ZeRO configurations") -> Any:
    """Grouped bars per configuration: step time and exposed communication (ms), and peak memory (MB).

    ``table`` is a ZeroSweep table with columns config, step_time_ms, exposed_comm_ms, peak_mb.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from nbtoolkit.core.static_figure import StaticFigure

    labels = [str(c) for c in table["config"]]
    titles = ("time per step (ms)", "peak memory per rank (MB)")
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, figure=StaticFigure())
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
