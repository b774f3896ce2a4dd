"""nbt.profile and %%nbt profile on CPU: a real torch.profiler run feeding a Trace."""

from __future__ import annotations

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.errors import NbtUsageError


def _train_step():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    return step


def test_profile_returns_a_trace_with_one_step_per_call():
    trace = nbt.profile(_train_step(), steps=3, warmup=1)
    assert isinstance(trace, nbt.Trace)
    assert trace.ranks == [0]
    assert list(trace.steps["step"]) == [0, 1, 2]
    assert (trace.steps["dur"] > 0).all()
    assert isinstance(trace.value, float)
    names = set(trace.events[0]["name"].astype(str))
    assert "aten::addmm" in names
    ops = trace.top_operators(5)
    assert len(ops) == 5 and (ops["self_us"] <= ops["total_us"] + 1e-9).all()
    text = repr(trace)
    assert "Step times (ms)" in text and "Top operators by self CPU time" in text
    assert trace.device_type == "cpu"
    assert not trace._notes()  # a profiled trace has no "rank unknown" note


def test_profile_stops_the_profiler_on_exception():
    calls = []

    def failing():
        calls.append(1)
        if len(calls) == 2:
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        nbt.profile(failing, steps=3, warmup=1)
    assert not torch.autograd.profiler._is_profiler_enabled


def test_profile_stops_the_profiler_on_keyboard_interrupt():
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        nbt.profile(interrupted, steps=2, warmup=0)
    assert not torch.autograd.profiler._is_profiler_enabled


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"warmup": -1}, {"steps": "3"}])
def test_profile_rejects_bad_arguments(kwargs):
    with pytest.raises(NbtUsageError):
        nbt.profile(lambda: None, **kwargs)


def test_profile_keeps_the_chrome_trace_when_asked(tmp_path):
    out = tmp_path / "prof" / "step.json"
    trace = nbt.profile(lambda: torch.ones(8) * 2, steps=2, warmup=0, trace_path=out)
    assert out.exists()
    again = nbt.load_trace(out)
    assert len(again.events[0]) == len(trace.events[0])


def test_cell_magic_profile(shell):
    shell.user_ns["torch"] = torch
    result = shell.run_cell(
        "%%nbt profile --steps 2 --warmup 0 --name prof\nx = torch.randn(64, 64)\nx @ x\n"
    )
    assert result.success, result.error_in_exec
    trace = shell.user_ns["prof"]
    assert isinstance(trace, nbt.Trace)
    assert list(trace.steps["step"]) == [0, 1]
    assert trace.value.shape == (64, 64)
    bundle = trace._repr_mimebundle_()
    assert "text/plain" in bundle and "Step times" in bundle["text/plain"]
    assert shell.user_ns["x"].shape == (64, 64)  # the cell ran in the user namespace


def test_cell_magic_profile_error_leaves_no_profiler(shell):
    result = shell.run_cell("%%nbt profile --steps 2\nraise ValueError('in the cell')\n")
    assert not result.success
    assert isinstance(result.error_in_exec, ValueError)
    assert not torch.autograd.profiler._is_profiler_enabled


def test_cell_magic_profile_with_memory_and_shapes(shell):
    shell.user_ns["torch"] = torch
    cell = "%%nbt profile --steps 1 --warmup 0 --memory --shapes\ntorch.ones(256, 256) * 3\n"
    result = shell.run_cell(cell)
    assert result.success, result.error_in_exec
    trace = shell.user_ns["_nbt"]
    assert list(trace.steps["step"]) == [0]
    assert "aten::mul" in set(trace.events[0]["name"].astype(str))


def test_cell_magic_profile_bad_steps_is_a_usage_error(shell):
    result = shell.run_cell("%%nbt profile --steps 0\npass\n")
    assert isinstance(result.error_in_exec, nbt.NbtUsageError)
    assert "steps must be a positive integer" in str(result.error_in_exec)
