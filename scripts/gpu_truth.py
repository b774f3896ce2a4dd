"""GPU truth: run every CUDA path of nbtoolkit once on a real card and compare it with torch's own numbers.

Run through ``scripts/gpu_truth.sh`` (which puts the carried wheels and the working tree on the
path). Each check writes one record into ``<out>/gpu_truth.json``:

    {"check": ..., "status": "passed" | "failed" | "not run", "why": ..., "numbers": {...},
     "reference": "what it was compared with", "seconds": ...}

and what the run recorded (a profiler trace, an allocator snapshot, the exported snapshot, a
TORCH_TRACE log) goes into ``<out>/gpu_truth_artifacts.tar.gz`` (at most 16 MB; larger files are
left out and named). ``--cpu`` runs every check on the CPU: what needs CUDA is "not run" with
the reason, so CI proves the plumbing and a real run can only fail on what the GPU shows.

The checks (issue "GPU truth"):
 1. memory_timeline of a GPT-like step, fp32 and bf16: total peak = torch.cuda.max_memory_allocated
    and = torch's MemTracker total; the categories add up to the total.
 2. an allocator snapshot recorded by torch: load_memory_snapshot(...).stats() = torch.cuda._memory_viz's
    stats; export_memory_snapshot of the timeline read back by memory_viz.
 3. plan_recompute at "90%" and at a budget between checkpoint-all and none: the peak measured
    under the plan within the budget, the loss unchanged, faster than checkpoint-all.
 4. optimize(compile=True, recompute="auto", amp="bf16"): its speed-up re-measured here,
    interleaved, with CUDA events (perf_counter on the CPU).
 5. step_metrics: the peak it picks and its source; the MFU of a large bf16 matmul in range.
 6. profile(): kernels, streams and launches; temporal, kernel and idle breakdowns; critical
    path and roofline of that trace.
 7. capture_graphs with inductor: the breaks of a model with known breaks are where the code
    says, on the device as on the CPU.
 8. the timeline widget's level-of-detail index over the recorded trace: every event counted
    once at full zoom-out, and windows down to 1 ns answer.
 9. offload (issue 36): every block's saved activations in host memory (save_on_cpu, what a
    recomputation plan's "offload" applies): max_memory_allocated no higher than keeping them,
    the loss unchanged. Not run on the CPU, where the planner never offers offload.
10. nbt.fit (issue 37) for the card it runs on: one rank, an MLP stack of about 1 GiB of fp32
    weights, fp32 and bf16 autocast, without and with every block recomputed: the predicted peak
    (before the allocator margin) within 10% of torch.cuda.max_memory_allocated over a real AdamW
    step. Not run on the CPU (its CPU check on 2 and 4 ranks: tests/cluster/test_fit_verify.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import tarfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ARCHIVE_LIMIT = 16 * 1024**2
RESULTS_NAME = "gpu_truth.json"
ARCHIVE_NAME = "gpu_truth_artifacts.tar.gz"


class NotRun(Exception):
    """The check cannot run here (its reason is the message)."""


class Check:
    """One record of the results file; ``fail`` lists what did not hold."""

    def __init__(self, name: str, reference: str) -> None:
        self.name = name
        self.reference = reference
        self.numbers: dict[str, Any] = {}
        self.problems: list[str] = []
        self.remarks: list[str] = []

    def expect(self, condition: bool, what: str) -> None:
        if not condition:
            self.problems.append(what)

    def record(self, **numbers: Any) -> None:
        self.numbers.update({k: _plain(v) for k, v in numbers.items()})


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        try:
            return value.item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


# ------------------------------------------------------------------------------------ models
def gpt(device: str, seed: int = 0, *, large: bool) -> tuple[Any, Any, Callable[[], Any], Any]:
    """(model, optimizer, step, data): a GPT-like decoder trained with AdamW, deterministic per seed."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim: int, hidden: int) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
            self.ln2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self, vocab: int, dim: int, hidden: list[int], seq: int) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.zeros(seq, dim))
            self.blocks = nn.ModuleList([Block(dim, h) for h in hidden])
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.embed(idx) + self.pos[: idx.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    vocab, dim, seq, batch = (8192, 512, 256, 16) if large else (64, 32, 32, 8)
    hidden = [4 * dim, 2 * dim, 4 * dim, 8 * dim] if large else [64, 512, 128, 384]
    torch.manual_seed(seed)
    model = GPT(vocab, dim, hidden, seq).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(seed)).to(device)

    def step() -> Any:
        optimizer.zero_grad(set_to_none=True)
        logits = model(data[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.detach()

    return model, optimizer, step, data


BREAKS_SOURCE = """
import torch

def body(x):
    x = torch.relu(x) + 1
    print("inside the compiled step")  # BREAK print
    x = x * 2
    scale = x.abs().max().item()  # BREAK item
    return x / (scale + 1)
"""


class Run:
    """What the checks share: device, output folder, artifacts and results."""

    def __init__(self, out: Path, cpu: bool, deadline_s: float) -> None:
        import torch

        self.out = out
        self.cuda = torch.cuda.is_available() and not cpu
        self.device = "cuda" if self.cuda else "cpu"
        self.large = self.cuda
        self.artifacts: list[Path] = []
        self.results: list[dict[str, Any]] = []
        self.started = time.perf_counter()
        self.deadline_s = deadline_s
        self.shared: dict[str, Any] = {}

    def needs_cuda(self, what: str) -> None:
        if not self.cuda:
            raise NotRun(
                f"{what} needs CUDA ({'--cpu given' if torch_has_cuda() else 'no CUDA device here'})"
            )

    def synchronize(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def run(self, name: str, reference: str, body: Callable[[Check], None]) -> None:
        check = Check(name, reference)
        start = time.perf_counter()
        status, why = "passed", ""
        if start - self.started > self.deadline_s:
            status, why = "not run", f"the run's deadline of {self.deadline_s:.0f} s was reached"
        else:
            try:
                body(check)
                if check.problems:
                    status, why = "failed", "; ".join(check.problems)
            except NotRun as exc:
                status, why = "not run", str(exc)
            except Exception as exc:  # a check's crash is its result, never the end of the run
                status = "failed"
                why = f"{type(exc).__name__}: {exc}"
                check.record(traceback=traceback.format_exc(limit=6)[-3000:])
        if check.remarks:
            check.record(remarks=check.remarks)
        self.results.append(
            {
                "check": name,
                "status": status,
                "why": why,
                "numbers": check.numbers,
                "reference": reference,
                "seconds": round(time.perf_counter() - start, 2),
            }
        )
        print(
            f"[gpu-truth] {status:8s} {name} ({time.perf_counter() - start:.1f} s){': ' + why if why else ''}"
        )
        sys.stdout.flush()


def torch_has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def fresh_peak(run: Run) -> Iterator[None]:
    if run.cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    yield
    run.synchronize()


def memtracker_total(device: str, model: Any, optimizer: Any, data: Any, step: Callable[[], Any]) -> int:
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, optimizer, data)
    with tracker:
        step()
    return int(
        tracker.get_tracker_snapshot("peak")[torch.device(device if device == "cpu" else "cuda:0")]["Total"]
    )


def within(a: float, b: float, rel: float, floor: float = 0.0) -> bool:
    return abs(a - b) <= max(rel * abs(b), floor)


# ------------------------------------------------------------------------------------ checks
def check_memory_timeline(run: Run, dtype: str) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        import torch

        import nbtoolkit as nbt

        model, optimizer, step, data = gpt(run.device, large=run.large)
        timed = step
        if dtype == "bf16":

            def timed() -> Any:
                with torch.autocast(run.device, dtype=torch.bfloat16):
                    return step()

        timed()  # optimizer state exists, as in every later step
        with fresh_peak(run):
            timeline = nbt.memory_timeline(timed, 1, model=model, optimizer=optimizer)
        peaks = timeline.category_peaks().set_index("category")["at_peak_bytes"]
        total = int(timeline.peak_bytes)
        categories = int(peaks.drop(labels=["total"], errors="ignore").sum())
        check.record(timeline_total_peak=total, categories_at_peak=categories, device=timeline.device)
        check.expect(categories == total, f"categories at the peak add to {categories}, the total is {total}")
        tracker = memtracker_total(run.device, model, optimizer, data, timed)
        check.record(memtracker_total=tracker)
        check.expect(within(total, tracker, 0.05, 256 * 1024), f"total {total} vs MemTracker {tracker}")
        if run.cuda:
            with fresh_peak(run):
                timed()
            cuda_peak = int(torch.cuda.max_memory_allocated())
            check.record(cuda_max_memory_allocated=cuda_peak)
            check.expect(
                within(total, cuda_peak, 0.03, 2 * 1024**2),
                f"total {total} vs max_memory_allocated {cuda_peak}",
            )
            if timeline.allocator_snapshot is not None:
                run.shared["timeline_snapshot"] = timeline.allocator_snapshot
        run.shared.setdefault("timelines", {})[dtype] = timeline

    return body


def check_snapshot(run: Run) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        import pickle
        from contextlib import redirect_stdout

        from torch.cuda import _memory_viz

        import nbtoolkit as nbt

        def memory_viz_lines(data: dict[str, Any]) -> list[str]:
            with redirect_stdout(io.StringIO()):
                text = _memory_viz.segsum(data)
            return [line for line in text.splitlines() if line.startswith(("segments:", "total_"))]

        timeline = run.shared.get("timelines", {}).get("fp32")
        if timeline is None:
            raise NotRun("check 1 (fp32 memory timeline) did not produce a timeline")
        exported = nbt.export_memory_snapshot(timeline, run.out / "exported_snapshot.pickle")
        run.artifacts.append(exported)
        ours = nbt.load_memory_snapshot(exported).stats().lines()
        theirs = memory_viz_lines(pickle.loads(exported.read_bytes()))
        check.record(exported_stats=ours, exported_memory_viz=theirs)
        check.expect(ours == theirs, "exported snapshot: our stats differ from memory_viz's")
        if not run.cuda:
            check.remarks.append("the snapshot torch records itself needs CUDA: only the export was compared")
            return
        import torch

        _model, _optimizer, step, _ = gpt(run.device, seed=1, large=run.large)
        step()
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        try:
            for _ in range(2):
                step()
            run.synchronize()
            recorded = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        path = run.out / "torch_snapshot.pickle"
        path.write_bytes(pickle.dumps(recorded))
        run.artifacts.append(path)
        ours = nbt.load_memory_snapshot(path).stats().lines()
        theirs = memory_viz_lines(recorded)
        check.record(recorded_stats=ours, recorded_memory_viz=theirs, recorded_bytes=path.stat().st_size)
        check.expect(ours == theirs, "torch's own snapshot: our stats differ from memory_viz's")

    return body


def check_plan_recompute(run: Run) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        import torch

        import nbtoolkit as nbt
        from nbtoolkit.recompute.checkpoint import checkpoint_blocks

        model, _optimizer, step, _data = gpt(run.device, large=run.large)
        names = [f"blocks.{i}" for i in range(len(model.blocks))]
        steps = 3 if run.cuda else 2
        front = nbt.plan_recompute(model, step, None, steps=steps)
        lowest, highest = int(front.tradeoff["predicted_peak_bytes"].min()), front.baseline_peak_bytes
        check.record(checkpoint_all_bytes=lowest, checkpoint_none_bytes=highest)
        budgets: dict[str, Any] = {"between": int(lowest + 0.5 * (highest - lowest))}
        if run.cuda:
            budgets["90%"] = "90%"
        else:
            check.remarks.append('"90%" is a share of a GPU\'s memory: only the byte budget runs on the CPU')
        for label, budget in budgets.items():
            plan = nbt.plan_recompute(model, step, budget, steps=steps)
            measured = plan.measured_peak_bytes
            check.record(
                **{
                    f"{label}_budget_bytes": plan.budget_bytes,
                    f"{label}_blocks": plan.blocks,
                    f"{label}_measured_peak_bytes": measured,
                }
            )
            check.expect(
                measured is not None and measured <= plan.budget_bytes,
                f"{label}: measured peak {measured} over the budget {plan.budget_bytes}",
            )
            if run.cuda:
                fresh_model, _, fresh_step, _ = gpt(run.device, seed=2, large=run.large)
                with plan.apply(fresh_model):
                    fresh_step()
                    with fresh_peak(run):
                        fresh_step()
                    cuda_peak = int(torch.cuda.max_memory_allocated())
                check.record(**{f"{label}_cuda_max_memory_allocated": cuda_peak})
                check.expect(
                    cuda_peak <= plan.budget_bytes, f"{label}: max_memory_allocated {cuda_peak} over budget"
                )
            plain, planned = (
                gpt(run.device, seed=3, large=run.large),
                gpt(run.device, seed=3, large=run.large),
            )
            with plan.apply(planned[0]):
                pairs = [(float(plain[2]()), float(planned[2]())) for _ in range(3)]
            check.record(**{f"{label}_losses": pairs})
            check.expect(
                all(abs(a - b) <= 1e-3 * max(1.0, abs(a)) for a, b in pairs), f"{label}: losses changed"
            )
            if label == "between" and len(plan.blocks) < len(names):
                mine, everything = (
                    gpt(run.device, seed=4, large=run.large),
                    gpt(run.device, seed=4, large=run.large),
                )
                with plan.apply(mine[0]), checkpoint_blocks(everything[0], names):
                    times = interleaved(
                        {"plan": mine[2], "all": everything[2]}, run, rounds=9 if run.cuda else 5
                    )
                check.record(step_s_plan=times["plan"], step_s_checkpoint_all=times["all"])
                if run.cuda:
                    check.expect(
                        times["plan"] < times["all"], "the plan is not faster than checkpointing every block"
                    )
                else:
                    check.remarks.append("plan vs checkpoint-all timed but not judged on a shared CPU")
        run.shared["plan_budget"] = budgets["90%" if run.cuda else "between"]

    return body


def check_offload(run: Run) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        import torch

        from nbtoolkit.recompute.selective import apply_choices

        if not run.cuda:
            raise NotRun(
                "offload moves saved activations from GPU to host memory: the planner offers it on CUDA only"
            )
        peaks: dict[str, int] = {}
        losses: dict[str, float] = {}
        for choice in ("keep", "offload"):
            model, _optimizer, step, _data = gpt(run.device, seed=5, large=run.large)
            blocks = {f"blocks.{i}": block for i, block in enumerate(model.blocks)}
            with apply_choices(blocks, dict.fromkeys(blocks, choice)):
                step()
                with fresh_peak(run):
                    losses[choice] = float(step())
                peaks[choice] = int(torch.cuda.max_memory_allocated())
        check.record(keep_peak_bytes=peaks["keep"], offload_peak_bytes=peaks["offload"], losses=losses)
        check.expect(peaks["offload"] <= peaks["keep"], "offloading every block raised max_memory_allocated")
        same = abs(losses["keep"] - losses["offload"]) <= 1e-3 * max(1.0, abs(losses["keep"]))
        check.expect(same, "offload changed the loss")

    return body


def _fit_stack() -> Any:
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(2048, 8192), torch.nn.Linear(8192, 2048)

        def forward(self, x: Any) -> Any:
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(8))

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = block(x)
            return x

    return Stack()


def _fit_batch(micro_batch: int) -> Any:
    import torch

    return torch.randn(micro_batch, 2048), torch.randn(micro_batch, 2048)


def _fit_measured_peak(run: Run, recompute: str, amp: str, micro: int) -> int:
    """torch.cuda.max_memory_allocated over check 10's second real step (AdamW's state exists from
    the first), beyond what was allocated before the model."""
    import torch

    from nbtoolkit.recompute.checkpoint import checkpoint_modules

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    model = _fit_stack().to(run.device)
    if recompute == "all":
        checkpoint_modules({str(i): b for i, b in enumerate(model.blocks)})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = (t.to(run.device) for t in _fit_batch(micro))

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp == "bf16"):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    with fresh_peak(run):
        step()
    return int(torch.cuda.max_memory_allocated()) - base


