"""Views of a GraphReport: the graph-break explorer widget, FX code views, the compile-time chart.

Every piece of text that comes from user code or logs (source lines, reasons, FX code,
function and file names) goes through :func:`~nbtoolkit.core.result.escape` before it
is put into HTML, and into plotly hover text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from nbtoolkit.core.result import escape, html_table

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "break_detail_html",
    "compile_time_chart",
    "explorer_static_html",
    "fx_code_html",
    "graph_break_explorer",
    "graph_code_view",
]


class GraphReport(Protocol):
    """What these views read of a :class:`nbtoolkit.compile.report.GraphReport`.

    Named here rather than imported: the report's methods import these views, and a view
    importing the report back (even for annotations) would close an import cycle.
    """

    graphs: pd.DataFrame
    compiles: pd.DataFrame
    ranks: list[int]

    @property
    def compile_time_s(self) -> float: ...

    def break_summary(self) -> pd.DataFrame: ...

    def _html(self) -> str: ...


_STATUS_COLORS = {"ok": "#2e7d32", "break": "#9ccc65", "empty": "#bdbdbd", "error": "#c62828"}


def fx_code_html(report: GraphReport, graph: int) -> str:
    """One graph's readable FX code (escaped), with its compile id, function and op count."""
    rows = report.graphs[report.graphs["graph"] == graph]
    if rows.empty:
        return f"<p>no graph number {escape(graph)} in this report</p>"
    row = rows.iloc[0]
    compile_time = row["compile_time_s"]
    timing = "" if _missing(compile_time) else f", compiled in {compile_time * 1e3:,.1f} ms"
    title = (
        f"graph {escape(graph)} [{escape(row['compile_id'])}] {escape(row['function'])} "
        f"({escape(row['op_count'])} ops{escape(timing)})"
    )
    return (
        f"<div><b>{title}</b><br><small>{escape(row['file'])}:{escape(row['line'])}</small>"
        f"<pre style='font-size:90%;max-height:30em;overflow:auto'>{escape(row['fx_code'])}</pre></div>"
    )


def _missing(value: Any) -> bool:
    import pandas as pd

    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):  # a list or other non-scalar is a value
        return False


def _graphs_around(report: GraphReport, compile_id: str) -> list[int]:
    """The graph the break ended (same frame compile) and the graph compiled right after it."""
    graphs = report.graphs
    frame = compile_id.split("_", maxsplit=1)[0]
    mine = graphs.index[graphs["compile_id"].str.split("_").str[0] == frame].tolist()
    if not mine:
        return []
    position = graphs.index.get_loc(mine[0])
    around = [int(graphs["graph"].iloc[position])]
    if position + 1 < len(graphs):
        around.append(int(graphs["graph"].iloc[position + 1]))
    return around


