"""Does Llama-3-8B full fine-tuning fit on 8 x H100? The whole table from a fake Llama-3-8B in under
a minute and 2 GB of this process, checked against what is known: AdamW in mixed precision holds 16
bytes per parameter before activations (2 + 2 + 12 under ZeRO; 4 + 4 + 8 with autocast)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers", reason="the Llama config comes from transformers")

LLAMA_3_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}


def make_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**LLAMA_3_8B))


def make_batch(micro_batch: int) -> Any:
    import torch

    ids = torch.randint(0, LLAMA_3_8B["vocab_size"], (micro_batch, 2048))
    return ids, ids


def next_token_loss(out: Any, targets: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1).float(), targets.flatten())


_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {tests!r})
from capacity.test_fit_llama import make_batch, make_llama, next_token_loss
started = time.perf_counter()
import nbtoolkit as nbt
eight = nbt.fit(make_llama, make_batch, "8xH100-80GB", micro_batches=(1,), amp=("bf16",),
                recompute=("none", "all"), loss_fn=next_token_loss)
seconds = time.perf_counter() - started
print(eight, file=sys.stderr)
one = nbt.fit(make_llama, make_batch, "1xH100-80GB", micro_batches=(1,), amp=("bf16",), recompute="all",
              loss_fn=next_token_loss)
print(json.dumps({{
    "seconds": seconds, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "eight": eight.frame.to_dict("records"), "recommended": eight.recommended is not None,
    "one": one.frame.to_dict("records"),
}}, default=str))
"""


def test_llama_3_8b_fits_eight_h100_with_zero3_or_fsdp2_and_not_one() -> None:
    """In a fresh interpreter, so that the time and the peak RSS are the table's own (with nbtoolkit's
    and torch's imports), not those of the test session around it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    tests = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _CHILD.format(tests=str(tests))], capture_output=True,
                          text=True, timeout=600, cwd=tests.parent, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    seconds, peak_rss = out["seconds"], out["peak_rss"]
    rss_gib = peak_rss / 2**30
    print(f"Llama-3-8B table ({len(out['eight'])} rows): {seconds:.1f} s, peak RSS {rss_gib:.2f} GiB")
    print(done.stderr[-6000:])
    assert seconds < 60  # the bound; 19-41 s measured here with four other jobs on the 2 cores
    assert peak_rss < 2 * 2**30

    rows = pd.DataFrame(out["eight"])
    parameters = 8_030_261_248  # Llama-3-8B with untied embeddings
    ddp = rows[(rows["strategy"] == "ddp") & (rows["recompute"] == "none")].iloc[0]
    states = ddp["parameters_bytes"] + ddp["optimizer_state_bytes"] + 4 * parameters  # whole gradients: 4 B
    assert states == pytest.approx(16 * parameters, rel=0.01)
    zero3 = rows[(rows["strategy"] == "zero3") & (rows["recompute"] == "none")].iloc[0]
    per_rank_states = zero3["parameters_bytes"] + zero3["optimizer_state_bytes"] + parameters * 2 / 8
    assert per_rank_states == pytest.approx(16 * parameters / 8, rel=0.01)
    for strategy in ("zero3", "fsdp2"):
        assert rows[rows["strategy"] == strategy]["fits"].astype(bool).all(), strategy
    assert not rows[rows["strategy"] == "ddp"]["fits"].astype(bool).any()  # 128 GB of state per rank
    assert out["recommended"]

    one = pd.DataFrame(out["one"])
    assert not one["fits"].astype(bool).any()
    assert (one["needed_bytes"] > 16 * parameters).all()