def check_fit(run: Run) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        import torch

        import nbtoolkit as nbt
        from nbtoolkit.capacity.cards import Card

        if not run.cuda:
            raise NotRun(
                "CUDA only: nbt.fit predicts a GPU allocator's peak (on the CPU it is checked against real "
                "ranks by tests/cluster/test_fit_verify.py)"
            )
        props = torch.cuda.get_device_properties(0)
        card = Card(name=props.name, memory_bytes=int(props.total_memory), flops={"fp32": 1e14, "bf16": 1e15},
                    intra_node_Bps=1e11, source="torch.cuda.get_device_properties (flops: placeholders)")
        micro = 4096
        fit = nbt.fit(_fit_stack, _fit_batch, (1, card), strategies="ddp", recompute=("none", "all"),
                      micro_batches=(micro,), amp=("bf16", None))
        for _, row in fit.frame.iterrows():
            measured = _fit_measured_peak(run, str(row["recompute"]), str(row["amp"]), micro)
            predicted = int(row["predicted_peak_bytes"])
            name = f"{row['amp']}_{row['recompute']}"
            check.record(**{f"{name}_predicted_bytes": predicted, f"{name}_measured_bytes": measured,
                            f"{name}_needed_bytes": int(row["needed_bytes"])})
            check.expect(within(predicted, measured, 0.10),
                         f"{name}: predicted {predicted} bytes, measured {measured} (more than 10% apart)")
        check.record(card_memory_bytes=card.memory_bytes)

    return body


