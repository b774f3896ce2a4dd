"""nbt.profile(metrics=True) and %%nbt profile --metrics: MFU in the profile summary."""

from __future__ import annotations

import torch

import nbtoolkit as nbt
from nbtoolkit.metrics.step_metrics import StepMetrics


def test_profile_with_metrics_counts_the_step_flops() -> None:
    layer = torch.nn.Linear(64, 32, bias=False)
    batch = torch.randn(16, 64)
    trace = nbt.profile(lambda: layer(batch).sum().backward(), steps=2, metrics=True, tokens_per_step=16)
    metrics = trace.step_metrics
    assert isinstance(metrics, StepMetrics)
    # forward 2*16*64*32, backward: grad of the weight only (the input needs none) = same again
    assert metrics.model_flops == 2 * (2 * 16 * 64 * 32)
    assert 0 < metrics.mfu <= 1
    assert any(note.startswith("step metrics: MFU") for note in trace.notes)
    assert "step metrics: MFU" in trace._text()


def test_profile_metrics_failure_is_a_note_not_an_error() -> None:
    trace = nbt.profile(lambda: None, steps=1, metrics=True)
    assert trace.step_metrics is None
    assert any(note.startswith("step metrics not available") for note in trace.notes)
