"""nbt.fit's predictions checked on 2 and 4 real CPU ranks (gloo): ``FitResult.verify`` runs each row
with the real strategy (torch DDP, DeepSpeed ZeRO 1-3, FSDP2) and the predicted per-rank peak is
compared with the measured one (the measurement of every other cluster memory API).

Three models: a plain MLP stack, a small HF decoder (transformers' Llama) and a small ViT written
in plain torch (timm is not installable here). Each is predicted with ``recompute`` none, auto and
all on a card sized between ZeRO-3's peak with and without recompute, so that "auto" checkpoints
some of the blocks for some strategies; an "auto" row that chose none or all of them is the same
configuration as the "none" or "all" row and is run once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.capacity._fit_models import (
    llama_batch,
    llama_loss,
    mlp_batch,
    mlp_stack,
    tiny_llama,
    tiny_vit,
    vit_batch,
)

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.deepspeed]

#: the issue's bound on |predicted - measured| / measured, for every strategy. Two rows once needed
#: 15%. Both came from verify reading the CPU peak's baseline at the trace's first memory event in
#: file order (events are listed thread by thread, so that was a later thread's, and the baseline
#: was off by what the step held then): the ViT's ZeRO-3 rows read 3.09 MiB low, and FSDP2's peaks
#: moved with gloo's timing (the HF decoder's 2-block row read 14% under in one run). With the
#: baseline in time order, two prediction gaps showed and were closed in strategies.py (ZeRO-3's
#: partitions of persistent parameters; FSDP2's previous reduce-scatter input), and gloo's own
#: copies inside collectives, alive or not at the peak depending on the other ranks, are left out.
TOLERANCE = 0.10

#: model function, batch function, micro-batch, loss (None: the integrations' default)
MODELS: dict[str, tuple[Callable[[], Any], Callable[[int], Any], int, Any]] = {
    "mlp_stack": (mlp_stack, mlp_batch, 512, None),
    "hf_llama": (tiny_llama, llama_batch, 8, llama_loss),
    "vit": (tiny_vit, vit_batch, 16, None),
}


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    import nbtoolkit as nbt

    cl = nbt.Cluster.local(ranks=request.param, collective_timeout_s=180)
    try:
        yield cl
    finally:
        cl.close()


def _card_between_recompute_none_and_all(predict: Callable[[Any], Any], world: int) -> Any:
    """A card whose memory sits halfway between ZeRO-3's needs with no block and every block
    recomputed: "auto" then has to checkpoint some blocks, not none or all."""
    from nbtoolkit.capacity.cards import Card

    needed = predict((world, "H100-80GB")).frame.set_index("recompute")["needed_bytes"]
    middle = (int(needed["none"]) + int(needed["all"])) // 2
    return Card(name="halfway", memory_bytes=middle, flops={"fp32": 1e12}, intra_node_Bps=1e9,
                source="a test's card")


@pytest.mark.parametrize("model", list(MODELS))
def test_predicted_peak_within_10_percent_of_measured(cluster: Any, model: str) -> None:
    import functools

    import nbtoolkit as nbt

    make_model, make_batch, micro, loss = MODELS[model]
    world = cluster.world_size
    # small DeepSpeed buckets, so that parameters, state and activations decide the peak, not the bucket
    predict = functools.partial(nbt.fit, make_model, make_batch, micro_batches=(micro,), amp=None,
                                loss_fn=loss, zero_bucket=100_000)
    card = _card_between_recompute_none_and_all(
        lambda devices: predict(devices, strategies="zero3", recompute=("none", "all")), world)
    fit = predict((world, card), recompute=("none", "auto", "all"))
    rows = fit.frame
    auto = rows[rows["recompute"] == "auto"]
    assert ((auto["recomputed_blocks"] > 0) & (auto["recomputed_blocks"] < auto["blocks"])).any(), auto
    distinct = list(rows.drop_duplicates(["strategy", "recomputed_blocks"]).index)
    verification = fit.verify(cluster, rows=distinct, steps=1)
    print(model, world, verification)
    for _, row in verification.frame.iterrows():
        where = (model, world, row["strategy"], row["recompute"], row["recomputed_blocks"], row["error"])
        assert abs(row["error"]) < TOLERANCE, where
        assert len(row["measured_per_rank"]) == world


def test_verify_refuses_a_cluster_of_another_size(cluster: Any) -> None:
    import nbtoolkit as nbt

    other = 2 * cluster.world_size  # any other size
    fit = nbt.fit(mlp_stack, mlp_batch, (other, "H100-80GB"), strategies="ddp", recompute="none", amp=None)
    with pytest.raises(nbt.NbtUsageError, match=f"{other} ranks and the cluster has {cluster.world_size}"):
        fit.verify(cluster)