def interleaved(steps: dict[str, Callable[[], Any]], run: Run, rounds: int) -> dict[str, float]:
    """Median seconds per step of each, measured A B A B ... (CUDA events on a GPU)."""
    import torch

    for step in steps.values():
        step()  # warm
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            if run.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / 1000)
            else:
                begin = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - begin)
    return {name: statistics.median(values) for name, values in times.items()}


def check_optimize(run: Run) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        import nbtoolkit as nbt

        budget = run.shared.get("plan_budget")
        if budget is None:
            raise NotRun("check 3 (plan_recompute) gave no budget")
        optimized, plain = gpt(run.device, seed=5, large=run.large), gpt(run.device, seed=5, large=run.large)
        if run.cuda:
            compile_: Any = True  # inductor, as users run it
            measure = nbt.MeasureConfig(metrics=False)
        else:
            # inductor's CPU compile of forward and backward takes minutes on a shared 2-core
            # machine; aot_eager runs the same dynamo/AOT path, so the plumbing is proven
            compile_ = {"backend": "aot_eager"}
            measure = nbt.MeasureConfig(steps=3, warmup=1, categories=False, metrics=False)
            check.remarks.append("CPU mode compiles with aot_eager (inductor on the GPU)")
        result = nbt.optimize(
            optimized[0],
            optimized[2],
            compile=compile_,
            recompute="auto",
            budget_bytes=budget,
            amp="bf16",
            undo=False,
            config=measure,
        )
        claimed = result.before.step_time_s / result.after.step_time_s
        check.record(
            claimed_speedup=claimed,
            before_s=result.before.step_time_s,
            after_s=result.after.step_time_s,
            changes=result.changes,
        )
        times = interleaved({"before": plain[2], "after": optimized[2]}, run, rounds=15 if run.cuda else 5)
        measured = times["before"] / times["after"]
        check.record(
            remeasured_speedup=measured,
            remeasured_before_s=times["before"],
            remeasured_after_s=times["after"],
            timer="CUDA events" if run.cuda else "perf_counter",
        )
        if run.cuda:
            check.expect(
                within(claimed, measured, 0.15), f"claimed {claimed:.2f}x, re-measured {measured:.2f}x"
            )
        else:
            check.remarks.append("claimed and re-measured ratios recorded; not judged on a shared CPU")

    return body


