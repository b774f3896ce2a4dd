"""How good are nbtoolkit's recomputation plans? Measured side by side in one run, on this machine.

Model: a small GPT-like transformer whose blocks have different MLP widths (so the blocks
save different amounts of memory and cost different recompute times), trained with AdamW
(so parameters, gradients and optimizer state are a real share of the device's total).
Budgets are of the device's total peak (``budget_bytes``, what a user with an 80 GB GPU means),
and then of the step's own peak (``step_budget_bytes``); the peaks measured for brute force are
the same figure. For several budgets of each kind:

* ``plan``: ``nbt.plan_recompute`` (measured candidates + exact ILP);
* ``brute force``: every subset of blocks is applied and measured (peak and step time);
  the best is the fastest subset whose *measured* peak meets the budget;
* ``all blocks``: checkpoint every block;
* ``first k``: checkpoint the first k blocks, the smallest k that meets the budget.

Step times are processor time (``time.process_time``), because this machine is shared and
wall time there is mostly waiting for a core. All subsets are measured interleaved (round
robin) so that load hits every configuration alike, and each subset's time is the fastest
of its rounds (load only ever adds time, so the minimum is the configuration's own cost).
Printed: the ratio of each strategy's measured step time to the brute-force best. Target:
plan within 5%.

Then torch's own ``activation_memory_budget`` (``torch._functorch.config``; a relative budget
0..1 of the activation memory, honoured by the min-cut partitioner of torch.compile) is
compared with nbtoolkit's plan under the same backend (``aot_eager_decomp_partition``, which
uses that partitioner without Inductor's code generation): for each relative budget we
measure torch's peak (the device total) and step time, then give nbtoolkit that measured total
as its budget.

Run: ``.venv/bin/python benchmarks/recompute_quality.py`` (about 3-6 minutes on 2 busy cores).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch
from torch import nn

import nbtoolkit as nbt
from nbtoolkit.recompute.apply_compile import compile_model
from nbtoolkit.recompute.checkpoint import checkpoint_blocks
from nbtoolkit.recompute.measure import profile_memory_series

HIDDEN = [64, 768, 128, 512, 256]  # 5 blocks: 32 subsets for the brute force
ROUNDS = 4
STEPS_PER_ROUND = 2


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, dim: int = 64, vocab: int = 128, seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        self.blocks = nn.ModuleList([Block(dim, h) for h in HIDDEN])
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make(seed: int = 0) -> tuple[GPT, Any]:
    torch.manual_seed(seed)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 128, (8, 65))

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        out = model(data[:, :-1])
        loss = nn.functional.cross_entropy(out.reshape(-1, 128), data[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    return model, step


def timed(step: Any, n: int) -> list[float]:
    """Processor seconds per step (time.process_time): not inflated by waiting for a busy core."""
    times = []
    for _ in range(n):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return times


def measure_subsets(
    model: nn.Module, step: Any, subsets: list[tuple[str, ...]], *, kind: str
) -> dict[tuple[str, ...], Any]:
    """Measured peak of ``kind`` (one profiled step) and fastest step time (interleaved rounds) per subset."""
    peaks = {}
    for subset in subsets:
        with checkpoint_blocks(model, list(subset)):
            step()
            series = profile_memory_series(step, total=kind == "total")[0]
            peaks[subset] = series.total_peak_bytes if kind == "total" else series.peak_bytes
    times: dict[tuple[str, ...], list[float]] = {s: [] for s in subsets}
    for _ in range(ROUNDS):
        for subset in subsets:
            with checkpoint_blocks(model, list(subset)):
                times[subset] += timed(step, STEPS_PER_ROUND)
    return {s: (peaks[s], min(times[s])) for s in subsets}


def _plan(model: nn.Module, step: Any, budget: int | None, kind: str) -> Any:
    if kind == "step":
        if budget is None:  # the front of step peaks: a budget above the baseline plans nothing
            return nbt.plan_recompute(model, step, step_budget_bytes=2**40, steps=5)
        return nbt.plan_recompute(model, step, step_budget_bytes=budget, steps=5)
    return nbt.plan_recompute(model, step, budget, steps=5)


def quality(kind: str) -> None:
    model, step = make()
    names = [f"blocks.{i}" for i in range(len(HIDDEN))]
    print(f"\n=== budgets of the {'device total' if kind == 'total' else 'step own peak'} ===")
    probe = _plan(model, step, None, kind)
    print(f"baseline peak {probe.baseline_peak_bytes / 2**20:.2f} MiB, lowest reachable "
          f"{probe.min_peak_bytes / 2**20:.2f} MiB, step {probe.baseline_step_time_s * 1e3:.1f} ms")
    print(probe.candidates.to_string(index=False))
    subsets = [tuple(c) for r in range(len(names) + 1) for c in itertools.combinations(names, r)]
    low, high = probe.min_peak_bytes, probe.baseline_peak_bytes
    budgets = [int(low + (high - low) * f) for f in (0.15, 0.4, 0.7)]
    plans = {b: _plan(model, step, b, kind) for b in budgets}
    for plan in plans.values():  # the plans are measured among the subsets, interleaved with them
        assert tuple(plan.blocks) in subsets
    results = measure_subsets(model, step, subsets, kind=kind)
    print(f"\n{'budget MiB':>10} {'strategy':<12} {'blocks':<20} {'peak MiB':>9} {'CPU ms':>8} "
          f"{'vs best':>8}")
    base_peak, base_t = results[()]
    print(f"{'-':>10} {'no recompute':<12} {'-':<20} {base_peak / 2**20:>9.2f} {base_t * 1e3:>8.2f}")
    wins = 0
    for budget in budgets:
        fits = {s: r for s, r in results.items() if r[0] <= budget}
        best = min(fits, key=lambda s: fits[s][1])
        first_k = next(
            tuple(names[:k]) for k in range(len(names) + 1) if results[tuple(names[:k])][0] <= budget
        )
        rows = [("plan", tuple(plans[budget].blocks)), ("brute force", best), ("all blocks", tuple(names)),
                ("first k", first_k)]
        for label, subset in rows:
            peak, t = results[subset]
            ratio = t / results[best][1]
            ok = "" if peak <= budget else "  OVER BUDGET"
            shown = ",".join(s.split(".")[1] for s in subset) or "-"
            print(f"{budget / 2**20:>10.2f} {label:<12} {shown:<20} "
                  f"{peak / 2**20:>9.2f} {t * 1e3:>8.2f} {ratio:>7.3f}×{ok}")
        plan_t = results[tuple(plans[budget].blocks)][1]
        within = plan_t <= 1.05 * results[best][1]
        beats = plan_t <= results[tuple(names)][1] and plan_t <= results[first_k][1]
        wins += within and beats
        print(f"{'':>10} plan within 5% of brute force: {within}; "
              f"at least as fast as all-blocks and first-k: {beats}")
    print(f"\nplan met both targets on {wins} of {len(budgets)} budgets")


def versus_torch_budget() -> None:
    import torch._functorch.config as functorch_config

    print("\ntorch activation_memory_budget (backend aot_eager_decomp_partition) "
          "vs nbtoolkit plan, same backend")
    print(f"{'torch budget':>12} {'torch peak MiB':>14} {'torch ms':>9} | {'nbt blocks':<14} "
          f"{'nbt peak MiB':>12} {'nbt ms':>8}")
    for fraction in (1.0, 0.5, 0.2):
        model, step = make()
        with functorch_config.patch(activation_memory_budget=fraction):
            torch._dynamo.reset()
            handle = compile_model(model, backend="aot_eager_decomp_partition")
            try:
                for _ in range(2):
                    step()
                torch_peak = profile_memory_series(step, total=True)[0].total_peak_bytes
                torch_t = min(timed(step, 6))
            finally:
                handle.undo()
        torch._dynamo.reset()
        model, step = make()
        try:
            plan = nbt.plan_recompute(model, step, torch_peak, steps=5)
        except nbt.PlanError:
            print(f"{fraction:>12.2f} {torch_peak / 2**20:>14.2f} {torch_t * 1e3:>9.2f} | no nbtoolkit plan "
                  "reaches that peak (block granularity)")
            continue
        with plan.apply(model):
            handle = compile_model(model, backend="aot_eager_decomp_partition")
            try:
                for _ in range(2):
                    step()
                nbt_peak = profile_memory_series(step, total=True)[0].total_peak_bytes
                nbt_t = min(timed(step, 6))
            finally:
                handle.undo()
        torch._dynamo.reset()
        blocks = ",".join(b.split(".")[1] for b in plan.blocks) or "-"
        print(f"{fraction:>12.2f} {torch_peak / 2**20:>14.2f} {torch_t * 1e3:>9.2f} | {blocks:<14} "
              f"{nbt_peak / 2**20:>12.2f} {nbt_t * 1e3:>8.2f}")


if __name__ == "__main__":
    # one intra-op thread: on a shared 2-core machine two threads make every parallel region
    # wait for both to be scheduled, which swamps the differences being measured
    torch.set_num_threads(1)

    quality("total")
    quality("step")
    versus_torch_budget()
