"""Is the speed ratio ``nbt.optimize`` reports true? Re-measured by an independent timer, same run.

For three Hugging Face models built from small configs with random weights (Llama, GPT-2 and
ViT; ``transformers`` needed) and for 1 and 2 torch threads:

1. ``nbt.optimize(model, step, recompute=<every decoder/encoder layer>, undo=False)`` measures
   the step before and after checkpointing every layer and reports ``after/before``
   (``comparison.timing.ratio``, the median of paired rounds), keeping the change applied.
2. An independent timer written here (no nbtoolkit code) switches the model between the two
   states by hand (the modules' ``forward`` instance attributes), runs ``ROUNDS`` rounds of
   one step each side in A B B A order and takes the median of the paired ratios.

Printed, and written to benchmarks/results/optimize_truth.json: both ratios and their
difference. Target: optimize's ratio within 10% of the independent one everywhere.
A timm ViT was asked for; timm needs torchvision, whose only wheel on this machine's package
index is a CUDA build that cannot load beside the CPU torch, so the ViT is transformers' own.

Run: ``.venv/bin/python benchmarks/optimize_truth.py`` (about 3-5 minutes on 2 busy cores).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROUNDS = 30
SEED = 0


def _llama() -> tuple[Any, Any, list[str]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=1000, max_position_embeddings=256, use_cache=False)
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 1000, (4, 128), generator=torch.Generator().manual_seed(SEED))
    return model, {"input_ids": ids, "labels": ids}, [f"model.layers.{i}" for i in range(4)]


def _gpt2() -> tuple[Any, Any, list[str]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=1000, n_positions=256, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 1000, (4, 128), generator=torch.Generator().manual_seed(SEED))
    return model, {"input_ids": ids, "labels": ids}, [f"transformer.h.{i}" for i in range(4)]


def _vit() -> tuple[Any, Any, list[str]]:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                       image_size=64, patch_size=8, num_labels=10)
    model = ViTForImageClassification(config)
    generator = torch.Generator().manual_seed(SEED)
    pixels = torch.randn(8, 3, 64, 64, generator=generator)
    labels = torch.randint(0, 10, (8,), generator=generator)
    return model, {"pixel_values": pixels, "labels": labels}, [f"vit.layers.{i}" for i in range(4)]


def _step_of(model: Any, batch: dict[str, Any]) -> Any:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        return loss

    return step


def _forwards(model: Any) -> list[tuple[Any, Any]]:
    missing = object()
    return [(m, m.__dict__.get("forward", missing)) for m in model.modules()]


def _put_back(state: list[tuple[Any, Any]]) -> None:
    for module, forward in state:
        if callable(forward):
            module.__dict__["forward"] = forward
        else:
            module.__dict__.pop("forward", None)


def _independent_ratio(step: Any, before: list[tuple[Any, Any]], after: list[tuple[Any, Any]]) -> float:
    ratios = []
    for index in range(ROUNDS):
        times = {}
        for side in (("a", before), ("b", after)) if index % 2 == 0 else (("b", after), ("a", before)):
            _put_back(side[1])
            start = time.perf_counter()
            step()
            times[side[0]] = time.perf_counter() - start
        ratios.append(times["b"] / times["a"])
    _put_back(after)
    return statistics.median(ratios)


def main() -> int:
    import nbtoolkit as nbt

    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for name, build in (("llama", _llama), ("gpt2", _gpt2), ("vit", _vit)):
            torch.manual_seed(SEED)
            model, batch, layers = build()
            step = _step_of(model, batch)
            eager = _forwards(model)
            comparison = nbt.optimize(
                model, step, recompute=layers, undo=False,
                config=nbt.MeasureConfig(steps=5, warmup=2, memory=False, metrics=False),
            )
            checkpointed = _forwards(model)
            step()  # warm the checkpointed state once more before the independent timer
            independent = _independent_ratio(step, eager, checkpointed)
            comparison.applied.undo()
            timing = comparison.timing
            row = {
                "model": name, "threads": threads, "optimize_ratio": timing.ratio,
                "optimize_interval": [timing.low, timing.high], "optimize_verdict": timing.verdict,
                "optimize_rounds": timing.rounds, "undisturbed_rounds": len(timing.quiet),
                "independent_ratio": independent,
                "difference": timing.ratio / independent - 1,
            }
            rows.append(row)
            print(f"{name:6} threads={threads}: optimize {timing.ratio:.3f} ({timing.verdict}, "
                  f"{timing.rounds} rounds) independent {independent:.3f} "
                  f"difference {row['difference']:+.1%}", flush=True)
    out = Path(__file__).parent / "results" / "optimize_truth.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": ROUNDS, "rows": rows}, indent=1))
    worst = max(abs(r["difference"]) for r in rows)
    print(f"worst difference {worst:.1%} (target: within 10%)")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
