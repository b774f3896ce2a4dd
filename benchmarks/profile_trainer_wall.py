"""Wall time of ``nbt.profile(loop=True)`` around ``trainer.train()`` next to the same training without it.

What ``%%nbt profile`` costs a user whose cell is ``trainer.train()`` (the magic calls exactly
``nbt.profile(cell, loop=True)``). Two cases, each timed side by side in one process, in rounds of
A B B A (plain, profiled, profiled, plain) so that a machine that slows down mid-run slows both
alike; a fresh transformers Trainer (random-weight Llama from its config, in-memory tokens, CPU) for
every run, its construction not timed:

- ``continue``: ``max_steps`` training steps either way; the profiled run profiles ``steps`` of them
  after one warm-up step and lets the rest run on unprofiled (``after="continue"``). The ratio is
  the whole cost of the tool on a training: the greenlet, the optimizer hooks, the profiled steps
  and reading the trace back.
- ``stop``: the profiled run stops the trainer after its warm-up and ``steps`` profiled steps (the
  default); the plain run trains that many steps (``max_steps = 1 + steps``). The ratio is what
  profiling a few steps of a training costs next to running them.

Printed and written to ``benchmarks/results/profile_trainer_wall.json``: per case the median of the
per-round ratios profiled/plain (each round's two A and two B summed), and every run's seconds.

    .venv/bin/python benchmarks/profile_trainer_wall.py [--rounds 5] [--max-steps 30] [--steps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "profile_trainer_wall.json"
SEQ, VOCAB = 32, 256


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int = 512) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def make_trainer(folder: Path, max_steps: int) -> Any:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=str(folder), report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        max_steps=max_steps, disable_tqdm=True, per_device_train_batch_size=4, dataloader_num_workers=0,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    return transformers.Trainer(model=model, args=args, train_dataset=Tokens())


def timed(run: Callable[[Any], Any], max_steps: int, folder: Path) -> float:
    """Seconds of ``run(trainer)`` on a fresh trainer (made before the clock starts)."""
    trainer = make_trainer(folder, max_steps)
    with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its final metrics
        start = time.perf_counter()
        run(trainer)
        seconds = time.perf_counter() - start
    return seconds


def case(after: str, *, rounds: int, max_steps: int, steps: int, folder: Path) -> dict[str, Any]:
    import nbtoolkit as nbt

    plain_steps = max_steps if after == "continue" else 1 + steps

    def plain(trainer: Any) -> Any:
        return trainer.train()

    def profiled(trainer: Any) -> Any:
        trace = nbt.profile(trainer.train, steps=steps, loop=True, after=after)
        assert len(trace.steps) == steps
        expected = max_steps if after == "continue" else 1 + steps
        assert trainer.state.global_step == expected, (trainer.state.global_step, expected)
        return trace

    timed(plain, plain_steps, folder)  # discarded: the first training of a process loads a lot
    timed(profiled, max_steps, folder)
    plain_s: list[float] = []
    profiled_s: list[float] = []
    ratios: list[float] = []
    for _ in range(rounds):
        a1 = timed(plain, plain_steps, folder)
        b1 = timed(profiled, max_steps, folder)
        b2 = timed(profiled, max_steps, folder)
        a2 = timed(plain, plain_steps, folder)
        plain_s += [a1, a2]
        profiled_s += [b1, b2]
        ratios.append((b1 + b2) / (a1 + a2))
    return {
        "after": after,
        "training_steps": plain_steps,
        "profiled_steps": steps,
        "ratio": statistics.median(ratios),
        "round_ratios": ratios,
        "plain_s": plain_s,
        "profiled_s": profiled_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a shared machine: 1)")
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for after in ("continue", "stop"):
            row = case(after, rounds=options.rounds, max_steps=options.max_steps, steps=options.steps,
                       folder=Path(folder))
            rows.append(row)
            per_round = ", ".join(f"{r:.3f}" for r in row["round_ratios"])
            print(
                f"after={after}: {row['training_steps']} training steps, {row['profiled_steps']} profiled: "
                f"profiled/plain wall {row['ratio']:.3f} (per round {per_round}); "
                f"plain median {statistics.median(row['plain_s']):.2f} s, "
                f"profiled median {statistics.median(row['profiled_s']):.2f} s"
            )
    result = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rounds": options.rounds,
        "rows": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
