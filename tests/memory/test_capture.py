"""nbt.memory_timeline on CPU: torch's categories, modules and phases, baseline, failures, MemTracker."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 500, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([Block(width) for _ in range(layers)])
        self.head = nn.Linear(width, vocab)
        self.frozen_extra = nn.Linear(96, 96)  # never used in forward

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _training_setup(*, freeze_extra: bool = False) -> tuple[TinyTransformer, torch.optim.Optimizer, object]:
    torch.manual_seed(0)
    model = TinyTransformer()
    trained = list(model.parameters())
    if freeze_extra:  # frozen and outside the optimizer: nothing in the run touches it
        model.frozen_extra.requires_grad_(False)
        trained = [p for name, p in model.named_parameters() if not name.startswith("frozen_extra")]
    optimizer = torch.optim.AdamW(trained, lr=1e-3)
    tokens = torch.randint(0, 500, (4, 32))
    targets = torch.randint(0, 500, (4, 32))

    def step() -> float:
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.view(-1, 500), targets.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    step.inputs = (tokens, targets)  # type: ignore[attr-defined]
    return model, optimizer, step


@pytest.fixture(scope="module")
def captured() -> tuple[nbt.MemoryTimeline, TinyTransformer, torch.optim.Optimizer, object]:
    model, optimizer, step = _training_setup()
    step()  # optimizer state exists before recording, as in a real training loop
    timeline = nbt.memory_timeline(step, model=model, optimizer=optimizer)
    return timeline, model, optimizer, step


def test_categories_phases_and_modules(captured: tuple) -> None:
    timeline, model, _, _ = captured
    assert isinstance(timeline, nbt.MemoryTimeline)
    assert isinstance(timeline.value, float)
    peaks = timeline.category_peaks().set_index("category")
    for category in ("parameter", "optimizer_state", "activation", "gradient"):
        assert peaks.loc[category, "peak_bytes"] > 0, category
    assert {"before", "forward", "backward", "optimizer"} <= set(timeline.events["phase"])
    modules = set(timeline.events["module"])
    assert {"layers.0.attn", "layers.1.mlp.0", "head", "embed"} <= modules
    # Activations are made in forward, gradients in backward.
    allocs = timeline.events[timeline.events["action"] == "alloc"]
    assert set(allocs.loc[allocs["category"] == "activation", "phase"]) <= {"forward", "other"}
    assert set(allocs.loc[allocs["category"] == "gradient", "phase"]) == {"backward"}
    # The per-module view attributes backward gradients to the forward layer.
    by_module = timeline.by_module().set_index("module")
    assert by_module.loc["head", "allocated_bytes"] > 0
    # Parameter bytes at the peak are the whole model, the layer unused in forward included.
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert peaks.loc["parameter", "at_peak_bytes"] == parameter_bytes


def test_baseline_counts_untouched_parameters() -> None:
    model, optimizer, step = _training_setup(freeze_extra=True)
    timeline = nbt.memory_timeline(step, model=model, optimizer=optimizer)
    before = timeline.events[timeline.events["action"] == "preexisting"]
    frozen = before[before["module"] == "frozen_extra"]
    expected = sum(p.numel() * p.element_size() for p in model.frozen_extra.parameters())
    assert int(frozen["delta_bytes"].sum()) == expected
    assert set(frozen["category"]) == {"parameter"}
    assert any("existed before recording" in note for note in timeline.notes)


def test_alive_at_peak_lists_real_tensors(captured: tuple) -> None:
    timeline, *_ = captured
    alive = timeline.alive_at_peak(top=None)
    assert int(alive["bytes"].sum()) == timeline.peak_bytes
    made = alive[alive["phase"] != "before"]
    assert (made["shape"] != "").mean() > 0.8
    assert (made["stack"] != "").all()
    assert made["source"].str.contains("test_capture.py").any()


def test_agrees_with_torch_memtracker(captured: tuple) -> None:
    """Peak and per-category bytes at the peak within 5% of torch's MemTracker.

    MemTracker names: Parameter(+Buffer), Gradient, Activation, Optstate, Temp, Other.
    torch's memory profiler calls MemTracker's "Temp" autograd_detail (+ temporary), and
    inputs MemTracker tracks as externals land in "Other".
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    timeline, model, optimizer, step = captured
    tracker = MemTracker()
    tracker.track_external(model, optimizer, *step.inputs)
    with tracker:
        step()
    snapshot = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    reference = {str(getattr(k, "value", k)): v for k, v in snapshot.items()}
    ours = timeline.category_peaks().set_index("category")["at_peak_bytes"]
    pairs = {
        "total": (ours["total"], reference["Total"]),
        "parameter": (ours["parameter"], reference["Parameter"] + reference["Buffer"]),
        "optimizer_state": (ours["optimizer_state"], reference["Optstate"]),
        "activation": (ours["activation"], reference["Activation"]),
        "temporaries": (ours["autograd_detail"] + ours["temporary"], reference["Temp"]),
        "gradient": (ours["gradient"], reference["Gradient"]),
    }
    for name, (mine, theirs) in pairs.items():
        # 5% of MemTracker's number; categories near zero in both get a 64 KiB floor.
        tolerance = max(0.05 * int(theirs), 64 * 1024)
        assert abs(int(mine) - int(theirs)) <= tolerance, (name, int(mine), int(theirs))


