"""The top host operators and device kernels of event frames (``Trace.top_operators`` / ``top_kernels``).

Pure computation on the events frames of :mod:`nbtoolkit.trace.trace` (columns in its module
docstring): it takes the frames, not the Trace, so the Trace can call it from below the analyses.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from nbtoolkit.trace._intervals import self_times

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["top_kernels", "top_operators"]


def _top_by_name(
    rows: list[pd.DataFrame], n: int, rank_by: str, **aggregates: tuple[str, str]
) -> pd.DataFrame:
    """Events of several ranks grouped by name, the ``n`` highest by ``rank_by`` (ties by name)."""
    import pandas as pd

    if not rows:
        return pd.DataFrame(columns=["name", *aggregates])
    events = pd.concat(rows, ignore_index=True)
    events["name"] = events["name"].astype(str)
    table = events.groupby("name", sort=False).agg(**aggregates).reset_index()
    table = table.sort_values([rank_by, "name"], ascending=[False, True], kind="stable")
    return table.head(n).reset_index(drop=True)


def top_operators(frames: Iterable[pd.DataFrame], n: int = 10) -> pd.DataFrame:
    """Host operators (``cpu_op``) of event frames by self CPU time: name, calls, self_us, total_us."""
    rows = []
    for frame in frames:
        host = frame[frame["stream"].to_numpy() < 0]
        ops = host.assign(self_us=self_times(host))
        rows.append(ops.loc[ops["cat"] == "cpu_op", ["name", "dur", "self_us"]])
    return _top_by_name(
        rows, n, "self_us", calls=("dur", "size"), self_us=("self_us", "sum"), total_us=("dur", "sum")
    )


def top_kernels(frames: Iterable[pd.DataFrame], n: int = 10) -> pd.DataFrame:
    """GPU/accelerator kernels of the ranks' event frames by total time: name, calls, total_us, mean_us."""
    rows = [frame.loc[frame["stream"].to_numpy() >= 0, ["name", "dur"]] for frame in frames]
    return _top_by_name(
        rows, n, "total_us", calls=("dur", "size"), total_us=("dur", "sum"), mean_us=("dur", "mean")
    )