def check_step_metrics(run: Run) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        import torch

        import nbtoolkit as nbt

        n = 8192 if run.cuda else 512
        dtype = torch.bfloat16 if run.cuda else torch.float32
        a = torch.randn(n, n, device=run.device, dtype=dtype)
        b = torch.randn(n, n, device=run.device, dtype=dtype)

        def matmuls() -> None:
            for _ in range(8):
                torch.mm(a, b)

        metrics = nbt.step_metrics(matmuls, steps=5, warmup=2)
        check.record(
            peak_flops=metrics.peak_flops,
            peak_source=metrics.peak_source,
            mfu=metrics.mfu,
            device_name=metrics.device_name,
            dtype=metrics.dtype,
            model_flops=metrics.model_flops,
            achieved_flops_per_s=metrics.flops_per_s,
        )
        check.expect(
            metrics.model_flops == 8 * 2 * n**3,
            f"counted {metrics.model_flops} FLOPs, expected {8 * 2 * n**3}",
        )
        if run.cuda or metrics.mfu is not None:
            check.expect(
                metrics.mfu is not None and 0 < metrics.mfu <= 1.0, f"MFU {metrics.mfu} outside (0, 100%]"
            )
        else:  # a CPU peak measured while the machine was busy and beaten twice: no MFU, the reason instead
            check.remarks.append(f"MFU not available: {metrics.mfu_unavailable}")
        if run.cuda:
            check.expect(
                metrics.peak_source.startswith("table"),
                f"peak from {metrics.peak_source!r}, not the card's table",
            )
            check.expect(
                metrics.mfu is not None and metrics.mfu >= 0.3,
                f"MFU {metrics.mfu} of a dense bf16 GEMM is implausibly low",
            )
        else:
            check.expect(
                "measured" in metrics.peak_source,
                f"CPU peak source {metrics.peak_source!r} not labelled measured",
            )

    return body


