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

from nbtoolkit.core.errors import TraceError

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

__all__ = [
    "PROFILER_STEP_PREFIX",
    "host_steps",
    "is_profiler_step_label",
    "one_row_per_step",
    "parse_profiler_step",
    "profiler_step_label",
    "profiler_step_names",
    "step_labels",
    "step_number_table",
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
    where = f"{source}: " if source else ""
    if match is None:
        raise TraceError(
            f"{where}ProfilerStep label {name[:80]!r} is not of the form 'ProfilerStep#N' (N an integer); "
            "the trace was edited or written by an unknown tool"
        )
    digits = match.group(1)
    if len(digits.lstrip("0")) > 18:  # past int64 (torch's step counter is an int64)
        raise TraceError(
            f"{where}ProfilerStep label {name[:40]!r}... has a step number of {len(digits)} digits, "
            "which does not fit in 64 bits; the trace was edited or is corrupt"
        )
    return int(digits)


def profiler_step_names(names: Iterable[object]) -> list[str]:
    """The names among ``names`` that are ProfilerStep labels (well formed or not), unparsed."""
    # a pandas Index iterates ten times slower than its numpy array (this runs per rank at scale)
    values = names.to_numpy() if hasattr(names, "to_numpy") else names
    return [str(n) for n in values if is_profiler_step_label(str(n))]


def step_labels(names: Iterable[object], *, source: str = "") -> dict[str, int]:
    """Step number by label, for the step labels among ``names`` (e.g. a categorical's categories).

    Every name that starts with ``ProfilerStep`` must be a well-formed label (else a TraceError
    naming ``source``); other names are ignored.
    """
    return {text: parse_profiler_step(text, source=source) for text in profiler_step_names(names)}


def step_number_table(categories: pd.Index | np.ndarray, *, source: str = "") -> np.ndarray | None:
    """Step number per category code, plus a trailing -1 for code -1 (missing); None without step labels.

    Indexed by a categorical's codes it gives each row's step (-1: not a step annotation).
    ``categories``: a pandas Index or a numpy array of names (the lean summarizer's).
    """
    import numpy as np

    values = np.asarray(categories, dtype=object)
    numbers = step_labels(values, source=source)
    if not numbers:
        return None
    return np.array([numbers.get(str(c), -1) for c in values] + [-1], dtype=np.int64)


def host_steps(rank: int, frame: pd.DataFrame, *, source: str = "") -> pd.DataFrame:
    """One row per ProfilerStep annotation on the host in one rank's events: rank, step, ts, dur.

    Device copies of the annotation (``gpu_user_annotation`` on a stream) are left out: the
    host annotation is the step. Labels are parsed once per distinct name, not per row.
    """
    import numpy as np
    import pandas as pd

    names = frame["name"]
    if hasattr(names, "cat"):
        distinct, codes = names.cat.categories, names.cat.codes.to_numpy()
    else:
        codes, distinct = pd.factorize(names)
    step_of_code = step_number_table(distinct, source=source)
    if step_of_code is None:
        return empty_steps()
    # numpy on the codes, no frame of the rows: this runs once per rank file, hundreds of times at scale
    steps = step_of_code[codes]
    host = (steps >= 0) & (frame["stream"].to_numpy() < 0)
    return pd.DataFrame(
        {
            "rank": np.full(int(host.sum()), rank, dtype=np.int64),
            "step": steps[host],
            "ts": frame["ts"].to_numpy()[host],
            "dur": frame["dur"].to_numpy()[host],
        }
    )


def steps_table(parts: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """The ``Trace.steps`` table from per-rank :func:`host_steps`: sorted, one row per (rank, step)."""
    import numpy as np
    import pandas as pd

    frames = [p for p in parts if len(p)]
    if not frames:
        return empty_steps()
    columns = {c: np.concatenate([f[c].to_numpy() for f in frames]) for c in ("rank", "step", "ts", "dur")}
    chosen = one_row_per_step(columns["rank"], columns["step"], columns["dur"])
    return pd.DataFrame({c: values[chosen] for c, values in columns.items()})


def one_row_per_step(rank: np.ndarray, step: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Positions of the ``Trace.steps`` rows among host step annotations, sorted by (rank, step).

    A step can be annotated twice on the host (nested record functions); the longest is kept
    (the last of equal durations in the order given, as a stable sort by rank, step, dur would).
    """
    import numpy as np

    order = np.lexsort((dur, step, rank))
    rank, step = rank[order], step[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])
    return order[last]


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
