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

Then (issue 36) torch's own ``activation_memory_budget`` (``torch._functorch.config``; a fraction
0..1 of the activation memory, honoured by torch.compile's min-cut partitioner) against nbtoolkit's
plans at equal absolute budgets, on three Hugging Face models with random weights (Llama, GPT-2 and
a ViT from transformers: timm is not installable here), eager and compiled
(``aot_eager_decomp_partition``: the partitioner Inductor uses, without Inductor's code generation,
which takes minutes per graph on 2 CPU cores). The budgets are torch's measured peaks at fractions
0.5 and 0.2. Per budget: nbtoolkit's measured peak (must be <= the budget), its step time against
torch's, against the fastest block subset that fits (brute force, every subset measured), and five
budgets whose measured peaks must never rise as the budget falls. Every setting is measured by the
planner's own measurement (``BackendPlanner.measure``), torch's too. ``--versus-torch-only`` runs
only this part, ``--write`` stores it in ``benchmarks/results/recompute_quality.json``.

Run: ``.venv/bin/python benchmarks/recompute_quality.py`` (about 3-6 minutes on 2 busy cores).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch
from torch import nn

import nbtoolkit as nbt
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


def hf_models() -> dict[str, Any]:
    """Makers of the three Hugging Face models (random weights, small configs): ``name -> make()``.

    A ViT from transformers, not timm: timm is not installable on this machine (only a CUDA
    torchvision exists on its index, and it breaks transformers' import)."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        ViTConfig,
        ViTForImageClassification,
    )

    def language(model: nn.Module, vocab: int) -> tuple[nn.Module, Any]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, vocab, (HF_BATCH, HF_SEQ))

        def step() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            return loss.detach()

        return model, step

    def llama() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=256, hidden_size=HF_DIM, intermediate_size=4 * HF_DIM, num_hidden_layers=HF_LAYERS,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * HF_SEQ,
        )
        return language(LlamaForCausalLM(config), 256)

    def gpt2() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        config = GPT2Config(
            vocab_size=256, n_embd=HF_DIM, n_layer=HF_LAYERS, n_head=4, n_positions=2 * HF_SEQ
        )
        return language(GPT2LMHeadModel(config), 256)

    def vit() -> tuple[nn.Module, Any]:
        torch.manual_seed(0)
        config = ViTConfig(
            hidden_size=HF_DIM, num_hidden_layers=HF_LAYERS, num_attention_heads=4,
            intermediate_size=4 * HF_DIM, image_size=32, patch_size=4, num_labels=10,
        )
        model = ViTForImageClassification(config)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        images, labels = torch.randn(HF_BATCH, 3, 32, 32), torch.randint(0, 10, (HF_BATCH,))

        def step() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            loss = model(pixel_values=images, labels=labels).loss
            loss.backward()
            opt.step()
            return loss.detach()

        return model, step

    return {"llama": llama, "gpt2": gpt2, "vit": vit}


HF_LAYERS = 2  # 3 choices per block: 9 combinations for the brute force, each compiled afresh
HF_DIM = 64
HF_SEQ = 64
HF_BATCH = 8
TORCH_FRACTIONS = (0.5, 0.2)  # torch's activation_memory_budget; their measured peaks are the budgets
BACKEND = {"backend": "aot_eager_decomp_partition"}


STEPS = 3


def versus_torch(
    name: str, make_model: Any, *, compiled: bool, torch_rows: list[tuple[float, Any]]
) -> dict[str, Any]:
    """One model in one mode: nbtoolkit's plans at the peaks torch's activation_memory_budget
    measured (equal absolute budgets), brute force over every choice per block, five budgets.

    Every number comes from the planner's own measurement of a setting (a fresh compile, two
    warm-up steps, one profiled step, the fastest of the timed steps), so torch's settings, the
    brute force and the plans are measured alike."""
    from nbtoolkit.recompute.backend_planner import BackendPlanner
    from nbtoolkit.recompute.blocks import candidate_blocks

    model, step = make_model()
    step()
    candidates = candidate_blocks(model, None)
    planner = BackendPlanner(
        model, step, candidates, compile_options=BACKEND if compiled else None, steps=STEPS, route="auto"
    )
    keep = ["keep"] * len(candidates.names)
    if compiled:  # torch's own budget, measured by this very planner: equal settings, equal numbers
        torch_rows.extend((f, planner.measure(keep, f)) for f in TORCH_FRACTIONS)
    base = planner.measure(keep)
    # brute force over block subsets (each block kept or fully recomputed), every subset measured
    combos = list(itertools.product(("keep", "full"), repeat=len(keep)))
    brute = {c: planner.measure(list(c)) for c in combos}
    rows = []
    for fraction, torch_result in torch_rows:
        budget = torch_result.peak_bytes
        fits = {c: m for c, m in brute.items() if m.peak_bytes <= budget}
        best = min(fits.values(), key=lambda m: m.step_time_s) if fits else None
        try:
            plan = planner.plan(budget)
        except nbt.PlanError as exc:
            rows.append({"torch_fraction": fraction, "budget": budget, "error": str(exc)[:160]})
            continue
        row = {
            "torch_fraction": fraction,
            "budget": budget,
            "torch_peak": torch_result.peak_bytes,
            "torch_time_s": torch_result.step_time_s,
            "nbt_route": plan.route,
            "nbt_choices": ",".join(plan.choices.values()),
            "nbt_fraction": plan.activation_memory_budget,
            "nbt_peak": plan.measured_peak_bytes,
            "nbt_time_s": plan.measured_step_time_s,
            "peak_within_budget": plan.measured_peak_bytes is not None and plan.measured_peak_bytes <= budget,
            "time_vs_torch": (plan.measured_step_time_s or 0) / torch_result.step_time_s,
            "brute_best_time_s": best.step_time_s if best else None,
            "time_vs_brute_force": (plan.measured_step_time_s or 0) / best.step_time_s if best else None,
        }
        rows.append(row)
    low = min(m.peak_bytes for m in brute.values())
    five = [int(low + (base.peak_bytes - low) * f) for f in (0.9, 0.7, 0.5, 0.3, 0.1)]
    plans = planner.plans(five)
    peaks = [p.measured_peak_bytes or 0 for p in plans]
    return {
        "model": name,
        "mode": "compiled (aot_eager_decomp_partition)" if compiled else "eager",
        "blocks": len(keep),
        "baseline_peak": base.peak_bytes,
        "baseline_time_s": base.step_time_s,
        "rows": rows,
        "five_budgets": five,
        "five_peaks": peaks,
        "five_within_budget": all(p <= b for p, b in zip(peaks, five, strict=True)),
        "monotone": peaks == sorted(peaks, reverse=True),
    }


def print_versus(result: dict[str, Any], *, flush: bool = False) -> None:
    mib = 2**20
    print(f"\n{result['model']} {result['mode']}: {result['blocks']} blocks, baseline "
          f"{result['baseline_peak'] / mib:.2f} MiB in {result['baseline_time_s'] * 1e3:.1f} ms")
    for row in result["rows"]:
        if "error" in row:
            print(f"  torch budget {row['torch_fraction']}: {row['error']}")
            continue
        brute = row["time_vs_brute_force"]
        print(
            f"  budget {row['budget'] / mib:.2f} MiB (torch at {row['torch_fraction']}: "
            f"{row['torch_time_s'] * 1e3:.1f} ms) | nbt {row['nbt_route']} [{row['nbt_choices']}] "
            f"{(row['nbt_peak'] or 0) / mib:.2f} MiB {(row['nbt_time_s'] or 0) * 1e3:.1f} ms | "
            f"vs torch {row['time_vs_torch']:.3f}x, vs brute force "
            f"{'-' if brute is None else f'{brute:.3f}x'}, within budget {row['peak_within_budget']}"
        )
    pairs = zip(result["five_budgets"], result["five_peaks"], strict=True)
    shown = ", ".join(f"{b / mib:.2f}->{p / mib:.2f}" for b, p in pairs)
    print(f"  five budgets (MiB budget->peak): {shown}; monotone {result['monotone']}, "
          f"within budget {result['five_within_budget']}", flush=flush)


def versus_torch_all(output: str | None) -> None:
    from nbtoolkit.recompute import backend_planner

    backend_planner.BISECTION_STEPS = 2  # each probe of torch's budget compiles afresh: 2 busy cores
    results: list[dict[str, Any]] = []
    for name, make_model in hf_models().items():
        torch_rows: list[tuple[float, Any]] = []  # filled by the compiled run, used by the eager one
        for compiled in (True, False):
            result = versus_torch(name, make_model, compiled=compiled, torch_rows=torch_rows)
            print_versus(result, flush=True)
            results.append(result)
            torch._dynamo.reset()
            _write(output, results)  # after each run: what finished is kept if the rest is cut off


def _write(output: str | None, results: list[dict[str, Any]]) -> None:
    import json
    import platform

    if output:
        document = {
            "what": (
                "nbtoolkit's recomputation plans vs torch's activation_memory_budget at equal absolute "
                "budgets (torch's measured peaks at fractions 0.5 and 0.2), HF Llama / GPT-2 / ViT "
                "(transformers, random weights, 2 layers, hidden 64; a transformers ViT, timm is not "
                "installable here); brute force over block subsets (kept or fully recomputed); five "
                "budgets for monotonicity. Torch's budget is measured compiled (it exists only under "
                "compile); the eager rows use the same budgets. Times: processor time, fastest of 3 "
                "steps, on 2 shared cores under heavy load (load average about 10): noisy."
            ),
            "machine": (
                f"{platform.machine()}, {torch.get_num_threads()} torch thread(s), CPU only, shared cores"
            ),
            "torch": torch.__version__,
            "results": results,
        }
        with open(output, "w") as handle:
            json.dump(document, handle, indent=1, default=str)


if __name__ == "__main__":
    # one intra-op thread: on a shared 2-core machine two threads make every parallel region
    # wait for both to be scheduled, which swamps the differences being measured
    torch.set_num_threads(1)

    import sys

    if "--versus-torch-only" not in sys.argv:
        quality("total")
        quality("step")
    versus_torch_all("benchmarks/results/recompute_quality.json" if "--write" in sys.argv else None)
