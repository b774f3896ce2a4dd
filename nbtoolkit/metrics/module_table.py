"""The per-module FLOP table of a :class:`~nbtoolkit.metrics.step_metrics.StepMetrics`: which
modules to show and how, with inclusive and exclusive figures named apart.

Each op is billed once (:mod:`nbtoolkit.metrics.module_flops`), so the modules a table shows
side by side (one level: the model's direct parts) have disjoint inclusive counts, and their
shares of the step add up to at most 100%.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbtoolkit.core.result import escape, html_table
from nbtoolkit.core.units import format_flops

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["module_html", "module_lines", "top_level_modules", "top_modules"]


def _with_share(frame: pd.DataFrame, model_flops: int) -> pd.DataFrame:
    top = frame.sort_values(["model_flops", "module"], ascending=[False, True]).copy()
    top["model_pct"] = 100.0 * top["model_flops"] / model_flops
    top["self_model_pct"] = 100.0 * top["self_model_flops"] / model_flops
    return top.reset_index(drop=True)


def top_modules(by_module: pd.DataFrame, model_flops: int, n: int = 8, *,
                depth: int | None = None) -> pd.DataFrame:
    """The ``n`` modules with the most (inclusive) model FLOPs, optionally at one ``depth``."""
    frame = by_module if depth is None else by_module[by_module["depth"] == depth]
    return _with_share(frame, model_flops).head(n).reset_index(drop=True)


def top_level_modules(by_module: pd.DataFrame, model_flops: int) -> pd.DataFrame:
    """The model's direct parts: modules called by a root module (``GPT.blocks.0`` and
    ``GPT.head`` under ``GPT``; a ModuleList between them runs no code, so it calls nothing),
    by inclusive model FLOPs. Only roots ran: the roots."""
    roots = set(by_module.loc[by_module["parent"] == "", "module"])
    top = by_module[by_module["parent"].isin(roots)]
    if top.empty:
        top = by_module[by_module["parent"] == ""]
    return _with_share(top, model_flops)


def module_lines(by_module: pd.DataFrame, model_flops: int, *, rows: int = 8) -> list[str]:
    """The text table: module, inclusive FLOPs and share, own (exclusive) FLOPs, recomputed."""
    top = top_level_modules(by_module, model_flops).head(rows)
    if top.empty:
        return []
    lines = ["  modules by model FLOPs (incl. = with the modules each calls; self = its own ops):"]
    width = max(len(str(m)) for m in top["module"])
    for row in top.itertuples(index=False):
        recompute = f", recomputed {format_flops(row.recompute_flops)}" if row.recompute_flops else ""
        lines.append(
            f"    {row.module!s:<{width}}  incl. {format_flops(row.model_flops):>14} {row.model_pct:5.1f}%"
            f"  self {format_flops(row.self_model_flops):>14}{recompute}"
        )
    return lines


def module_html(by_module: pd.DataFrame, model_flops: int, *, rows: int = 12) -> str:
    """The HTML table, same columns as :func:`module_lines`."""
    import pandas as pd

    top = top_level_modules(by_module, model_flops).head(rows)
    if top.empty:
        return ""
    shown = pd.DataFrame({
        "module": top["module"],
        "model FLOPs incl. callees": [format_flops(v) for v in top["model_flops"]],
        "share of the step, incl. (%)": top["model_pct"].astype(float),
        "self model FLOPs (own ops)": [format_flops(v) for v in top["self_model_flops"]],
        "recomputed FLOPs": [format_flops(v) for v in top["recompute_flops"]],
    })
    caption = escape("modules by model FLOPs (incl. = with the modules each calls; self = its own ops):")
    return f"<p>{caption}</p>" + html_table(shown, max_rows=rows)
