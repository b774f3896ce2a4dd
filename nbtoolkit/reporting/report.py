"""Self-contained HTML reports of results, for sharing in a review or a ticket.

A report is one HTML file with no external references: styles inline, plotly.js
inlined once, every result's HTML view and figures in sections. It opens from disk
or an attachment without a server or network.

Which figures a result contributes: a result may define ``_report_figures()``
returning plotly figures; plotly figures can also be passed directly.
"""

from __future__ import annotations

import datetime as _dt
import html as _html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.result import Result, escape

__all__ = ["ReportFile", "collect_results", "report"]

_STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 2rem auto;
       max-width: 1200px; color: #1f2328; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .3rem; margin-top: 2rem; }
.meta { color: #57606a; font-size: .9rem; }
table { border-collapse: collapse; font-size: .85rem; margin: .5rem 0; }
th, td { border: 1px solid #d0d7de; padding: .25rem .5rem; }
th { background: #f6f8fa; }
pre { background: #f6f8fa; padding: .6rem; overflow-x: auto; font-size: .8rem; }
nav a { margin-right: 1rem; }
"""


@dataclass(frozen=True)
class ReportFile(Result):
    """A written report: where it is, how big, what it holds."""

    path: Path
    size_bytes: int
    sections: tuple[str, ...]

    def _text(self) -> str:
        names = ", ".join(self.sections) or "nothing"
        return f"Report {self.path} ({self.size_bytes / 1e6:.2f} MB, {len(self.sections)} sections: {names})"

    def _html(self) -> str:
        items = "".join(f"<li>{escape(s)}</li>" for s in self.sections)
        return (
            f"<p>Report written to <code>{escape(self.path)}</code> "
            f"({self.size_bytes / 1e6:.2f} MB). Sections:</p><ul>{items}</ul>"
        )


def _section_html(obj: Any) -> str:
    """The richest static HTML an object offers, else its text in a <pre>."""
    if isinstance(obj, str):  # a note the user adds between results
        return f"<p>{escape(obj)}</p>"
    bundle: Mapping[str, Any] | None = None
    if hasattr(obj, "_repr_mimebundle_"):
        try:
            bundle = obj._repr_mimebundle_()
        except TypeError:  # some objects require include/exclude arguments
            bundle = obj._repr_mimebundle_(include=None, exclude=None)
        if isinstance(bundle, tuple):  # (data, metadata) form
            bundle = bundle[0]
    if bundle and "text/html" in bundle:
        return str(bundle["text/html"])
    if hasattr(obj, "_repr_html_"):
        rich = obj._repr_html_()
        if rich:
            return str(rich)
    if bundle and "text/plain" in bundle:
        return f"<pre>{escape(bundle['text/plain'])}</pre>"
    return f"<pre>{escape(repr(obj))}</pre>"


def _is_plotly_figure(obj: Any) -> bool:
    """A plotly figure, nbtoolkit's own (a StaticFigure, defined outside plotly) included."""
    return any(cls.__module__.startswith("plotly.") for cls in type(obj).__mro__) and hasattr(obj, "to_html")


def _figures_of(obj: Any) -> list[Any]:
    if _is_plotly_figure(obj):
        return [obj]
    maker = getattr(obj, "_report_figures", None)
    if maker is not None:
        return [fig for fig in maker() if _is_plotly_figure(fig)]
    return []


def _can_show(obj: Any) -> bool:
    """Whether a report section can show ``obj``: a result, a figure, text, or anything with a
    rich representation (a pandas frame, a Styler). A bare number has nothing to show."""
    return (
        isinstance(obj, (Result, str))
        or _is_plotly_figure(obj)
        or hasattr(obj, "_repr_html_")
        or hasattr(obj, "_repr_mimebundle_")
    )


def _normalize(items: Iterable[Any]) -> list[tuple[str, Any]]:
    named: list[tuple[str, Any]] = []
    for index, item in enumerate(items, start=1):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            heading, obj = item
        else:
            heading, obj = f"{type(item).__name__} {index}", item
        if not _can_show(obj):
            raise NbtUsageError(
                f"report() cannot show item {index}, a {type(obj).__name__} ({obj!r:.60}): pass result "
                "objects (Trace, Comparison ...), plotly figures, frames, text or (title, obj) pairs"
            )
        named.append((heading, obj))
    return named


def report(
    *results: Any,
    path: str | Path = "nbtoolkit-report.html",
    title: str = "nbtoolkit report",
) -> ReportFile:
    """Write a self-contained HTML report of ``results`` to ``path`` and return a ReportFile.

    Each result is a result object (Trace, GraphReport, MemoryTimeline, Comparison ...), a plotly
    figure, or a ``(heading, object)`` pair. Its HTML view becomes a section; its figures
    (``_report_figures()``) are embedded as interactive plotly charts. plotly.js is inlined
    once, so the file needs neither a server nor a network. All text is escaped.
    """
    if not results:
        raise NbtUsageError(
            "report() needs at least one result: pass result objects, figures or (title, obj) pairs"
        )
    from nbtoolkit.core.paths import os_problem, shown_path, user_path

    target = user_path(path)
    if target.suffix.lower() not in {".html", ".htm"}:
        raise NbtUsageError(
            f"a report is an HTML file: give a path ending in .html, not {shown_path(target)!r}"
        )
    if not target.parent.is_dir():
        raise NbtUsageError(
            f"cannot write {shown_path(target)}: folder {shown_path(target.parent)} does not exist; "
            "create it first"
        )

    sections = _normalize(results)
    plotly_included = False
    parts: list[str] = []
    for number, (heading, obj) in enumerate(sections, start=1):
        body = [] if _is_plotly_figure(obj) else [_section_html(obj)]
        for figure in _figures_of(obj):
            body.append(
                figure.to_html(full_html=False, include_plotlyjs=not plotly_included, default_height=420)
            )
            plotly_included = True
        parts.append(f"<section id='s{number}'><h2>{escape(heading)}</h2>{''.join(body)}</section>")

    nav = "".join(f"<a href='#s{i}'>{escape(h)}</a>" for i, (h, _) in enumerate(sections, start=1))
    stamp = _dt.datetime.now(tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    document = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1><p class='meta'>Written by nbtoolkit on {stamp}</p>"
        f"<nav>{nav}</nav>{''.join(parts)}</body></html>"
    )
    try:
        target.write_text(document, encoding="utf-8")
    except OSError as exc:
        raise NbtUsageError(os_problem(exc, target, "write the report to")) from None
    return ReportFile(path=target, size_bytes=target.stat().st_size, sections=tuple(h for h, _ in sections))


def collect_results(
    namespace: Mapping[str, Any], names: Iterable[str] | None = None
) -> list[tuple[str, Any]]:
    """Result objects of a notebook namespace, by variable name, in the order they were defined.

    With ``names``, exactly those variables (a missing one is a usage error). Without,
    every public variable holding an nbtoolkit result, plus ``_nbt`` (the last magic's result).
    """
    if names is not None:
        chosen = []
        for name in names:
            if name not in namespace:
                raise NbtUsageError(f"no variable named {name!r} in the notebook: check the spelling")
            chosen.append((name, namespace[name]))
        return chosen
    found = [
        (name, value)
        for name, value in namespace.items()
        if isinstance(value, Result) and (not name.startswith("_") or name == "_nbt")
    ]
    return found
