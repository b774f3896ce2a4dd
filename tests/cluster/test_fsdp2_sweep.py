"""FSDP2 sweeps and recompute plans on a 2-rank local cluster (the sweep of its knobs, plans under a budget).

Real ranks, a real gloo group, real ``fully_shard``: every number is measured on the ranks.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster._sharded_models import gpt_batch as _gpt_batch
from tests.cluster._sharded_models import gpt_loss as _gpt_loss
from tests.cluster._sharded_models import tiny_gpt as _gpt

pytestmark = [pytest.mark.slow]


def _stack():  # built on each rank: four repeated 1 MB blocks; parameters dominate the memory
    import torch

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU()) for _ in range(4)
            )
            self.head = torch.nn.Linear(512, 512)

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return Stack()


def _stack_batch(rank: int):
    import torch

    g = torch.Generator().manual_seed(rank)
    return torch.randn(8, 512, generator=g), torch.randn(8, 512, generator=g)


def test_fsdp2_sweep_measures_each_configuration_on_every_rank(cluster: Any) -> None:
    from nbtoolkit.core.static_figure import StaticFigure, static_html
    from nbtoolkit.integrations.fsdp2.sweep import fsdp2_sweep
    from nbtoolkit.integrations.fsdp2.wrap import ShardSettings

    sweep = fsdp2_sweep(
        cluster, _stack, _stack_batch, steps=3, warmup=1,
        settings=[
            ShardSettings(),
            ShardSettings(reshard_after_forward=False),
            {"forward_prefetch": 2, "backward_prefetch": 2},
            ShardSettings(param_dtype="bf16", reduce_dtype="bf16"),
        ],
    )  # fmt: skip
    table = sweep.table
    print(sweep)
    assert list(table["config"]) == [
        "reshard", "no reshard", "reshard, fwd-prefetch 2, bwd-prefetch 2",
        "reshard, bf16 params, bf16 reduce",
    ]
    assert (table["step_time_ms"] > 0).all() and (table["peak_mb"] > 0).all()
    assert (table["comm_ms"] > 0).all(), "gloo collectives should be found in every trace"
    assert all(len(p) == 2 and min(p) > 0 for p in table["peak_mb_per_rank"])
    assert table["peak_mb"].tolist() == [max(p) for p in table["peak_mb_per_rank"]]
    reshard, kept = table.iloc[0], table.iloc[1]
    # Without resharding, backward needs no second all-gather of each block's parameters ...
    assert kept["collectives_per_step"] < reshard["collectives_per_step"], table.to_string()
    # ... and the gathered blocks stay alive from forward to backward.
    assert kept["peak_mb"] > reshard["peak_mb"], table.to_string()
    # Same seed, same data: fp32 configurations compute the same step; bf16 a close one.
    assert table["loss"].iloc[1] == pytest.approx(reshard["loss"], rel=1e-5)
    assert table["loss"].iloc[2] == pytest.approx(reshard["loss"], rel=1e-5)
    assert table["loss"].iloc[3] == pytest.approx(reshard["loss"], rel=5e-2)
    assert set(sweep.traces) == set(table["config"]) and all(t.ranks == [0, 1] for t in sweep.traces.values())
    assert sweep.drift is not None and sweep.noise >= max(0.10, sweep.drift)
    reading = sweep.reading()
    assert reading.startswith("baseline reshard:")
    assert "reshard_after_forward=False against reshard: costs +" in reading
    assert "fastest" in reading and "least memory: " in reading
    assert "FSDP2 sweep: 4 configurations" in repr(sweep)
    fig = sweep.figure()
    assert {t.name for t in fig.data} >= {"step time", "peak memory"}
    assert isinstance(fig, StaticFigure) and "<svg" in static_html(fig)  # exported notebooks keep a picture
    assert cluster.run("dist.get_world_size()") == [2, 2]  # the group survives FSDP2


def test_fsdp2_sweep_names_the_knobs_on_a_wrong_one(cluster: Any) -> None:
    from nbtoolkit.core.errors import NbtUsageError
    from nbtoolkit.integrations.fsdp2.sweep import fsdp2_sweep

    with pytest.raises(NbtUsageError, match=r"unknown FSDP2 knob.*reshard_after_forward, forward_prefetch"):
        fsdp2_sweep(cluster, _stack, _stack_batch, grid={"reshard": [True, False]})
    with pytest.raises(NbtUsageError, match=r"param_dtype='int8'.*use one of"):
        fsdp2_sweep(cluster, _stack, _stack_batch, settings=[{"param_dtype": "int8"}])
    with pytest.raises(NbtUsageError, match="settings or grid, not both"):
        fsdp2_sweep(cluster, _stack, _stack_batch, settings=[{}], grid={"forward_prefetch": [0, 1]})


def test_fsdp2_recompute_plan_keeps_every_rank_under_the_budget(cluster: Any) -> None:
    import nbtoolkit as nbt

    reference = nbt.plan_recompute_on(cluster, _gpt, _gpt_batch, strategy="fsdp2", loss_fn=_gpt_loss, steps=1)
    ranks = reference.ranks
    assert list(reference.blocks) == ["blocks.0", "blocks.1", "blocks.2"]
    assert reference.table.empty and set(ranks["rank"]) == {0, 1}  # no budget: measured only
    assert (ranks["fixed_bytes"] > 0).all(), ranks.to_string()  # parameter and AdamW shards count
    lowest, highest = int(ranks["peak_all_bytes"].max()), int(ranks["peak_none_bytes"].max())
    assert lowest < highest, ranks.to_string()  # checkpointing every block saves memory on each rank
    budget = lowest + (highest - lowest) * 3 // 4  # room to choose; not met by doing nothing

    result = nbt.plan_recompute_on(
        cluster, _gpt, _gpt_batch, strategy="fsdp2", budget=budget, loss_fn=_gpt_loss, steps=1
    )
    row, now = result.table.iloc[0], result.ranks
    print(result)
    shown = f"{result.table.to_string()}\n{now.to_string()}"
    assert row["config"] == "reshard" and row["budget_bytes"] == budget
    if now["peak_all_bytes"].max() <= budget:  # this run's own measurement of the floor
        assert bool(row["fits"]) and row["measured_peak_bytes"] <= budget, shown  # every rank fits
        if now["peak_none_bytes"].max() > budget:
            assert row["n_blocks"] >= 1, shown
    else:
        assert not row["fits"] and (row["error"] or "no measured plan fits" in row["notes"]), shown
    assert "FSDP2 recompute plans" in repr(result)
    assert cluster.run("dist.get_world_size()") == [2, 2]


def test_plan_recompute_on_names_the_choices_for_a_wrong_strategy_or_model(cluster: Any) -> None:
    import torch

    import nbtoolkit as nbt

    unknown = r"unknown recompute strategy 'fsdp'.*'fsdp2'.*'zero1'.*'zero3'"
    with pytest.raises(nbt.NbtUsageError, match=unknown):
        nbt.plan_recompute_on(cluster, _gpt, _gpt_batch, strategy="fsdp", budget="30MB")
    built = torch.nn.Sequential(torch.nn.Linear(4, 4))
    unwrapped = (r"'fsdp2' got a Sequential built in the notebook, which is not wrapped by FSDP2.*"
                 r"pass a function that builds the model on each rank")
    with pytest.raises(nbt.NbtUsageError, match=unwrapped):
        nbt.plan_recompute_on(cluster, built, _gpt_batch, strategy="fsdp2", budget="30MB")
    with pytest.raises(nbt.NbtUsageError, match=r"strategy='zero2' got a Sequential.*pass a function"):
        nbt.plan_recompute_on(cluster, built, _gpt_batch, strategy="zero2", budget="30MB")
    with pytest.raises(nbt.NbtUsageError, match=r"\['knobs'\] do not apply to strategy='fsdp2'.*settings"):
        nbt.plan_recompute_on(cluster, _gpt, _gpt_batch, strategy="fsdp2", knobs={})


def test_fsdp2_reading_names_a_gain_only_outside_the_noise() -> None:
    import pandas as pd

    from nbtoolkit.integrations.fsdp2.sweep import read_fsdp2_sweep

    def table(kept_ms: float) -> pd.DataFrame:
        common = {"forward_prefetch": 0, "backward_prefetch": 0, "param_dtype": None, "reduce_dtype": None,
                  "comm_ms": 4.0, "exposed_comm_ms": 2.0, "overlap_pct": 50.0, "step_time_spread_ms": 0.0}
        return pd.DataFrame([
            {"config": "reshard", "reshard_after_forward": True, "step_time_ms": 10.0, "peak_mb": 4.0,
             "collectives_per_step": 15.0, **common},
            {"config": "no reshard", "reshard_after_forward": False, "step_time_ms": kept_ms, "peak_mb": 5.0,
             "collectives_per_step": 10.0, **common},
        ])  # fmt: skip

    close = read_fsdp2_sweep(table(10.5), noise=0.10)
    assert "no configuration is clearly fastest" in close
    assert "costs +1.0 MB peak per rank (4.0 -> 5.0 MB) and its step time is within the ±10% noise" in close
    apart = read_fsdp2_sweep(table(5.0), noise=0.10)
    assert "fastest: no reshard (5.0 ms per step), clearly ahead of the next, reshard (10.0 ms)" in apart
    assert "gains 5.0 ms per step; collective calls per step 15 -> 10" in apart
    assert "least memory: reshard (4.0 MB" in apart


def test_fsdp2_sweep_asks_for_a_function_when_given_a_built_model(cluster: Any) -> None:
    import torch

    from nbtoolkit.core.errors import NbtUsageError
    from nbtoolkit.integrations.fsdp2.sweep import fsdp2_sweep

    with pytest.raises(NbtUsageError, match=r"not wrapped by FSDP2.*pass a function that builds the model"):
        fsdp2_sweep(cluster, torch.nn.Linear(4, 4), _stack_batch)
