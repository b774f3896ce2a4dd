"""A graph break costs only the eager code it causes: never the backward pass, compiling or zero_grad.

Real torch.compile and the real profiler on a small MLP (CPU). The backward pass is most of
this step; a break at or before ``loss.backward()`` must not be billed for it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.compile.break_cost import region_eager_us
from nbtoolkit.compile.report import GraphReport

from ._hf import small_llama


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]), torch.randn(64, 256)


MODEL, X = _mlp()


def step_with_item_check() -> torch.Tensor:
    loss = MODEL(X).pow(2).mean()
    if loss.item() > 1e9:  # a .item() break before backward()
        print("loss exploded")
    loss.backward()
    return loss.detach()


def step_plain() -> torch.Tensor:
    loss = MODEL(X).pow(2).mean()
    loss.backward()
    return loss.detach()


def _backward_share() -> float:
    """The backward pass's share of this eager step, timed here (median of interleaved runs)."""
    forward, backward = [], []
    for _ in range(7):
        t0 = time.perf_counter()
        loss = MODEL(X).pow(2).mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        forward.append(t1 - t0)
        backward.append(t2 - t1)
    return statistics.median(backward) / (statistics.median(forward) + statistics.median(backward))


def _cost_of(report: GraphReport, gb_type_part: str) -> float:
    summary = report.break_summary()
    rows = summary[summary["gb_type"].str.contains(gb_type_part, regex=False)]
    assert len(rows) == 1, summary[["gb_type", "user_line"]]
    return float(rows["eager_us_per_step"].iloc[0])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_break_before_backward_is_not_billed_for_the_backward_pass(backend: str) -> None:
    with_item = nbt.capture_graphs(
        torch.compile(step_with_item_check, backend=backend), steps=4, eager_baseline=False
    )
    torch._dynamo.reset()
    plain = nbt.capture_graphs(torch.compile(step_plain, backend=backend), steps=4, eager_baseline=False)
    backward_share = _backward_share()
    assert backward_share > 0.3  # the step this test needs: the backward pass is a large part of it

    for report in (with_item, plain):
        assert report.profiled_step_time_s and report.eager_between_graphs_s is not None
        share = report.eager_between_graphs_s / report.profiled_step_time_s
        # the breaks' own eager code is a small share of the step, far below the backward's share
        assert share < min(0.1, backward_share / 4), (share, backward_share, repr(report))
    # the backward() break costs about the same with and without the .item() break before it
    step = plain.profiled_step_time_s or 0.0
    difference = abs(_cost_of(with_item, "Tensor.backward()") - _cost_of(plain, "Tensor.backward()"))
    assert difference < 0.05 * step * 1e6
    assert _cost_of(with_item, "Tensor.item()") > 0


def _event(name: str, start: float, end: float, children: list[Any] | None = None, thread: int = 1) -> Any:
    return SimpleNamespace(
        name=name,
        time_range=SimpleNamespace(start=start, end=end),
        cpu_children=children or [],
        thread=thread,
    )


ENGINE = "autograd::engine::evaluate_function: "


def test_region_arithmetic_leaves_out_backward_compiles_zero_grad_and_nested_regions() -> None:
    """A region's eager time, by hand: [0, 1000] with a 2-op graph ending at 100."""
    children = [
        _event("aten::mm", 0, 50),
        _event("aten::relu", 50, 100),  # graph ends here (op count 2)
        _event("aten::item", 110, 120),  # the break's own code: 100-200 counts (100 µs)
        _event("aten::ones_like", 200, 210),  # backward() starts: 200-500 is the backward pass
        _event(ENGINE + "MmBackward0", 230, 400),
        _event(ENGINE + "torch::autograd::AccumulateGrad", 410, 500),
        _event("_compile.compile_inner (dynamo_timed)", 520, 700),  # a recompile: not the break's
        _event("Optimizer.zero_grad#SGD.zero_grad", 720, 760),  # always eager: not the break's
        _event("TorchDynamo Cache Lookup", 800, 810),
        _event("Torch-Compiled Region: 1/0", 810, 990),  # the next graph
    ]
    region = _event("Torch-Compiled Region: 0/0", 0, 1000, children)
    # counted: 100-200, 500-520, 700-720, 760-800, 990-1000
    assert region_eager_us(region, op_count=2) == pytest.approx(100 + 20 + 20 + 40 + 10)


