"""The ZeRO and FSDP2 recompute results without a budget (the range a budget can take), and their figures.

The per-rank rows are the shape ``plan_rows`` builds from every rank's result; the peaks are made up
here (the cluster tests measure real ones), so what is checked is the reading, not a measurement.
"""

from __future__ import annotations

import pandas as pd

from nbtoolkit.integrations.deepspeed.recompute import ZeroRecompute
from nbtoolkit.integrations.fsdp2.recompute import Fsdp2Recompute
from nbtoolkit.integrations.recompute_table import PLAN_COLUMNS, RANK_COLUMNS, no_budget_lines


def _ranks(key: str, values: list[object]) -> pd.DataFrame:
    rows = []
    for i, value in enumerate(values):
        for rank in (0, 1):
            none, every = (40 + 10 * i + rank) * 2**20, (20 + 10 * i + rank) * 2**20
            rows.append({key: value, "rank": rank, "fixed_bytes": 0, "parameter": 0, "optimizer_state": 0,
                         "peak_none_bytes": none, "peak_all_bytes": every})  # fmt: skip
    return pd.DataFrame(rows, columns=[key, *RANK_COLUMNS])


def test_no_budget_names_the_largest_ranks_peaks_with_nothing_and_everything_recomputed() -> None:
    empty = pd.DataFrame(columns=["stage", *PLAN_COLUMNS])
    result = ZeroRecompute(table=empty, ranks=_ranks("stage", [1, 3]))
    text = repr(result)
    assert "stage 1: no budget given; the largest rank peaks at 41.00 MiB recomputing nothing" in text
    assert "and 21.00 MiB recomputing every block" in text
    assert "stage 3: no budget given; the largest rank peaks at 51.00 MiB" in text
    assert "pass budget= between them" in result._repr_html_()
    assert "Empty DataFrame" not in text  # no empty table shown


def test_fsdp2_no_budget_lines_escape_the_config_label_in_html() -> None:
    empty = pd.DataFrame(columns=["config", *PLAN_COLUMNS])
    result = Fsdp2Recompute(table=empty, ranks=_ranks("config", ["<b>reshard</b>"]))
    assert "&lt;b&gt;reshard&lt;/b&gt;: no budget given" in result._repr_html_()
    assert "<b>reshard</b>: no budget given" in repr(result)


def test_a_table_with_plans_has_no_budget_lines() -> None:
    table = pd.DataFrame([{"stage": 1, **dict.fromkeys(PLAN_COLUMNS, 0)}])
    assert no_budget_lines(table, _ranks("stage", [1]), "stage") == []


def test_the_fsdp2_figure_has_a_line_per_config_and_the_budget_diagonal() -> None:
    rows = [
        {"config": config, **dict.fromkeys(PLAN_COLUMNS, 0), "budget_bytes": budget * 2**20, "error": "",
         "blocks": "layers.0" if budget < 40 else "", "n_blocks": int(budget < 40),
         "measured_peak_bytes": (budget - 2) * 2**20}
        for config in ("<i>reshard</i>", "no reshard") for budget in (30, 45)
    ]  # fmt: skip
    ranks = _ranks("config", ["<i>reshard</i>", "no reshard"])
    result = Fsdp2Recompute(table=pd.DataFrame(rows), ranks=ranks)
    fig = result.figure()
    names = [trace.name for trace in fig.data]
    assert names == ["&lt;i&gt;reshard&lt;/i&gt;", "&lt;i&gt;reshard&lt;/i&gt; peak", "no reshard",
                     "no reshard peak", "budget"]  # fmt: skip
    assert list(fig.data[0].y) == [1, 0]  # one block recomputed at the lower budget
    assert list(fig.data[-1].x) == [30.0, 45.0]
    assert "FSDP2" in fig.layout.title.text