def check_profile(run: Run) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        import nbtoolkit as nbt

        _model, _optimizer, step, _ = gpt(run.device, seed=6, large=run.large)
        path = run.out / "profile_trace.json"
        trace = nbt.profile(step, steps=3, warmup=1, record_shapes=True, trace_path=path)
        gz = _gzip(path)
        run.artifacts.append(gz)
        rank = trace.ranks[0]
        events = trace.rank_events(rank)
        device_rows = events[events["stream"] >= 0]
        check.record(
            events=len(events),
            device_events=len(device_rows),
            streams=sorted(int(s) for s in device_rows["stream"].unique()),
        )
        if run.cuda:
            check.expect(len(device_rows) > 0, "no kernel on any stream")
            launches = (
                events["name"].astype(str).str.contains("cudaLaunchKernel|cuLaunchKernel", regex=True).sum()
            )
            check.record(kernel_launches=int(launches))
            check.expect(launches > 0, "no kernel launch on the host")
        for name, fn in (
            ("temporal_breakdown", nbt.temporal_breakdown),
            ("kernel_breakdown", nbt.kernel_breakdown),
            ("idle_breakdown", nbt.idle_breakdown),
        ):
            try:
                result = fn(trace)
                check.record(**{name: repr(result)[:600]})
            except nbt.NbtError as exc:
                if run.cuda:
                    check.expect(False, f"{name}: {exc}")
                else:
                    check.remarks.append(f"{name} on a CPU trace: {exc}")
        path_result = nbt.critical_path(trace)
        check.record(critical_path=repr(path_result)[:400])
        roof = nbt.roofline(trace)
        check.record(roofline=repr(roof)[:400])
        run.shared["trace"] = trace

    return body


