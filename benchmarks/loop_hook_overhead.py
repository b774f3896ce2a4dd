"""What running a trainer under ``LoopSteps`` costs the steps nbtoolkit does not measure.

While a :class:`~nbtoolkit.core.training_loop.LoopSteps` is open, every optimizer step and every
backward pass of the process goes through nbtoolkit's hooks (``nbtoolkit.core.loop_boundaries``),
and the loop runs in a greenlet. This compares a real Hugging Face Trainer (a tiny Llama from its
config, CPU, one intra-op thread) training ``--steps`` steps plainly (``trainer.train()``) with the
same trainer under ``LoopSteps(trainer.train, warmup=2, after="continue")``: 3 measured steps, then
``finish()`` runs the rest to ``max_steps`` with the hooks still installed. A TrainerCallback
stamps the end of every step with the main thread's CPU time (``time.thread_time``: the wall clock
on a shared machine moves with other processes); the per-step time is the median interval over
the steps after the measured part (the same step indices in both runs). Runs alternate plain /
LoopSteps / LoopSteps / plain (A B B A) per round in one process, on one trainer, after a
discarded warm-up run; the ratio of each round's medians and their median over rounds are
printed and written to benchmarks/results/loop_hook_overhead.json. Target: ratio <= 1.02.

Also printed: what the hook path alone adds to one optimizer step with one backward, isolated on a
one-element model (a trainer's step is far too noisy on a shared machine to show microseconds), and
as a fraction of the plain trainer step; and the time one measured step() takes (a greenlet switch
in and out around the trainer's step) against the median plain step.

    .venv/bin/python benchmarks/loop_hook_overhead.py [--rounds 5] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

MEASURED = 3
WARMUP = 2


def make_trainer(folder: str, steps: int, hidden: int) -> tuple[Any, list[float]]:
    """A real HF Trainer and the list its callback appends each step's end time to."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 256, (8 * steps, 64))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    stamps: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # the main thread's CPU time: what the step cost it, which other processes on a busy
            # machine do not inflate (the wall clock moves with them)
            stamps.append(time.thread_time())

    args = TrainingArguments(
        output_dir=folder,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        max_steps=steps,
        per_device_train_batch_size=4,
        disable_tqdm=True,
    )
    return Trainer(model=model, args=args, train_dataset=dataset, callbacks=[Stamp()]), stamps


def step_times(stamps: list[float], first: int) -> list[float]:
    """Intervals between step ends, for steps ``first`` (1-based) onwards."""
    return [b - a for a, b in zip(stamps[first - 2 : -1], stamps[first - 1 :], strict=False)]


def plain_run(trainer: Any, stamps: list[float]) -> list[float]:
    stamps.clear()
    trainer.train()
    return step_times(stamps, WARMUP + MEASURED + 2)


def loop_run(trainer: Any, stamps: list[float]) -> tuple[list[float], list[float]]:
    """(the unmeasured steps' times after the measured part, the measured steps' times)."""
    from nbtoolkit.core.training_loop import LoopSteps

    stamps.clear()
    step = LoopSteps(trainer.train, warmup=WARMUP, after="continue")
    step.start()
    measured = []
    for _ in range(MEASURED):
        start = time.thread_time()
        step()
        measured.append(time.thread_time() - start)
    outcome = step.finish()
    assert outcome.stopped_by == "ran to its end", outcome
    step.close()
    return step_times(stamps, WARMUP + MEASURED + 2), measured


def hook_cost_us(steps: int = 3000, rounds: int = 4) -> float:
    """Microseconds the hook path adds to one optimizer step with one backward: the cost isolated
    on a one-element model (whose own step is a few tens of microseconds), A B B A, thread time."""
    from nbtoolkit.core.training_loop import LoopSteps

    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=1e-6)

    def loop() -> None:
        for _ in range(steps):
            (weight * 2).sum().backward()
            optimizer.step()

    def plain() -> float:
        start = time.thread_time()
        loop()
        return time.thread_time() - start

    def hooked() -> float:
        step = LoopSteps(loop, warmup=0, after="continue")
        step()  # pauses once at the first optimizer step, then runs on unmeasured
        start = time.thread_time()
        step.finish()
        return time.thread_time() - start

    extra = []
    for _ in range(rounds):
        a1, b1, b2, a2 = plain(), hooked(), hooked(), plain()
        extra.append(((b1 + b2) - (a1 + a2)) / (2 * steps))
    return statistics.median(extra) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=128)
    options = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        trainer, stamps = make_trainer(folder, options.steps, options.hidden)
        plain_run(trainer, stamps)  # discarded: first-run costs (allocator, lazy imports)
        loop_run(trainer, stamps)
        ratios, plain_all, loop_all, measured_all = [], [], [], []
        for index in range(options.rounds):
            a1 = plain_run(trainer, stamps)
            b1, m1 = loop_run(trainer, stamps)
            b2, m2 = loop_run(trainer, stamps)
            a2 = plain_run(trainer, stamps)
            plain, looped = a1 + a2, b1 + b2
            ratio = statistics.median(looped) / statistics.median(plain)
            ratios.append(ratio)
            plain_all += plain
            loop_all += looped
            measured_all += m1 + m2
            print(
                f"round {index + 1}: plain {statistics.median(plain) * 1e3:.2f} ms/step, under LoopSteps "
                f"{statistics.median(looped) * 1e3:.2f} ms/step, ratio {ratio:.4f}",
                flush=True,
            )
    ratio = statistics.median(ratios)
    extra_us = hook_cost_us()
    plain_ms = statistics.median(plain_all) * 1e3
    measured_ms = statistics.median(measured_all) * 1e3
    print(f"median ratio {ratio:.4f} over {options.rounds} rounds (target <= 1.02)")
    print(
        f"the hook path alone: {extra_us:.1f} us per optimizer step (with one backward), "
        f"{extra_us / (statistics.median(plain_all) * 1e6):.3%} of the plain trainer step"
    )
    print(f"a measured step() {measured_ms:.2f} ms, a plain step {plain_ms:.2f} ms (main-thread CPU time)")
    out = Path(__file__).parent / "results" / "loop_hook_overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "what": "HF Trainer step time, unmeasured steps under LoopSteps(after='continue') / plain",
                "device": "cpu, 1 intra-op thread; step times are main-thread CPU time",
                "rounds": options.rounds,
                "steps_per_run": options.steps,
                "ratios": ratios,
                "median_ratio": ratio,
                "plain_step_ms": plain_ms,
                "loop_step_ms": statistics.median(loop_all) * 1e3,
                "measured_step_ms": measured_ms,
                "hook_path_us_per_step": extra_us,
                "hook_path_fraction_of_step": extra_us / (statistics.median(plain_all) * 1e6),
            },
            indent=1,
        )
    )
    return 0 if ratio <= 1.02 else 1


if __name__ == "__main__":
    sys.exit(main())
