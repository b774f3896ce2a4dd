"""nbt.fit without ranks: cards, the fake trace against a real step, the per-strategy memory model,
the table's rendering, the magic, and one clear error per bad input."""

from __future__ import annotations

import gc
import gzip
import json
from typing import Any

import pytest

from tests.capacity._fit_models import mlp_batch, mlp_stack


def test_unknown_card_is_one_error_listing_the_known_ones() -> None:
    import nbtoolkit as nbt
    from nbtoolkit.capacity.cards import known_cards

    with pytest.raises(nbt.NbtUsageError) as error:
        nbt.fit(mlp_stack, mlp_batch, "8xH900-1TB")
    message = str(error.value)
    assert "unknown card 'H900-1TB'" in message
    assert all(name in message for name in known_cards())


def test_devices_strings_and_custom_cards() -> None:
    from nbtoolkit.capacity.cards import CARDS, Card, parse_devices

    assert parse_devices("8xH100-80GB") == (8, CARDS["H100-80GB"])
    assert parse_devices("h100") == (1, CARDS["H100-80GB"])
    assert parse_devices("4 x A100-40GB")[1].memory_bytes == 40 * 2**30
    mine = Card(name="mine", memory_bytes=10 * 2**30, flops={"fp32": 1e12, "bf16": 4e12}, intra_node_Bps=1e9)
    assert parse_devices((3, mine)) == (3, mine)
    for card in CARDS.values():  # every card has its dense bf16 peak and a named source
        assert card.peak("bf16") > card.peak("fp32") > 0
        assert "datasheet" in card.source


def _real_step_growth(make_model: Any, micro_batch: int) -> int:
    """Peak bytes a real CPU step allocates beyond the model, AdamW state and batch, as the
    project's CPU measurement reads it (the profiler's allocation total during the step)."""
    import torch

    from nbtoolkit.cluster.rank_tools import profile_to_bytes

    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters())
    x, y = mlp_batch(micro_batch)

    def step() -> float:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    step()
    gc.collect()
    profiled = profile_to_bytes(step, steps=1, warmup=0, profile_memory=True)
    doc = json.loads(gzip.decompress(profiled["trace_gz"]))
    events = [e["args"] for e in doc["traceEvents"]
              if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    start = int(events[0]["Total Allocated"]) - int(events[0]["Bytes"])
    return max(int(e["Total Allocated"]) - start for e in events)


@pytest.mark.parametrize("recompute", ["none", "all"])
def test_fake_trace_matches_what_a_real_step_allocates(recompute: str) -> None:
    """The traced step's transient peak (activations, gradients, temporaries) is within 10% of what
    the same step allocates for real."""
    from nbtoolkit.capacity.recompute_blocks import apply_recompute, block_modules
    from nbtoolkit.capacity.tracing import trace_step

    trace = trace_step(mlp_stack, mlp_batch, micro_batch=1024, recompute=recompute,
                       amp=None, optimizer="adamw", loss_fn=None, blocks=None)
    traced = max(g + fb + o for _phase, g, fb, o in trace.transient_timeline())
    assert trace.parameter_count == sum(p.numel() for p in mlp_stack().parameters())
    assert trace.state_bytes("optimizer_state") >= 2 * trace.state_bytes("parameter")  # AdamW: two moments

    def checkpointed() -> Any:
        model = mlp_stack()
        apply_recompute(block_modules(model, None))
        return model

    real = _real_step_growth(mlp_stack if recompute == "none" else checkpointed, 1024)
    assert abs(traced - real) / real < 0.10, (traced, real)


def test_model_function_that_allocates_real_memory_is_named_by_line() -> None:
    import numpy as np

    import nbtoolkit as nbt

    def make_model() -> Any:
        import torch

        model = mlp_stack()
        model.table = torch.from_numpy(np.zeros((1024, 1024), dtype=np.float32))  # real: 4 MB
        return model

    with pytest.raises(nbt.NbtUsageError) as error:
        nbt.fit(make_model, mlp_batch, "1xH100", strategies="ddp", recompute="none", amp=None)
    assert f"{__file__}:" in str(error.value)
    line = int(str(error.value).split(f"{__file__}:")[1].split(":")[0])
    from pathlib import Path

    assert "from_numpy" in Path(__file__).read_text().splitlines()[line - 1]


def test_model_built_before_the_call_is_refused() -> None:
    import nbtoolkit as nbt

    built = mlp_stack()
    with pytest.raises(nbt.NbtUsageError, match="real tensor"):
        nbt.fit(lambda: built, mlp_batch, "1xH100", strategies="ddp", recompute="none", amp=None)


def test_strategy_the_model_cannot_run_and_unknown_strategy() -> None:
    import torch

    import nbtoolkit as nbt

    def single_layer() -> Any:
        return torch.nn.Sequential(torch.nn.Linear(64, 64))

    def batch(mb: int) -> Any:
        return torch.randn(mb, 64)

    with pytest.raises(nbt.NbtUsageError, match="no repeated blocks"):
        nbt.fit(single_layer, batch, "2xH100", strategies=("fsdp2",), recompute="none", amp=None)
    with pytest.raises(nbt.NbtUsageError, match="recompute='all'"):
        nbt.fit(single_layer, batch, "2xH100", strategies=("ddp",), recompute="all", amp=None)
    with pytest.raises(nbt.NbtUsageError, match="unknown strategy 'zero4'"):
        nbt.fit(single_layer, batch, "2xH100", strategies=("zero4",))


def test_single_layers_named_as_blocks_are_sharded_as_the_message_says() -> None:
    import torch

    import nbtoolkit as nbt

    def layers() -> Any:
        return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])

    def batch(mb: int) -> Any:
        return torch.randn(mb, 64)

    with pytest.raises(nbt.NbtUsageError, match=r"blocks=\['0', '1', \.\.\.\]"):
        nbt.fit(layers, batch, "2xH100", strategies=("fsdp2",), recompute="none", amp=None)
    fit = nbt.fit(layers, batch, "2xH100", strategies=("fsdp2",), recompute="none", amp=None,
                  blocks=["0", "1", "2", "3"])
    row = fit.frame.iloc[0]
    assert row["blocks"] == 4
    assert row["parameters_bytes"] < 4 * (64 * 64 + 64) * 4  # sharded over the two ranks