def break_detail_html(report: GraphReport, summary_row: pd.Series) -> str:
    """Everything about one distinct break: where, source context, reason, hints, fix, graphs around it."""
    cost = summary_row.get("eager_us_per_step")
    cost_text = "" if _missing(cost) else f" · {cost:,.0f} µs/step in eager code because of this break"
    link = summary_row.get("doc_url")
    link_html = (
        f" · <a href='{escape(link)}' target='_blank'>{escape(summary_row.get('gb_id') or 'registry')}</a>"
        if isinstance(link, str) and link.startswith("https://")
        else ""
    )
    parts = [
        f"<h4>{escape(summary_row['gb_type'])}</h4>",
        (
            f"<p>{escape(summary_row['user_file'])}:{escape(summary_row['user_line'])} "
            f"in {escape(summary_row.get('user_function'))} · {escape(summary_row['count'])}×"
            f"{escape(cost_text)}{link_html}</p>"
        ),
    ]
    call_file = summary_row.get("call_file")
    if isinstance(call_file, str) and call_file:  # a break inside a library: the user's line that led there
        code = summary_row.get("call_source_line")
        called = f"{call_file}:{summary_row.get('call_line')}" + (
            f": {code}" if isinstance(code, str) else ""
        )
        parts.append(f"<p>called from {escape(called)}</p>")
    inside = summary_row.get("inside_torch")
    if isinstance(inside, str) and inside:
        parts.append(f"<p>inside torch at {escape(inside)}</p>")
    context = summary_row.get("source_context")
    if isinstance(context, str) and context:
        parts.append(f"<pre style='background:#f6f6f6'>{escape(context)}</pre>")
    elif isinstance(summary_row.get("source_line"), str):
        parts.append(f"<pre style='background:#f6f6f6'>{escape(summary_row['source_line'])}</pre>")
    parts.append(f"<p><b>Fix:</b> {escape(summary_row['fix'])}</p>")
    if summary_row.get("explanation"):
        parts.append(f"<p><b>Explanation (torch):</b> {escape(summary_row['explanation'])}</p>")
    hints = [h for h in str(summary_row.get("hints") or "").splitlines() if h.strip()]
    if hints:
        parts.append(
            "<p><b>Hints (torch):</b></p><ul>" + "".join(f"<li>{escape(h)}</li>" for h in hints) + "</ul>"
        )
    first_compile = str(summary_row.get("compile_ids") or "").split(",")[0].strip()
    around = _graphs_around(report, first_compile) if first_compile else []
    for position, graph in enumerate(around):
        label = "graph before the break" if position == 0 else "graph after it (the resume function)"
        parts.append(f"<details><summary>{escape(label)}</summary>{fx_code_html(report, graph)}</details>")
    return "".join(parts)


def graph_break_explorer(report: GraphReport) -> Any:
    """An ipywidgets explorer: the ranked break table, a selector, and the selected break's details."""
    import ipywidgets as widgets

    from nbtoolkit.core.widget_static import static_vbox

    summary = report.break_summary()
    header = widgets.HTML(report._html())
    if summary.empty:
        no_breaks = [header, widgets.HTML("<p>No graph breaks.</p>")]
        return static_vbox(no_breaks, lambda: explorer_static_html(report))
    options = []
    for i, row in summary.iterrows():
        cost = row["eager_us_per_step"]
        cost_text = "" if _missing(cost) else f"  {cost:,.0f} µs/step"
        where = f"{_short(row['user_file'])}:{row['user_line']}"
        # widget option labels are plain text (not HTML), so no escaping is needed here
        options.append((f"{row['count']}× {row['gb_type'][:70]} @ {where}{cost_text}", i))
    select = widgets.Select(options=options, value=0, rows=min(8, len(options)), layout={"width": "100%"})
    detail = widgets.HTML(break_detail_html(report, summary.iloc[0]))

    def show(change: dict[str, Any]) -> None:
        detail.value = break_detail_html(report, summary.iloc[int(change["new"])])

    select.observe(show, names="value")
    box = static_vbox(
        [header, widgets.HTML("<b>Select a break:</b>"), select, detail],
        lambda: explorer_static_html(report, selected=int(select.value)),
    )
    box.nbt_select = select  # handles for tests and scripts
    box.nbt_detail = detail
    return box


_STATIC_BREAKS = 30  # breaks written out in the explorer's static form; the rest are counted


def explorer_static_html(report: GraphReport, *, selected: int = 0) -> str:
    """The explorer without a kernel: the report, then every break's details (the selected one open)."""
    summary = report.break_summary()
    if summary.empty:
        return f"<div class='nbt-explorer-static'>{report._html()}<p>No graph breaks.</p></div>"
    parts = [
        f"<div class='nbt-explorer-static'>{report._html()}<p><b>Graph breaks</b> (most costly first)</p>"
    ]
    for position, (_, row) in enumerate(summary.head(_STATIC_BREAKS).iterrows()):
        where = f"{_short(row['user_file'])}:{row['user_line']}"
        label = f"{row['count']}× {row['gb_type']} @ {where}"
        opened = " open" if position == selected else ""
        parts.append(
            f"<details{opened}><summary>{escape(label)}</summary>{break_detail_html(report, row)}</details>"
        )
    if len(summary) > _STATIC_BREAKS:
        parts.append(f"<p><i>{len(summary) - _STATIC_BREAKS} more breaks: see report.break_summary()</i></p>")
    return "".join(parts) + "</div>"


