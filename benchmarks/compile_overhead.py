"""Compile-time overhead of ``nbt.capture_graphs`` next to plain ``torch.compile``, in one run.

What is compared: the wall time of the first call of a freshly compiled model (dynamo +
backend compile + one run), plain versus under ``capture_graphs(..., steps=0)`` (which
attaches the structured-trace handler and runs the call once). Runs alternate plain /
instrumented after ``torch._dynamo.reset()``, after one discarded warm-up of each (the
first compile in a process loads and caches a lot). Printed per backend: the ratio of the
fastest runs (least disturbed by other processes on a shared machine; the verdict uses it)
and the ratio of the medians; for context also the ratio with torch's own TORCH_TRACE file
handler attached instead (the cost any structured trace has). Target: ratio <= 1.10.

The overhead is torch's own: with a handler on ``torch.__trace`` torch builds every
structured record (chromium events, guards, bytecode and graph dumps) exactly as it does
for ``TORCH_TRACE``; nbtoolkit only keeps the records in memory and parses them after the
call.

    .venv/bin/python benchmarks/compile_overhead.py [--repeats 5] [--backends eager,aot_eager,inductor]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import torch
from torch import nn

import nbtoolkit as nbt


class Block(nn.Module):
    """A small MLP block with two graph breaks (a print and an .item()): three graphs per call."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)
        self.c = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.a(x))
        print("", end="")  # graph break
        x = self.norm(self.b(x))
        scale = x.abs().mean().item()  # graph break
        return torch.tanh(self.c(x)) * scale


def first_call_plain(model: nn.Module, x: torch.Tensor, backend: str) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    start = time.perf_counter()
    compiled(x)
    return time.perf_counter() - start


def first_call_instrumented(model: nn.Module, x: torch.Tensor, backend: str) -> tuple[float, int]:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    report = nbt.capture_graphs(compiled, x, steps=0)
    assert report.first_call_s is not None
    return report.first_call_s, len(report.graphs)


def first_call_torch_trace(model: nn.Module, x: torch.Tensor, backend: str, folder: str) -> float:
    """The same first call with torch's own TORCH_TRACE file handler attached (what tlparse reads)."""
    from torch._logging import _internal as torch_logging

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    handler = torch_logging.LazyTraceHandler(folder)
    handler.setFormatter(torch_logging.TorchLogsFormatter(trace=True))
    torch_logging.trace_log.addHandler(handler)
    try:
        start = time.perf_counter()
        compiled(x)
        return time.perf_counter() - start
    finally:
        torch_logging.trace_log.removeHandler(handler)
        handler.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", default="eager,aot_eager,inductor")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(32, 64)
    print(f"first call of a compiled model with 2 graph breaks, {args.repeats} alternating runs each")
    print(
        f"{'backend':<10} {'plain min':>10} {'nbt min':>10} {'ratio':>7} {'median ratio':>13}"
        f" {'TORCH_TRACE ratio':>18}  graphs"
    )
    folder = tempfile.mkdtemp(prefix="nbt_compile_overhead_")
    for backend in args.backends.split(","):
        first_call_plain(model, x, backend)  # warm-up, discarded
        first_call_instrumented(model, x, backend)
        plain, instrumented, traced = [], [], []
        graphs = 0
        for _ in range(args.repeats):
            plain.append(first_call_plain(model, x, backend))
            seconds, graphs = first_call_instrumented(model, x, backend)
            instrumented.append(seconds)
            traced.append(first_call_torch_trace(model, x, backend, folder))
        p, i, t = min(plain), min(instrumented), min(traced)
        median_ratio = statistics.median(instrumented) / statistics.median(plain)
        verdict = "ok" if i / p <= 1.10 else "OVER 10%"
        print(
            f"{backend:<10} {p:>9.3f}s {i:>9.3f}s {i / p:>7.3f} {median_ratio:>13.3f} {t / p:>18.3f}"
            f"  {graphs:>6}  {verdict}"
        )
    shutil.rmtree(folder, ignore_errors=True)
    torch._dynamo.reset()


if __name__ == "__main__":
    main()
