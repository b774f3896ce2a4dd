"""Graph breaks: de-duplicate, rank by measured cost, and say how to fix the common ones.

Pure functions over the ``breaks`` frame of a :class:`~nbtoolkit.compile.report.GraphReport`.

De-duplication (:func:`break_summary`): one row per distinct break, where a break is
identified by its type (torch's ``gb_type``, e.g. ``Unsupported Tensor.item() call with
capture_scalar_outputs=False``) and its user location (file and line). The same break hit
again (a recompile of the frame, a loop that calls the compiled function with new shapes,
each rank of a multi-rank log) adds to ``count``.

Cost ranking: rows are ordered by ``eager_us_per_step`` (descending), the host time per
step the captured run spent in eager code after the graph that this break ended and
before the next compiled graph started, summed over the break's occurrences (how it is
measured is written out in :mod:`nbtoolkit.compile.capture`). Breaks without a measurement
(read from logs) keep torch's order and are ranked by ``count``.

Fix hints (:func:`fix_hint`) cover the common break types; every hint names torch 2.13's
actual API. Unknown types fall back to torch's own first hint.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FIX_HINTS", "break_summary", "classify_break", "fix_hint"]

# (category, pattern searched in "gb_type + explanation", hint). First match wins.
FIX_HINTS: list[tuple[str, re.Pattern[str], str]] = [
    (
        "graph_break_call",
        re.compile(r"torch\._dynamo\.graph_break\(\)"),
        ("Remove the explicit torch._dynamo.graph_break() call: it splits the graph on purpose."),
    ),
    (
        "scalar",
        re.compile(r"Tensor\.item\(\)|capture_scalar_outputs|Data dependent operator|tolist\(\)"),
        (
            "Keep the value a tensor, or set torch._dynamo.config.capture_scalar_outputs = True so that "
            "Dynamo traces .item() into the graph as a symbolic scalar. The break comes from turning a "
            "tensor into a Python number (.item(), .tolist(), float(t)); .tolist() of float tensors "
            "still breaks."
        ),
    ),
    (
        "logging",
        re.compile(r"logging\.Logger|logging function|\bwarnings?\.warn"),
        (
            "Move the logging call out of the compiled step, or add the method to "
            "torch._dynamo.config.ignore_logging_functions (e.g. .add(logger.info)): Dynamo then drops "
            "the call inside compiled code."
        ),
    ),
    (
        "print",
        re.compile(r"`print`|builtin print|\bprint\b"),
        (
            "Move print() out of the compiled step, or run "
            "torch._dynamo.config.reorderable_logging_functions.add(print) so that Dynamo prints after "
            "the graph instead of breaking it."
        ),
    ),
    (
        "control_flow",
        re.compile(r"Data-dependent branching|generic_jump|dynamic control flow|data-dependent"),
        (
            "Replace the Python `if` on a tensor's value: torch.where(cond, a, b) (or apply the transform "
            "unconditionally), or torch.cond(pred, true_fn, false_fn, operands) for two real branches."
        ),
    ),
    (
        "numpy",
        re.compile(r"numpy|torch\._numpy"),
        (
            "A NumPy call Dynamo cannot trace: use the equivalent torch operation on tensors (Dynamo traces "
            "torch ops into the graph), or do the NumPy work outside the compiled step."
        ),
    ),
    (
        "disabled",
        re.compile(r"torch\.compiler\.disable|compiler\.disable\(\)|disable\(\)`?d function"),
        (
            "The called function is excluded with torch.compiler.disable: remove the decorator if the "
            "function is traceable, or call it outside the compiled step."
        ),
    ),
    (
        "unsupported_call",
        re.compile(r"marked as skipped|builtin|third-party|C/C\+\+|Unsupported function|unsupported"),
        (
            "Call it outside the compiled step. Dynamo does not trace this call (a builtin, a C extension "
            "or a skipped library); if it is PyTorch-traceable mark it with torch.compiler.allow_in_graph, "
            "otherwise wrap it as a custom op (torch.library.custom_op) that the graph can call."
        ),
    ),
]


def classify_break(gb_type: str, explanation: str = "") -> str:
    """The category of a break (``scalar``, ``print``, ``logging``, ``control_flow`` ...), else ``other``."""
    text = f"{gb_type}\n{explanation}"
    for category, pattern, _ in FIX_HINTS:
        if pattern.search(text):
            return category
    return "other"


def fix_hint(gb_type: str, explanation: str = "", torch_hints: str = "") -> str:
    """A short hint of what to change for this break, or torch's own first hint when none fits."""
    text = f"{gb_type}\n{explanation}"
    for _, pattern, hint in FIX_HINTS:
        if pattern.search(text):
            return hint
    first = next((h for h in (torch_hints or "").splitlines() if h.strip()), "")
    return first or "See the break's registry page for what Dynamo supports here."


def break_summary(breaks: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct break (type + user file + line), counted and ranked by cost.

    Columns: ``gb_type``, ``gb_id``, ``user_file``, ``user_line``, ``user_function``,
    ``source_line``, ``count`` (occurrences), ``compile_ids`` (where it happened, comma
    separated), ``eager_us_per_step`` (summed over occurrences; NaN when not measured),
    ``category`` and ``fix`` (see :func:`fix_hint`), ``explanation``, ``hints`` (torch's),
    ``doc_url``, ``source_context``. Order: ``eager_us_per_step`` descending (unmeasured
    last), then ``count`` descending, then first occurrence.
    """
    import pandas as pd

    columns = [
        "gb_type",
        "gb_id",
        "user_file",
        "user_line",
        "user_function",
        "source_line",
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
    if "eager_us_per_step" not in frame.columns:
        frame["eager_us_per_step"] = float("nan")
    frame["_order"] = range(len(frame))
    keys = ["gb_type", "user_file", "user_line"]
    # groupby drops NA keys unless told otherwise: an unknown location is still a location
    grouped = frame.groupby(keys, dropna=False, sort=False)
    rows = []
    for (gb_type, user_file, user_line), group in grouped:
        first = group.iloc[0]
        measured = group["eager_us_per_step"].dropna()
        rows.append(
            {
                "gb_type": gb_type,
                "gb_id": first["gb_id"],
                "user_file": user_file,
                "user_line": user_line,
                "user_function": first["user_function"],
                "source_line": first["source_line"],
                "count": len(group),
                "compile_ids": ", ".join(dict.fromkeys(str(c) for c in group["compile_id"])),
                "eager_us_per_step": float(measured.sum()) if len(measured) else float("nan"),
                "category": classify_break(str(gb_type), str(first["explanation"] or "")),
                "fix": fix_hint(str(gb_type), str(first["explanation"] or ""), str(first["hints"] or "")),
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
    return out[columns]