def graph_code_view(report: GraphReport) -> Any:
    """A dropdown of the report's graphs showing the selected graph's FX code."""
    import ipywidgets as widgets

    from nbtoolkit.core.widget_static import static_vbox

    if report.graphs.empty:
        return static_vbox([widgets.HTML("<p>No graphs.</p>")], lambda: "<p>No graphs.</p>")
    options = [
        (f"graph {int(r.graph)} [{r.compile_id}] {r.function} ({r.op_count} ops)", int(r.graph))
        for r in report.graphs.itertuples(index=False)
    ]
    dropdown = widgets.Dropdown(options=options, value=options[0][1], layout={"width": "100%"})
    code = widgets.HTML(fx_code_html(report, options[0][1]))

    def show(change: dict[str, Any]) -> None:
        code.value = fx_code_html(report, int(change["new"]))

    dropdown.observe(show, names="value")
    box = static_vbox([dropdown, code], lambda: _graphs_static_html(report, selected=int(dropdown.value)))
    box.nbt_dropdown = dropdown
    box.nbt_code = code
    return box


def compile_time_chart(report: GraphReport) -> Any:
    """Plotly bar chart: whole-frame compile time (ms) of each compile, coloured by tlparse's status."""
    import plotly.graph_objects as go

    from nbtoolkit.core.static_figure import StaticFigure

    compiles = report.compiles
    fig = StaticFigure()
    if compiles.empty:
        fig.update_layout(title="No compiles recorded")
        return fig
    labels = [
        f"r{r}:{c}" if len(report.ranks) > 1 and not _missing(r) else str(c)
        for r, c in zip(compiles["rank"], compiles["compile_id"], strict=True)
    ]
    for status, color in _STATUS_COLORS.items():
        mask = (compiles["status"] == status).tolist()
        if not any(mask):
            continue
        sub = compiles[mask]
        fig.add_trace(
            go.Bar(
                x=[lab for lab, m in zip(labels, mask, strict=True) if m],
                y=(sub["compile_time_s"].fillna(0) * 1e3).tolist(),
                name=status,
                marker_color=color,
                hovertext=[
                    f"{escape(f)} ({escape(_short(p))})"
                    for f, p in zip(sub["function"], sub["file"], strict=True)
                ],
                hovertemplate="%{x}: %{y:,.1f} ms<br>%{hovertext}<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(
        title=f"Compile time per compile · total {report.compile_time_s:,.2f} s",
        xaxis_title="compile id",
        yaxis_title="compile time (ms)",
        barmode="stack",
        height=360,
    )
    return fig


def _short(path: Any) -> str:
    text = str(path) if path is not None else "?"
    return text.rsplit("/", 1)[-1]


def summary_table_html(report: GraphReport) -> str:
    """The ranked break summary as an escaped HTML table."""
    summary = report.break_summary()
    cols = ["count", "gb_type", "user_line", "source_line", "eager_us_per_step", "fix"]
    return html_table(summary[cols]) if not summary.empty else "<p>No graph breaks.</p>"


def _graphs_static_html(report: GraphReport, *, selected: int) -> str:
    """The code view without a kernel: each graph's FX code folded, the selected graph's open."""
    parts = []
    for row in report.graphs.head(_STATIC_BREAKS).itertuples(index=False):
        graph = int(row.graph)
        opened = " open" if graph == selected else ""
        label = f"graph {graph} [{row.compile_id}] {row.function} ({row.op_count} ops)"
        parts.append(
            f"<details{opened}><summary>{escape(label)}</summary>{fx_code_html(report, graph)}</details>"
        )
    more = len(report.graphs) - _STATIC_BREAKS
    if more > 0:
        parts.append(f"<p><i>{more} more graphs: see report.graphs</i></p>")
    return "<div class='nbt-graphs-static'>" + "".join(parts) + "</div>"
