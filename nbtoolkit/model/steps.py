"""``ProfilerStep#N``: the label torch.profiler (and ``nbt.profile``) puts around each step.

The one place that knows the label's form. The trace reader validates labels with it,
``Trace.steps`` and the analyses find steps with it, and the capture code writes labels
with :func:`profiler_step_label`, so a label written is a label read.

A name *is* a step label when it starts with ``ProfilerStep`` (a name that merely contains
the word, e.g. a user annotation ``"my ProfilerStep helper"``, is not). A step label that
is not exactly ``ProfilerStep#N`` (N a non-negative integer) is a TraceError: such a trace
was edited or written by a tool we do not know, and its step numbers cannot be trusted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from nbtoolkit.errors import TraceError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "PROFILER_STEP_PREFIX",
    "host_steps",
    "is_profiler_step_label",
    "parse_profiler_step",
    "profiler_step_label",
    "step_labels",
    "steps_table",
]

PROFILER_STEP_PREFIX = "ProfilerStep"
_STEP_RE = re.compile(r"ProfilerStep#(\d+)")  # used with fullmatch: nothing before or after


def profiler_step_label(step: int) -> str:
    """The label of step ``step``, as torch.profiler writes it (``ProfilerStep#3``)."""
    return f"{PROFILER_STEP_PREFIX}#{step}"


def is_profiler_step_label(name: str) -> bool:
    """Whether ``name`` is a ProfilerStep label (well formed or not): it starts with ``ProfilerStep``."""
    return name.startswith(PROFILER_STEP_PREFIX)


def parse_profiler_step(name: str, *, source: str = "") -> int:
    """The step number of a ``ProfilerStep#N`` label; a TraceError for any other name.

    ``source`` (a file name) starts the error message when given.
    """
    match = _STEP_RE.fullmatch(name)
    if match is None:
        where = f"{source}: " if source else ""
        raise TraceError(
            f"{where}ProfilerStep label {name!r} is not of the form 'ProfilerStep#N' (N an integer); "
            "the trace was edited or written by an unknown tool"
        )
    return int(match.group(1))


def step_labels(names: Iterable[object], *, source: str = "") -> dict[str, int]:
    """Step number by label, for the step labels among ``names`` (e.g. a categorical's categories).

    Every name that starts with ``ProfilerStep`` must be a well-formed label (else a TraceError
    naming ``source``); other names are ignored.
    """
    out: dict[str, int] = {}
    for name in names:
        text = str(name)
        if is_profiler_step_label(text):
            out[text] = parse_profiler_step(text, source=source)
    return out


def host_steps(rank: int, frame: pd.DataFrame, *, source: str = "") -> pd.DataFrame:
    """One row per ProfilerStep annotation on the host in one rank's events: rank, step, ts, dur.

    Device copies of the annotation (``gpu_user_annotation`` on a stream) are left out: the
    host annotation is the step. Labels are parsed once per distinct name, not per row.
    """
    import numpy as np
    import pandas as pd

    names = frame["name"]
    distinct = names.cat.categories if hasattr(names, "cat") else pd.Index(names.unique())
    numbers = step_labels(distinct, source=source)
    if not numbers:
        return empty_steps()
    host = frame[names.isin(list(numbers)).to_numpy() & (frame["stream"].to_numpy() < 0)]
    steps = np.fromiter((numbers[str(n)] for n in host["name"]), dtype=np.int64, count=len(host))
    return pd.DataFrame(
        {"rank": rank, "step": steps, "ts": host["ts"].to_numpy(), "dur": host["dur"].to_numpy()}
    )


def steps_table(parts: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """The ``Trace.steps`` table from per-rank :func:`host_steps`: sorted, one row per (rank, step)."""
    import pandas as pd

    frames = [p for p in parts if len(p)]
    if not frames:
        return empty_steps()
    table = pd.concat(frames, ignore_index=True)
    # A step can be annotated twice on the host (nested record functions); keep the longest.
    table = table.sort_values(["rank", "step", "dur"]).drop_duplicates(["rank", "step"], keep="last")
    return table.reset_index(drop=True)


def empty_steps() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        {
            "rank": pd.Series(dtype="int64"),
            "step": pd.Series(dtype="int64"),
            "ts": pd.Series(dtype="float64"),
            "dur": pd.Series(dtype="float64"),
        }
    )
