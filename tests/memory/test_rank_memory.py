"""RankMemory: memory timelines of several ranks side by side (hand-made events, no cluster)."""

from __future__ import annotations

import pandas as pd
import pytest

import nbtoolkit as nbt
from nbtoolkit.memory.rank_memory import RankMemory
from nbtoolkit.memory.timeline import MemoryTimeline, normalize_events

_COLUMNS = ["time_us", "action", "delta_bytes", "category", "tensor", "module", "phase"]


def _timeline(activation_bytes: int, *, device: str = "cpu") -> MemoryTimeline:
    rows = [
        (0.0, "preexisting", 1000, "parameter", 0, "lin", "before"),
        (1.0, "alloc", activation_bytes, "activation", 1, "<b>lin</b>", "forward"),
        (2.0, "alloc", 500, "gradient", 2, "lin", "backward"),
        (3.0, "free", -activation_bytes, "activation", 1, "<b>lin</b>", "backward"),
    ]
    return MemoryTimeline(events=normalize_events(pd.DataFrame(rows, columns=_COLUMNS)), device=device)


def test_a_sequence_in_rank_order_with_a_peak_row_per_rank() -> None:
    result = RankMemory(timelines={1: _timeline(4000), 0: _timeline(1000)})
    assert len(result) == 2 and result.ranks == [0, 1]
    assert result[0] is result.timeline(0) and list(result)[1] is result.timeline(1)
    table = result.peaks()
    assert list(table["rank"]) == [0, 1]
    assert list(table["peak_bytes"]) == [2500, 5500]
    assert list(table["activation"]) == [1000, 4000] and list(table["gradient"]) == [500, 500]
    assert result.imbalance() == pytest.approx(5500 / 2500)
    assert result.reading().startswith("rank 1 peaks highest at 5.37 KiB, 2.20x the lowest")
    assert result.reading().endswith("mostly activation")
    with pytest.raises(KeyError, match="ranks here: \\[0, 1\\]"):
        result.timeline(5)


def test_even_peaks_are_called_even() -> None:
    result = RankMemory(timelines={0: _timeline(1000), 1: _timeline(1050)})
    assert result.reading().startswith("peaks are even across 2 ranks (within 2%)")


def test_display_figure_and_public_name() -> None:
    result = RankMemory(timelines={0: _timeline(1000), 1: _timeline(3000)})
    text = repr(result)
    assert text.splitlines()[0] == "RankMemory: 2 ranks on cpu"
    assert "activation at peak" in text
    html = result._repr_html_()
    assert "<b>lin</b>" not in html and "RankMemory" in html
    figure = result.figure()
    names = [trace.name for trace in figure.data]
    assert names[:2] == ["rank 0", "rank 1"]  # one total line per rank
    assert {"parameter", "activation", "gradient"} <= set(names[2:])  # stacked bars by category
    assert nbt.RankMemory is RankMemory