def test_strategies_shard_what_they_say_and_the_table_recommends_a_fitting_row() -> None:
    import nbtoolkit as nbt
    from nbtoolkit.capacity.cards import Card

    card = Card(name="<small & card>", memory_bytes=40 * 2**20 + (1 << 30), flops={"fp32": 1e12},
                intra_node_Bps=1e9, source="a test's card")
    result = nbt.fit(mlp_stack, mlp_batch, (4, card), recompute="none", amp=None, micro_batches=(64,),
                     zero_bucket=1000)
    rows = result.frame.set_index("strategy")
    assert rows.loc["ddp", "optimizer_state_bytes"] == 4 * rows.loc["fsdp2", "optimizer_state_bytes"]
    # ZeRO-3 shards every parameter; those under DeepSpeed's persistence threshold (the MLP's
    # biases and its 256 x 256 head) each rank also keeps whole, beside their partition
    model = mlp_stack()
    whole = sum(p.numel() * 4 for p in model.parameters() if p.numel() < 100_000)
    sharded = sum(p.numel() * 4 for p in model.parameters()) - whole
    assert rows.loc["zero1", "parameters_bytes"] == sharded + whole
    assert rows.loc["zero3", "parameters_bytes"] == (sharded + whole) // 4 + whole
    assert rows.loc["zero2", "gradients_bytes"] < rows.loc["zero1", "gradients_bytes"]
    # collectives: ZeRO-3 / FSDP2 move parameters twice and gradients once, DDP all-reduces
    assert rows.loc["fsdp2", "communication_s"] > rows.loc["zero1", "communication_s"]
    assert not rows.loc["ddp", "fits"] and rows.loc["fsdp2", "fits"]
    best = result.recommended
    assert best is not None and bool(best["fits"])
    assert best["samples_per_s"] == result.frame[result.frame["fits"]]["samples_per_s"].max()
    html = result._repr_html_()
    assert "&lt;small &amp; card&gt;" in html and "<small & card>" not in html
    assert "roofline estimate" in repr(result)


def test_fit_magic_calls_the_api() -> None:
    import torch
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "nbtoolkit")
    shell.user_ns.update(make_model=mlp_stack,
                         make_batch=lambda mb: (torch.randn(mb, 256), torch.randn(mb, 256)))
    out = shell.run_line_magic("nbt", "fit make_model make_batch --devices 2xL4 --strategies ddp,fsdp2 "
                                      "--recompute none --amp fp32 --micro-batches 8,16 --name plan")
    assert list(out.frame["strategy"]) == ["ddp", "fsdp2", "ddp", "fsdp2"]
    assert list(out.frame["micro_batch"]) == [8, 8, 16, 16]
    assert shell.user_ns["plan"] is out


def test_recompute_auto_checkpoints_the_fewest_blocks_that_fit() -> None:
    """On a card between ZeRO-3's needs with no block and every block recomputed, "auto" checkpoints
    k of the 4 blocks: with k the row fits, with k - 1 (traced for real) it does not."""
    import nbtoolkit as nbt
    from nbtoolkit.capacity.api import _needed
    from nbtoolkit.capacity.cards import Card
    from nbtoolkit.capacity.strategies import ZERO_REDUCE_BUCKET
    from nbtoolkit.capacity.tracing import trace_step

    ends = nbt.fit(mlp_stack, mlp_batch, (2, "H100-80GB"), strategies="zero3", recompute=("none", "all"),
                   micro_batches=(512,), amp=None).frame.set_index("recompute")["needed_bytes"]
    card = Card(name="halfway", memory_bytes=int(ends["none"] + ends["all"]) // 2, flops={"fp32": 1e12},
                intra_node_Bps=1e9, source="a test's card")
    auto = nbt.fit(mlp_stack, mlp_batch, (2, card), strategies="zero3", recompute="auto",
                   micro_batches=(512,), amp=None)
    row = auto.frame.iloc[0]
    count = int(row["recomputed_blocks"])
    assert 0 < count < int(row["blocks"]) == 4 and bool(row["fits"])
    fewer = trace_step(mlp_stack, mlp_batch, micro_batch=512, recompute="none", amp=None, optimizer="adamw",
                       loss_fn=None, blocks=None, checkpointed=count - 1)
    assert _needed(fewer, "zero3", 2, None, ZERO_REDUCE_BUCKET)[1] > card.memory_bytes
    assert f"recompute auto ({count} of 4 blocks)" in repr(auto)
