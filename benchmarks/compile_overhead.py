"""Compile-time overhead of ``nbt.capture_graphs`` next to plain ``torch.compile``, in one run.

What is compared: the first call of a freshly compiled model (dynamo + backend compile +
one run), plain versus with exactly the handler ``capture_graphs`` attaches to torch's
structured-trace logger (``nbtoolkit.compile.capture._structured_trace_handler``). Runs
alternate plain / instrumented / TORCH_TRACE after ``torch._dynamo.reset()``, after one
discarded warm-up (the first compile in a process loads and caches a lot). Printed per
backend, as ratios instrumented/plain: of the fastest wall times, the median of the
per-pair wall ratios, and the median of the per-pair CPU-time ratios (``process_time``:
the least disturbed by other processes on a shared machine; the verdict uses it; for
inductor it leaves out work in compile subprocesses, which the handler does not touch).
For context: the CPU ratio of torch's own TORCH_TRACE file handler (the cost any
structured trace has), and the time nbtoolkit then spends parsing the records (after the
call, not part of compile time). Target: ratio <= 1.10.

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
from collections.abc import Callable

import torch
from torch import nn


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


Timing = tuple[float, float]  # (wall s, CPU s of this process)


def _timed(call: Callable[[], object]) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def first_call_plain(model: nn.Module, x: torch.Tensor, backend: str) -> Timing:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    return _timed(lambda: compiled(x))


def first_call_instrumented(model: nn.Module, x: torch.Tensor, backend: str) -> tuple[Timing, float, int]:
    """The first call under capture_graphs' instrumentation; then the parse time (s) and graph count."""
    from nbtoolkit.compile.capture import _structured_trace_handler
    from nbtoolkit.compile.log_events import CompileEventParser

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with _structured_trace_handler() as collector:  # exactly what capture_graphs attaches
        timing = _timed(lambda: compiled(x))
    start = time.perf_counter()
    parser = CompileEventParser()
    for metadata, payload in collector.records:
        parser.add(metadata, payload)
    graphs = len(parser.frames()["graphs"])
    return timing, time.perf_counter() - start, graphs


def first_call_torch_trace(model: nn.Module, x: torch.Tensor, backend: str, folder: str) -> Timing:
    """The same first call with torch's own TORCH_TRACE file handler attached (what tlparse reads)."""
    from torch._logging import _internal as torch_logging

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    handler = torch_logging.LazyTraceHandler(folder)
    handler.setFormatter(torch_logging.TorchLogsFormatter(trace=True))
    torch_logging.trace_log.addHandler(handler)
    try:
        return _timed(lambda: compiled(x))
    finally:
        torch_logging.trace_log.removeHandler(handler)
        handler.close()


def _paired(a: list[Timing], b: list[Timing], which: int) -> float:
    """Median of the per-pair ratios b/a: neighbours in time share the machine's load."""
    return statistics.median(y[which] / x[which] for x, y in zip(a, b, strict=True))


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
        f"{'backend':<10} {'plain wall':>10} {'nbt/plain: wall min':>20} {'wall paired':>12}"
        f" {'CPU paired':>11} {'TORCH_TRACE/plain CPU':>22} {'parse':>8}  graphs"
    )
    folder = tempfile.mkdtemp(prefix="nbt_compile_overhead_")
    for backend in args.backends.split(","):
        first_call_plain(model, x, backend)  # warm-up, discarded
        first_call_instrumented(model, x, backend)
        plain: list[Timing] = []
        instrumented: list[Timing] = []
        traced: list[Timing] = []
        parse_s: list[float] = []
        graphs = 0
        for _ in range(args.repeats):
            plain.append(first_call_plain(model, x, backend))
            timing, parse, graphs = first_call_instrumented(model, x, backend)
            instrumented.append(timing)
            parse_s.append(parse)
            traced.append(first_call_torch_trace(model, x, backend, folder))
        wall_min = min(t[0] for t in instrumented) / min(t[0] for t in plain)
        cpu_paired = _paired(plain, instrumented, 1)
        verdict = "ok" if cpu_paired <= 1.10 else "OVER 10%"
        print(
            f"{backend:<10} {statistics.median(t[0] for t in plain):>9.3f}s {wall_min:>20.3f}"
            f" {_paired(plain, instrumented, 0):>12.3f} {cpu_paired:>11.3f}"
            f" {_paired(plain, traced, 1):>22.3f} {statistics.median(parse_s) * 1e3:>6.1f}ms"
            f"  {graphs:>6}  {verdict}"
        )
    shutil.rmtree(folder, ignore_errors=True)
    torch._dynamo.reset()


if __name__ == "__main__":
    main()
