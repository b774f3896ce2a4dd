"""The display contract every result object follows.

A result shows well in three places: a notebook (HTML), a terminal or nbval
(plain text), and any front end that asks for a MIME bundle. Subclasses
implement ``_text()`` (always) and ``_html()`` (when they have a richer view);
this base turns them into IPython's display protocol. The plain text is always
in the bundle, as pyinstrument does, so that terminals, nbval and logs see text.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["Result", "escape", "html_table"]


def escape(text: object) -> str:
    """Escape any text that came from user code or trace files before it goes into HTML."""
    return html.escape(str(text), quote=True)


def html_table(frame: Any, *, max_rows: int = 20, float_format: str = "{:,.2f}") -> str:
    """Render a pandas DataFrame as an escaped HTML table (values and headers escaped).

    pandas' own ``to_html`` escapes too, but we keep one place that guarantees it and
    that formats numbers the same way everywhere.
    """
    shown = frame.head(max_rows)
    head = "".join(f"<th>{escape(c)}</th>" for c in shown.columns)
    rows = []
    for values in shown.itertuples(index=False, name=None):
        cells = []
        for v in values:
            if isinstance(v, float):
                cells.append(f"<td style='text-align:right'>{escape(float_format.format(v))}</td>")
            elif isinstance(v, int):
                cells.append(f"<td style='text-align:right'>{v:,}</td>")
            else:
                cells.append(f"<td>{escape(v)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    more = ""
    if len(frame) > max_rows:
        more = f"<p><i>{len(frame) - max_rows:,} more rows not shown</i></p>"
    return (
        "<table class='nbt-table'><thead><tr>" + head + "</tr></thead><tbody>"
        + "".join(rows) + "</tbody></table>" + more
    )


class Result:
    """Mixin giving a result object notebook, terminal and MIME-bundle displays."""

    def _text(self) -> str:
        """Plain-text summary; subclasses override. Must be deterministic for stable inputs."""
        return object.__repr__(self)

    def _html(self) -> str | None:
        """HTML summary, or None to show only text. All foreign text must go through escape()."""
        return None

    def __repr__(self) -> str:
        return self._text()

    def _repr_html_(self) -> str | None:
        return self._html()

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None
    ) -> dict[str, str]:
        bundle = {"text/plain": self._text()}
        rich = self._html()
        if rich is not None:
            bundle["text/html"] = rich
        return bundle
