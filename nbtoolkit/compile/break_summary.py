"""Graph breaks: de-duplicate, rank by measured cost, and say how to fix the common ones.

Pure functions over the ``breaks`` frame of a :class:`~nbtoolkit.compile.report.GraphReport`.

De-duplication (:func:`break_summary`): one row per distinct break, where a break is
identified by its type (torch's ``gb_type``, e.g. ``Unsupported Tensor.item() call with
capture_scalar_outputs=False``), its location (file and line: the innermost frame outside
torch) and, for a break inside a library, the user's line that called into it (see
:mod:`nbtoolkit.compile.frame_owner`). The same break hit again (a recompile of the frame, a
loop that calls the compiled function with new shapes, each rank of a multi-rank log) adds
to ``count``.

Cost ranking: rows are ordered by ``eager_us_per_step`` (descending), the host time per
step the captured run spent in eager code because of this break, summed over the break's
occurrences: the eager code between the graph the break ended and the next compiled graph,
less what runs eagerly with or without the break (the backward pass, compiling, torch's
optimizer ``zero_grad``); how it is measured is written out in
:mod:`nbtoolkit.compile.break_cost`. Breaks without a measurement (read from logs) keep
torch's order and are ranked by ``count``.

Fix hints (:mod:`nbtoolkit.compile.fix_hints`) cover the common break types, each checked to
remove its break; other types show torch's own first hint, marked as torch's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# the hints live in their own module; kept importable from here, where they were first
from nbtoolkit.compile.fix_hints import FIX_HINTS, classify_break, fix_hint

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FIX_HINTS", "break_summary", "classify_break", "fix_hint"]


def break_summary(breaks: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct break (type + place + the user's call site), counted and ranked by cost.

    Columns: ``gb_type``, ``gb_id``, ``user_file``, ``user_line``, ``user_function``,
    ``source_line``, ``call_file``, ``call_line``, ``call_source_line`` (the user's line that
    called into the library where the break is; empty when ``user_file`` is the user's own),
    ``inside_torch`` (where in torch's code the break was, when it was), ``count``
    (occurrences), ``compile_ids`` (where it happened, comma separated),
    ``eager_us_per_step`` (summed over occurrences; NaN when not measured), ``category``
    and ``fix`` (see :mod:`nbtoolkit.compile.fix_hints`), ``explanation``, ``hints``
    (torch's), ``doc_url``, ``source_context``. Order: ``eager_us_per_step`` descending
    (unmeasured last), then ``count`` descending, then first occurrence.
    """
    import pandas as pd

    columns = [
        "gb_type",
        "gb_id",
        "user_file",
        "user_line",
        "user_function",
        "source_line",
        "call_file",
        "call_line",
        "call_source_line",
        "inside_torch",
        "count",
        "compile_ids",
        "eager_us_per_step",
        "category",
        "fix",
        "explanation",
        "hints",
        "doc_url",
        "source_context",
    ]
    if breaks is None or breaks.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
    frame = breaks.copy()
    for column in (
        "eager_us_per_step",
        "call_file",
        "call_line",
        "call_source_line",
        "inside_torch",
        "reason",
    ):
        if column not in frame.columns:  # a frame made before these columns existed
            frame[column] = float("nan") if column == "eager_us_per_step" else None
    frame["_order"] = range(len(frame))
    keys = ["gb_type", "user_file", "user_line", "call_file", "call_line"]
    # groupby drops NA keys unless told otherwise: an unknown location is still a location
    grouped = frame.groupby(keys, dropna=False, sort=False)
    rows = []
    for (gb_type, user_file, user_line, call_file, call_line), group in grouped:
        first = group.iloc[0]
        measured = group["eager_us_per_step"].dropna()
        facts = {
            "reason": _text(first["reason"]),
            "user_file": _text(user_file),
            "source_line": _text(first["source_line"]),
            "inside_torch": _text(first["inside_torch"]),
        }
        explanation = _text(first["explanation"])
        rows.append(
            {
                "gb_type": gb_type,
                "gb_id": first["gb_id"],
                "user_file": user_file,
                "user_line": user_line,
                "user_function": first["user_function"],
                "source_line": first["source_line"],
                "call_file": call_file,
                "call_line": call_line,
                "call_source_line": first["call_source_line"],
                "inside_torch": first["inside_torch"],
                "count": len(group),
                "compile_ids": ", ".join(dict.fromkeys(str(c) for c in group["compile_id"])),
                "eager_us_per_step": float(measured.sum()) if len(measured) else float("nan"),
                "category": classify_break(str(gb_type), explanation, **facts),
                "fix": fix_hint(str(gb_type), explanation, _text(first["hints"]), **facts),
                "explanation": first["explanation"],
                "hints": first["hints"],
                "doc_url": first["doc_url"],
                "source_context": first["source_context"],
                "_order": int(group["_order"].min()),
                "_measured": len(measured) > 0,
            }
        )
    out = pd.DataFrame(rows)
    out["_cost"] = out["eager_us_per_step"].fillna(-1.0)
    out = out.sort_values(["_measured", "_cost", "count", "_order"], ascending=[False, False, False, True])
    out = out.drop(columns=["_order", "_measured", "_cost"]).reset_index(drop=True)
    out["user_line"] = out["user_line"].astype("Int64")
    out["call_line"] = out["call_line"].astype("Int64")
    return out[columns]


def _text(value: Any) -> str:
    """A frame's text cell as str ('' for None or NaN)."""
    return value if isinstance(value, str) else ""