def check_graphs(run: Run) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        import importlib.util

        import torch

        import nbtoolkit as nbt

        module_path = run.out / "graph_breaks_model.py"
        module_path.write_text(BREAKS_SOURCE)
        spec = importlib.util.spec_from_file_location("gpu_truth_breaks", module_path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        expected = sorted(i + 1 for i, line in enumerate(BREAKS_SOURCE.splitlines()) if "# BREAK" in line)
        found: dict[str, list[tuple[str, int]]] = {}
        for device in ["cpu", "cuda"] if run.cuda else ["cpu"]:
            torch._dynamo.reset()
            compiled = torch.compile(module.body, backend="inductor")
            x = torch.randn(64, 64, device=device)
            with contextlib.redirect_stdout(io.StringIO()):
                report = nbt.capture_graphs(compiled, x, steps=1)
            found[device] = sorted((str(r.gb_type), int(r.user_line)) for r in report.breaks.itertuples())
            check.record(**{f"{device}_breaks": found[device], f"{device}_graphs": len(report.graphs)})
            check.expect(
                sorted({line for _, line in found[device]}) == expected,
                f"{device}: breaks at {found[device]}, the code marks lines {expected}",
            )
        if run.cuda:
            check.expect(found["cuda"] == found["cpu"], "the device's breaks differ from the CPU's")

    return body


def check_timeline_lod(run: Run) -> Callable[[Check], None]:
    def body(check: Check) -> None:
        from nbtoolkit.trace.timeline_index import trace_timeline_index

        trace = run.shared.get("trace")
        if trace is None:
            raise NotRun("check 6 (profile) gave no trace")
        index = trace_timeline_index(trace)
        index.finish()
        total_rows = sum(len(frame) for frame in trace.events.values())
        check.record(lanes=len(index.lanes), indexed_events=index.events, trace_events=total_rows)
        device_lanes = [lane for lane in index.lanes if lane.stream >= 0]
        check.record(device_lanes=len(device_lanes))
        if run.cuda:
            check.expect(bool(device_lanes), "no kernel lane in the timeline")
        counted = 0
        for lane in index.lanes:
            if not len(lane.index):
                continue
            t0, t1 = lane.index.start, lane.index.end
            t1 = max(t1, t0 + 0.001)
            view = lane.index.view(t0 - 1, t1 + 1, 800)
            counted += int(view.agg_count.sum())  # aggregate bins count every event, long ones included
            middle = (t0 + t1) / 2
            tiny = lane.index.view(middle, middle + 0.001, 800)  # a 1 ns window
            check.expect(tiny.rectangles >= 0, "a 1 ns window failed")
        check.record(counted_at_full_zoom_out=counted)
        check.expect(counted == index.events, f"full zoom-out counts {counted} of {index.events} events")

    return body


# ------------------------------------------------------------------------------------ output
def _gzip(path: Path) -> Path:
    import gzip
    import shutil

    target = path.with_suffix(path.suffix + ".gz")
    with path.open("rb") as src, gzip.open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return target


def write_archive(run: Run) -> dict[str, Any]:
    """The recorded artifacts as one .tar.gz of at most ARCHIVE_LIMIT bytes; what was left out."""
    archive = run.out / ARCHIVE_NAME
    kept, left = [], []
    budget = ARCHIVE_LIMIT
    for path in sorted(set(run.artifacts), key=lambda p: p.stat().st_size if p.exists() else 0):
        if not path.exists():
            continue
        size = path.stat().st_size
        if size > budget:
            left.append(f"{path.name} ({size} bytes)")
            continue
        kept.append(path)
        budget -= size
    with tarfile.open(archive, "w:gz") as tar:
        for path in kept:
            tar.add(path, arcname=path.name)
    if archive.stat().st_size > ARCHIVE_LIMIT:
        archive.unlink()
        return {"archive": None, "left_out": [p.name for p in kept] + left}
    for path in kept:
        path.unlink()
    return {"archive": archive.name, "archived": [p.name for p in kept], "left_out": left}


def environment(run: Run) -> dict[str, Any]:
    import torch

    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    memory = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    return {
        "mode": "cuda" if run.cuda else "cpu",
        "card": card,
        "card_memory_bytes": memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for gpu_truth.json and the archive")
    parser.add_argument(
        "--cpu", action="store_true", help="run every check on the CPU (what needs CUDA: not run)"
    )
    parser.add_argument(
        "--deadline-s", type=float, default=420.0, help="checks not started by then are not run"
    )
    parser.add_argument(
        "--only",
        action="append",
        help="run only this check: its number (1a, 3) or a word of its name (repeatable)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_TRACE", str(args.out / "torch_trace"))  # compile logs, archived below
    import torch

    run = Run(args.out, args.cpu, args.deadline_s)
    if not run.cuda and not args.cpu:
        print("[gpu-truth] no CUDA device: running the CPU checks (pass --cpu to say so)")
    torch.manual_seed(0)
    checks: list[tuple[str, str, Callable[[Check], None]]] = [
        (
            "1a memory_timeline fp32",
            "torch.cuda.max_memory_allocated; torch MemTracker total",
            check_memory_timeline(run, "fp32"),
        ),
        (
            "1b memory_timeline bf16",
            "torch.cuda.max_memory_allocated; torch MemTracker total",
            check_memory_timeline(run, "bf16"),
        ),
        ("2 allocator snapshot", "torch.cuda._memory_viz segsum (stats)", check_snapshot(run)),
        (
            "3 plan_recompute",
            "torch.cuda.max_memory_allocated under the plan; losses; checkpoint-all timing",
            check_plan_recompute(run),
        ),
        ("4 optimize", "interleaved re-measurement (CUDA events)", check_optimize(run)),
        ("5 step_metrics", "FLOPs of 8 matmuls = 16 n^3; the card's datasheet peak", check_step_metrics(run)),
        ("6 profile", "kernels, streams, launches in torch.profiler's own trace", check_profile(run)),
        (
            "7 capture_graphs inductor",
            "the lines the model marks # BREAK; the CPU's breaks",
            check_graphs(run),
        ),
        (
            "8 timeline level of detail",
            "every event of the trace counted once at full zoom-out",
            check_timeline_lod(run),
        ),
        ("9 offload", "torch.cuda.max_memory_allocated keeping vs offloading; losses", check_offload(run)),
        ("10 fit", "torch.cuda.max_memory_allocated of the predicted configurations", check_fit(run)),
    ]
    for name, reference, body in checks:
        if args.only and not any(
            part == name.split()[0] or part in name.split(" ", 1)[1] for part in args.only
        ):
            continue
        run.run(name, reference, body)
    logs = Path(os.environ["TORCH_TRACE"])
    if logs.is_dir():
        run.artifacts.extend(sorted(logs.glob("*.log"))[:4])
    archive = write_archive(run)
    summary = {
        status: sum(r["status"] == status for r in run.results) for status in ("passed", "failed", "not run")
    }
    document = {"environment": environment(run), "summary": summary, "checks": run.results, **archive}
    (args.out / RESULTS_NAME).write_text(json.dumps(document, indent=2, default=str))
    print(
        f"[gpu-truth] {summary['passed']} passed, {summary['failed']} failed, {summary['not run']} not run "
        f"-> {args.out / RESULTS_NAME}"
    )
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
