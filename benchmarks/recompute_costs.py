"""Does the recompute planner's predicted time cost match the step time a plan really adds?

Model: a plain ``torch.nn`` transformer with 6 identical blocks, trained with AdamW on one
torch thread. The planner's measurement (``measure_recompute_costs``, what
``nbt.plan_recompute`` runs) costs the blocks and the solver makes the trade-off front; then
plans of 1, 2, 3 and 6 blocks (``plan.with_blocks``) are measured side by side with no
checkpointing, interleaved in a shuffled order every round so load hits all alike.
Each plan's measured cost is the median over rounds of (its step - the round's plain step),
with the 25th-75th percentiles; printed next to the predicted cost and its p25-p75. The
clock is the one the planner uses on the CPU (the calling thread's processor time); the
wall-time medians are printed for context.

Also printed: the per-block costs measured again without pooling (identical blocks, so they
should agree), and what the prediction would be without the overhead factor (the re-run
forwards alone), to show what the factor corrects.

``--load``: a thread spins on matrix products (releasing the GIL, so it takes a core) for
the first half of the planning, as a busy machine would.

    .venv/bin/python benchmarks/recompute_costs.py [--rounds 40] [--load] [--dim 64]
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nbtoolkit.recompute.blocks import candidate_blocks
from nbtoolkit.recompute.checkpoint import checkpoint_blocks
from nbtoolkit.recompute.plan_measure import measure_recompute_costs
from nbtoolkit.recompute.recompute_timing import quantile
from nbtoolkit.recompute.solver import solve_recompute

BLOCKS, BATCH, SEQ, VOCAB = 6, 16, 64, 64


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Model(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(BLOCKS)])
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make(dim: int) -> tuple[Model, Callable[[], Any]]:
    torch.manual_seed(0)
    model = Model(dim)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(0))

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        logits = model(data[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


def spin(stop: threading.Event) -> None:
    a = torch.randn(256, 256)
    while not stop.is_set():
        a @ a


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--load", action="store_true")
    parser.add_argument("--dim", type=int, default=64, help="width (MLP 4x); at 32 Python overhead weighs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, step = make(args.dim)

    stop = threading.Event()
    if args.load:
        threading.Thread(target=spin, args=(stop,), daemon=True).start()
        threading.Timer(5.0, stop.set).start()  # about the first half of the planning
    began = time.perf_counter()
    candidates = candidate_blocks(model, None)
    costs = measure_recompute_costs(step, candidates, device=None, steps=3, tick=lambda _: None, total=False)
    stop.set()
    plan = solve_recompute(costs, budget_kind="step")
    print(f"planning took {time.perf_counter() - began:.1f} s")
    print(plan._text())

    own = measure_recompute_costs(
        step, candidates, device=None, steps=3, tick=lambda _: None, total=False, pool=False
    )
    print("per-block costs measured again without pooling (ms):", *(ms(c) for c in own.recompute_time_s))
    print(f"  max/min {max(own.recompute_time_s) / min(own.recompute_time_s):.2f}")

    names = list(plan.candidates["block"])
    chosen = {1: names[2:3], 2: names[1:5:2], 3: names[0::2], BLOCKS: names}
    plans = {k: plan.with_blocks(blocks) for k, blocks in chosen.items()}
    configs: dict[str, list[str]] = {"none": [], **{f"{k} blocks": p.blocks for k, p in plans.items()}}
    thread: dict[str, list[float]] = {c: [] for c in configs}
    wall: dict[str, list[float]] = {c: [] for c in configs}
    for _ in range(3):
        step()
    for _ in range(args.rounds):
        order = list(configs)
        random.shuffle(order)
        for name in order:
            with checkpoint_blocks(model, configs[name]):
                w, t = time.perf_counter(), time.thread_time()
                step()
                thread[name].append(time.thread_time() - t)
                wall[name].append(time.perf_counter() - w)
    # what the prediction would be from the re-run forwards alone (no overhead factor)
    rerun_only = costs.recompute_time_s[0] / costs.timing["overhead_factor"]
    print(f"\nplain step: {ms(statistics.median(thread['none']))} ms thread time, "
          f"{ms(statistics.median(wall['none']))} ms wall (median of {args.rounds} rounds)")
    print("plan       predicted (p25-p75)           measured (p25-p75)            re-run only   wall median")
    for k, p in plans.items():
        name = f"{k} blocks"
        diffs = [a - b for a, b in zip(thread[name], thread["none"], strict=True)]
        wall_diff = statistics.median(wall[name]) - statistics.median(wall["none"])
        spread = p.predict_overhead_spread(p.blocks) or (float("nan"), float("nan"))
        print(
            f"{name:<10} {ms(p.predicted_overhead_s)} ({ms(spread[0])}-{ms(spread[1])}) ms   "
            f"{ms(statistics.median(diffs))} ({ms(quantile(diffs, 0.25))}-{ms(quantile(diffs, 0.75))}) ms   "
            f"{ms(k * rerun_only)} ms     {ms(wall_diff)} ms"
        )


if __name__ == "__main__":
    main()
