"""nbt.profile and %%nbt profile on CPU: a real torch.profiler run feeding a Trace."""

from __future__ import annotations

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError


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
    assert "steps must be >= 1 and warmup >= 0, got steps=0" in str(result.error_in_exec)


def _layout(trace: nbt.Trace) -> dict[str, object]:
    """What must agree between two profiles of the same step: ranks, streams, steps, top-level ops.

    A step's top-level ops are the host events on the step label's thread, inside the step,
    not nested in another such event (the calls the step function made itself).
    """
    layout: dict[str, object] = {
        "ranks": trace.ranks,
        "device_type": trace.device_type,
        "streams": {r: sorted(set(trace.events[r]["stream"].tolist())) for r in trace.ranks},
        "threads": {r: sorted(set(trace.info[r].thread_names.values())) for r in trace.ranks},
    }
    top_level: dict[tuple[int, int], set[str]] = {}
    labels = trace.steps
    for rank in trace.ranks:
        frame = trace.events[rank]
        host = frame[frame["stream"].to_numpy() < 0]
        names = host["name"].astype(str)
        for step in labels[labels["rank"] == rank].itertuples(index=False):
            label = host[names == f"ProfilerStep#{step.step}"].iloc[0]
            end = step.ts + step.dur
            inside = host[
                (host["tid"] == label["tid"])
                & (host["ts"] >= step.ts)
                & (host["ts"] + host["dur"] <= end)
                & ~names.str.startswith("ProfilerStep")
            ].sort_values(["ts", "dur"], ascending=[True, False])
            ops: set[str] = set()
            covered_until = -float("inf")
            for ts, dur, name in zip(inside["ts"], inside["dur"], inside["name"].astype(str), strict=True):
                if ts >= covered_until:  # not nested in the previous top-level op
                    ops.add(name)
                    covered_until = ts + dur
            top_level[(rank, int(step.step))] = ops
    layout["steps"] = sorted(top_level)
    layout["top_level_ops"] = top_level
    return layout


def test_local_and_rank_profiles_of_the_same_step_have_the_same_structure(tmp_path):
    """nbt.profile and the cluster's rank tool record through one path: the traces agree."""
    from nbtoolkit.cluster.rank_tools import profile_to_bytes

    local = nbt.profile(_train_step(), steps=3, warmup=1)
    shipped = profile_to_bytes(_train_step(), steps=3, warmup=1)
    assert isinstance(shipped["last"], float)  # the loss comes back as a plain number
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(shipped["trace_gz"])
    remote = nbt.load_trace(path)

    assert list(local.steps["step"]) == [0, 1, 2]  # warm-up calls are not recorded, in both
    local_layout, remote_layout = _layout(local), _layout(remote)
    assert all(local_layout["top_level_ops"].values())  # each step holds the step's own ops
    assert "aten::linear" in local_layout["top_level_ops"][(0, 0)]
    assert local_layout == remote_layout