def test_more_steps_more_events() -> None:
    model, optimizer, step = _training_setup()
    step()
    one = nbt.memory_timeline(step, 1, model=model, optimizer=optimizer)
    two = nbt.memory_timeline(step, 2, model=model, optimizer=optimizer)
    allocations = (one.events["action"] == "alloc").sum(), (two.events["action"] == "alloc").sum()
    assert allocations[1] > 1.8 * allocations[0]


@pytest.mark.parametrize(
    "error",
    [RuntimeError("boom in the step"), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")],
)
def test_failure_keeps_timeline_and_turns_recording_off(error: Exception) -> None:
    model, optimizer, _ = _training_setup()
    tokens = torch.randint(0, 500, (4, 32))

    def failing_step() -> None:
        logits = model(tokens)
        keep = logits * 2  # an activation alive at the failure
        raise error from None if keep is None else error

    with pytest.raises(type(error)) as info:
        nbt.memory_timeline(failing_step, model=model, optimizer=optimizer)
    partial = info.value.timeline  # type: ignore[attr-defined]
    assert isinstance(partial, nbt.MemoryTimeline)
    assert (partial.events["phase"] == "forward").any()
    assert partial.peak_bytes > 0
    assert any(note.startswith("partial") for note in partial.notes)
    assert not torch.autograd.profiler._is_profiler_enabled
    assert any("exc.timeline" in note for note in getattr(info.value, "__notes__", []))


def test_keyboard_interrupt_propagates_with_timeline() -> None:
    def interrupted() -> None:
        torch.ones(1000)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        nbt.memory_timeline(interrupted)
    assert isinstance(info.value.timeline, nbt.MemoryTimeline)  # type: ignore[attr-defined]
    assert not torch.autograd.profiler._is_profiler_enabled


def test_usage_errors() -> None:
    with pytest.raises(NbtUsageError, match="callable"):
        nbt.memory_timeline(42)  # type: ignore[arg-type]
    with pytest.raises(NbtUsageError, match="steps must be >= 1 and warmup >= 0, got steps=0"):
        nbt.memory_timeline(lambda: None, steps=0)


def test_without_model_modules_are_named_by_modtracker() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    timeline = nbt.memory_timeline(lambda: net(x).sum().backward())
    modules = set(timeline.events["module"]) - {""}
    assert {"Sequential.0", "Sequential.2"} <= modules


def test_refuses_to_nest_inside_another_profiler() -> None:
    from nbtoolkit.core.errors import CaptureError

    with torch.profiler.profile(), pytest.raises(CaptureError, match="already recording"):
        nbt.memory_timeline(lambda: torch.ones(4))


def test_live_tensor_bytes_counts_real_storage_and_skips_fake_tensors() -> None:
    """Fake tensors left alive by torch.compile hold no memory; reading their data pointer warns."""
    import warnings

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nbtoolkit.memory.profile import live_tensor_bytes

    before = live_tensor_bytes()
    real = torch.ones(256, 1024)  # 1 MiB
    with FakeTensorMode():
        fake = torch.empty(4096, 4096)  # 64 MiB, nominally
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        after = live_tensor_bytes()
    assert after - before == real.untyped_storage().nbytes() == 1 << 20
    assert fake.shape == (4096, 4096)  # alive during the count
