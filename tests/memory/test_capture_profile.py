"""The one walker of torch's memory profiler (nbtoolkit.memory.profile), checked against torch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from nbtoolkit.core.errors import CaptureError
from nbtoolkit.memory.profile import (
    mark,
    peak_by_category,
    profile_memory_series,
    run_memory_profiled,
    tensor_events,
)


class _Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))  # the backward sums two gradients of x in place


def _training_step() -> Any:
    torch.manual_seed(0)
    model = nn.Sequential(_Residual(32), _Residual(32), nn.Linear(32, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(512, 32)  # activations, not the optimizer step, make the peak

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = model(data).pow(2).mean()
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    step()  # optimizer state exists from here on: every later step allocates the same
    return step


def _torch_categories_at_peak(step: Any) -> dict[str, int]:
    """What torch's own export_memory_timeline shows at its highest point, per category."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    run = run_memory_profiled(step, details=True)
    assert run.failure is None
    times, sizes = MemoryProfileTimeline(run.profiler._memory_profile())._coalesce_timeline("cpu")
    peak = max(range(len(times)), key=lambda k: sum(sizes[k][1:]))
    names = [c.name if c is not None else "unknown" for c in _CATEGORY_TO_INDEX]
    return {name: size for name, size in zip(names, sizes[peak][1:], strict=True) if size > 0}


def test_categories_at_peak_equal_torch_export_memory_timeline() -> None:
    step = _training_step()
    series, by_category, resident = profile_memory_series(step, categories=True)
    assert by_category == _torch_categories_at_peak(step)
    assert {"ACTIVATION", "PARAMETER", "OPTIMIZER_STATE"} <= set(by_category)
    # parameters and Adam's two moments existed before the step: at least 3x the parameter bytes
    parameter_bytes = by_category["PARAMETER"]
    assert resident >= 3 * parameter_bytes
    assert series.peak_bytes > 0 and series.value is not None


def test_in_place_writes_move_bytes_to_the_new_versions_category() -> None:
    step = _training_step()
    run = run_memory_profiled(step, details=True)
    events = tensor_events(run.profiler).events
    writes = [e for e in events if e.action == "increment_version"]
    assert writes, "an optimizer step writes parameters and moments in place"
    assert all(e.tensor is not None and e.storage_ptr is not None for e in writes)
    # bytes are conserved: whatever is created or pre-existing is either destroyed or still live
    by_category, _ = peak_by_category(events)
    assert sum(by_category.values()) == max(
        _running_totals(events)
    ), "the split at the peak adds up to the highest total"


def _running_totals(events: list[Any]) -> list[int]:
    total, totals = 0, []
    for event in events:
        if event.action in ("create", "preexisting"):
            total += event.size
        elif event.action == "destroy":
            total -= event.size
        totals.append(total)
    return totals


def test_allocation_series_counts_this_runs_bytes_and_reads_markers() -> None:
    before = [torch.empty(10_000, dtype=torch.uint8)]

    def fn() -> torch.Tensor:
        first = torch.empty(1000, dtype=torch.uint8)
        mark("after_first")
        second = torch.empty(3000, dtype=torch.uint8)
        del first
        mark("after_free")
        before.clear()  # freeing a block from before the run: torch gives no size, nothing credited
        return second

    series, by_category, resident = profile_memory_series(fn)
    assert series.levels == [1000, 4000, 3000]
    assert series.peak_bytes == 4000
    assert series.level_at(series.marks["after_first"]) == 1000
    assert series.level_at(series.marks["after_free"]) == 3000
    assert series.level_at(min(series.times_ns) - 1) == 0
    assert series.value.shape == (3000,)
    assert by_category == {} and resident == 0  # categories=False: not computed


def test_a_failing_run_is_handed_back_and_recording_stops() -> None:
    def broken() -> None:
        torch.empty(100)
        raise ValueError("boom")

    run = run_memory_profiled(broken)
    assert isinstance(run.failure, ValueError)
    assert not torch.autograd.profiler._is_profiler_enabled
    with pytest.raises(ValueError, match="boom"):
        profile_memory_series(broken)
    assert not torch.autograd.profiler._is_profiler_enabled


def test_refuses_to_run_inside_another_profiler() -> None:
    with torch.profiler.profile(), pytest.raises(CaptureError, match="call the memory measurement outside"):
        profile_memory_series(lambda: torch.ones(4))


def _freed_on_another_thread() -> bool:
    """A block freed by another thread (unrecorded, as gloo's are), then blocks of its size
    allocated here: True when one of them got its address (the allocator decides)."""
    import threading

    held = [torch.ones(1024)]
    address = held[0].data_ptr()
    dropper = threading.Thread(target=held.clear)
    dropper.start()
    dropper.join()
    after = [torch.zeros(1024) for _ in range(4)]
    return any(t.data_ptr() == address for t in after)


def test_an_allocation_at_an_address_freed_unrecorded_is_counted_and_noted() -> None:
    """torch keys the new block as the still-live old storage and fails its data-flow checks
    ('duplicate outputs'); the timeline is still built and says how many such blocks it has."""
    from nbtoolkit.memory.capture import memory_timeline

    seen = []
    for _ in range(20):
        timeline = memory_timeline(_freed_on_another_thread)
        seen.append(bool(timeline.value))
        assert timeline.reused_storages == int(timeline.value), seen
        noted = any("did not record" in note for note in timeline.notes)
        assert noted == bool(timeline.value), timeline.notes
        if timeline.value:  # split again, each block ends: the step holds nothing afterwards
            events = timeline.events
            assert int(events["delta_bytes"].sum()) == 0, events.to_string()
            assert (events["action"] == "alloc").sum() == 5, events.to_string()  # the freed one, 4 after
        if any(seen) and not all(seen):
            break
    assert any(seen), "the allocator never reused the freed address: nothing was checked"