def test_a_backward_on_autograd_s_device_thread_is_left_out_too() -> None:
    """A device's backward runs on autograd's worker thread: the calling thread just waits."""
    children = [_event("aten::add", 0, 100), _event("aten::ones_like", 150, 160)]
    region = _event("Torch-Compiled Region: 0/0", 0, 1000, children)
    worker = [_event(ENGINE + "AddBackward0", 200, 600, thread=7), _event(ENGINE + "X", 610, 900, thread=7)]
    assert region_eager_us(region, op_count=1, other_thread_engine=worker) == pytest.approx(50 + 100)
    assert region_eager_us(region, op_count=1) == pytest.approx(900)  # what it would be billed without


def _twenty_matmuls(x: torch.Tensor) -> torch.Tensor:
    for _ in range(20):
        x = torch.tanh(x @ x.T)
    return x


twenty_matmuls_disabled = torch.compiler.disable(_twenty_matmuls)


def chunked_then_disabled(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2)  # the two getitem nodes of this unpacking run no op
    y = torch.cat([a * b + 1, a], dim=0)
    return twenty_matmuls_disabled(y).sum()  # the break: 40 ops run eagerly


def test_the_graph_s_end_comes_from_the_ops_it_ran_not_torch_s_op_count() -> None:
    """torch logs 6 ops for this graph (chunk, 2 getitem, mul, add, cat); it runs 4."""
    from torch.profiler import ProfilerActivity, profile

    from nbtoolkit.compile.break_cost import REGION, graph_op_counts

    x = torch.randn(64, 64)
    compiled = torch.compile(chunked_then_disabled, backend="eager")
    # compiled inside the capture: a compile outside it would change torch's logging under pytest
    report = nbt.capture_graphs(compiled, x, steps=0)
    logged = int(report.graphs.loc[report.graphs["frame_id"] == 0, "op_count"].iloc[0])
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as with_stacks:
        compiled(x)
    ran = graph_op_counts(list(with_stacks.events()))["0/0"]
    assert (logged, ran) == (6, 4)
    with profile(activities=[ProfilerActivity.CPU]) as plain:
        compiled(x)
    region = next(e for e in plain.events() if e.name == REGION + "0/0")
    ops = [
        c.name
        for c in sorted(region.cpu_children, key=lambda e: e.time_range.start)
        if c.name.startswith("aten::")
    ]
    assert ops[:4] == ["aten::chunk", "aten::mul", "aten::add", "aten::cat"]
    # with torch's count the graph would "end" two ops into the disabled function's eager work
    assert region_eager_us(region, ran) > region_eager_us(region, logged)


@pytest.mark.slow
def test_on_a_small_llama_the_item_check_before_backward_costs_a_small_share() -> None:
    """The case users met: a Llama step with a loss.item() check before backward() (44% of a step before)."""
    model = small_llama(hidden_size=64)
    ids = torch.randint(0, 128, (2, 16))

    def step() -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        if loss.item() > 1e9:
            print("loss exploded")
        loss.backward()
        return loss.detach()

    report = nbt.capture_graphs(torch.compile(step, backend="eager"), steps=3, eager_baseline=False)
    assert report.profiled_step_time_s and report.eager_between_graphs_s is not None
    share = report.eager_between_graphs_s / report.profiled_step_time_s
    assert share < 0.05, repr(report)
    assert _cost_of(report, "Tensor.item()") < 0.02 * report.profiled_step_time_s * 1e6
