"""Counting a compiled step's FLOPs leaves it compiled: the compiled graph runs again after.

Found by walkthrough 05: a compiled forward first called under torch's FlopCounterMode was
marked by dynamo to run eagerly for good, so every later measurement of the "compiled" side
was an eager one.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from nbtoolkit.metrics.flop_count import count_step_flops


@pytest.fixture(scope="module", autouse=True)
def _torch_compile_initialised() -> None:
    """torch's first compile in a process removes its idle LazyTraceHandler (a one-time init, not
    something nbtoolkit leaves behind): compile once before the per-test handler check."""
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    torch._dynamo.reset()


def test_a_compiled_step_runs_its_graph_again_after_its_flops_are_counted() -> None:
    torch._dynamo.reset()
    graph_calls = []

    def counting_backend(graph_module, example_inputs):  # the graph dynamo made, called per step
        def run(*args):
            graph_calls.append(1)
            return graph_module.forward(*args)

        return run

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compiled = torch.compile(model, backend=counting_backend)
    inputs = torch.randn(8, 16)

    def step() -> float:
        loss = compiled(inputs).square().mean()
        loss.backward()
        return float(loss)

    step()
    assert len(graph_calls) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counts = count_step_flops(step)
    assert counts.model_flops > 0  # the eager ops were counted
    before = len(graph_calls)
    step()
    step()
    assert len(graph_calls) == before + 2, "the compiled graph no longer runs after FLOP counting"
    torch._dynamo.reset()
