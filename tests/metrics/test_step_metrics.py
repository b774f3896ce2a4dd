"""nbt.step_metrics on a real small transformer on CPU: FLOPs vs the analytic count, recomputation,
the peak's source, and every bad input ending in a clear MetricsError / NbtUsageError."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.core.step_runner import run_steps
from nbtoolkit.metrics import measure as capture
from nbtoolkit.metrics import peak_flops


def test_model_flops_match_the_analytic_count(make_gpt: Any) -> None:
    setup = make_gpt()
    m = nbt.step_metrics(setup.step, model=setup.model, steps=2, tokens_per_step=setup.tokens)
    analytic = setup.analytic_model_flops()
    assert abs(m.model_flops - analytic) / analytic < 0.05, (m.model_flops, analytic)
    assert m.hardware_flops == m.model_flops  # no recomputation in the plain model
    assert m.recompute_flops == 0
    # forward is a third of the matmul FLOPs (backward = 2 x forward), attention aside
    assert 0.25 < m.forward_flops / m.model_flops < 0.35
    assert m.parameters == sum(p.numel() for p in setup.model.parameters())
    assert m.tokens_per_s == pytest.approx(setup.tokens / m.step_time_s)
    assert m.device == "cpu" and m.dtype == "float32"
    # per module: each block's row holds its share, the blocks and the head add up to the step
    blocks = m.by_module[m.by_module["module"].str.fullmatch(r"TinyGPT\.blocks\.\d")]
    head = m.by_module[m.by_module["module"] == "TinyGPT.head"]
    assert len(blocks) == setup.layers
    assert blocks["model_flops"].nunique() == 1  # identical blocks, identical FLOPs
    assert int(blocks["model_flops"].sum() + head["model_flops"].sum()) == m.model_flops
    # the CPU flash-attention kernels are counted (torch has no formula for them on its own)
    assert any("flash_attention_for_cpu" in op for op in m.by_op["op"])


def test_cpu_peak_is_measured_once_and_said_so(make_gpt: Any) -> None:
    setup = make_gpt()
    first = nbt.step_metrics(setup.step, steps=1, warmup=0)
    second = nbt.step_metrics(setup.step, steps=1, warmup=0)
    assert re.match(r"measured: \d+x\d+ float32 matmul on this CPU", first.peak_source), first.peak_source
    # how, when and under what load: the conditions travel with the number
    assert re.search(r"best of \d+ trials in \d+ attempts?, \d+ threads?, at \d\d:\d\d:\d\d together with "
                     r"bfloat16; ", first.peak_source), first.peak_source
    assert second.peak_flops == first.peak_flops  # cached for the process, not re-measured
    assert first.peak_kind == "measured"
    for shown in (first.summary_line(), repr(first), first._repr_html_() or ""):
        assert "measured" in shown
    # a real ratio, not a unit slip by 1e3, and never above 100%
    assert first.mfu is None or 0 < first.mfu <= 1.0


@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant"])
def test_recomputed_flops_are_hardware_not_model_flops(make_gpt: Any, mode: str) -> None:
    plain = capture.count_step_flops(make_gpt().step)
    ckpt = capture.count_step_flops(make_gpt(recompute=mode).step)
    # model FLOPs are the same model's, with or without recomputation
    assert ckpt.model_flops == plain.model_flops
    assert ckpt.total("forward") == plain.total("forward")
    # the re-run forward of the blocks is executed on top
    assert 0 < ckpt.total("recompute") <= ckpt.total("forward")
    assert ckpt.hardware_flops == ckpt.model_flops + ckpt.total("recompute")
    modules = ckpt.module_frame().set_index("module")
    assert (modules.loc[["TinyGPT.blocks.0", "TinyGPT.blocks.1"], "recompute_flops"] > 0).all()
    assert modules.loc["TinyGPT.head", "recompute_flops"] == 0  # outside the checkpointed blocks
    assert plain.total("recompute") == 0


def test_with_recomputation_hfu_rises_and_mfu_stays_within_noise(make_gpt: Any) -> None:
    plain_setup, ckpt_setup = make_gpt(), make_gpt(recompute="non-reentrant")
    plain_setup.step(), ckpt_setup.step()  # warm-up
    # Time the two alternately so that both see the same load on a shared machine.
    plain_times: list[float] = []
    ckpt_times: list[float] = []
    one = nbt.MeasureConfig(steps=1, warmup=0)
    for _ in range(5):
        plain_times += run_steps(plain_setup.step, one, device="cpu").times_s
        ckpt_times += run_steps(ckpt_setup.step, one, device="cpu").times_s
    plain = capture.step_metrics_from_times(plain_setup.step, plain_times)
    ckpt = capture.step_metrics_from_times(ckpt_setup.step, ckpt_times)
    assert ckpt.model_flops == plain.model_flops
    assert ckpt.hardware_flops > plain.hardware_flops
    # HFU rises above MFU by exactly the recomputed share; without recomputation they are equal
    assert plain.hfu == pytest.approx(plain.mfu)
    assert ckpt.hfu / ckpt.mfu == pytest.approx(ckpt.hardware_flops / ckpt.model_flops)
    assert ckpt.hfu > ckpt.mfu
    # MFU does not credit recomputation: it stays within the noise of the plain run's
    # (recomputation costs time, so it may only fall, by about the recomputed share, plus noise)
    low, high = plain.mfu_range
    assert ckpt.mfu <= high * 1.25, (ckpt.mfu, plain.mfu_range)
    assert ckpt.mfu >= low * 0.5, (ckpt.mfu, plain.mfu_range)
    assert any("recomputation" in note for note in ckpt.notes)


def test_autocast_bf16_picks_the_bf16_peak(make_gpt: Any) -> None:
    setup = make_gpt(amp=torch.bfloat16)
    m = nbt.step_metrics(setup.step, steps=1, warmup=0)
    assert m.dtype == "bfloat16"
    assert "bfloat16 matmul" in m.peak_source


def test_given_peak_is_used_and_named(make_gpt: Any) -> None:
    setup = make_gpt()
    m = nbt.step_metrics(setup.step, steps=2, peak_flops=1e12, samples_per_step=setup.batch)
    assert m.peak_flops == 1e12 and m.peak_source.startswith("given:")
    assert m.mfu == pytest.approx(m.model_flops / m.step_time_s / 1e12)
    assert m.samples_per_s == pytest.approx(setup.batch / m.step_time_s)


def test_known_gpu_takes_its_peak_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # The device name is torch's; the lookup path is what a GPU run takes.
    monkeypatch.setattr(peak_flops, "device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    peak, source = capture.resolve_peak("cuda:0", torch.bfloat16)
    assert peak == 312e12
    assert source.startswith("table: NVIDIA A100 bf16 dense")
    peak32, source32 = capture.resolve_peak("cuda:0", torch.float32)
    assert peak32 == 19.5e12 and "fp32" in source32  # TF32 is off by default in torch


# ---- bad input: a clear message each, never ZeroDivisionError or NaN --------------------

def test_a_step_that_raises_is_a_metrics_error_and_leaves_no_hook(make_gpt: Any) -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 2:  # fails during FLOP counting, with the counter's hooks installed
            raise RuntimeError("CUDA out of memory (simulated)")

    expected = r"raised RuntimeError during the FLOP counting: CUDA out of"
    with pytest.raises(nbt.StepError, match=expected) as info:
        nbt.step_metrics(step, warmup=1)
    assert isinstance(info.value.__cause__, RuntimeError) and info.value.call == "FLOP counting"
    # the conftest fixture asserts that no module hook or dispatch mode is left behind
    assert not torch._C._is_torch_function_mode_enabled()


def test_a_step_that_raises_in_warmup_names_the_phase() -> None:
    def step() -> None:
        raise ValueError("bad batch")

    expected = "'step' raised ValueError during the warm-up step 1 of 1: bad batch"
    with pytest.raises(nbt.StepError, match=expected):
        nbt.step_metrics(step)


def test_keyboard_interrupt_passes_through_and_cleans_up(make_gpt: Any) -> None:
    setup = make_gpt()

    def step() -> None:
        setup.model(torch.zeros(1, 4, dtype=torch.long))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        nbt.step_metrics(step, warmup=0)


def test_a_step_without_flop_counted_ops_is_a_metrics_error() -> None:
    w = torch.ones(64, requires_grad=True)

    def step() -> None:
        (w * 2).relu().sum().backward()  # element-wise only: no matmul, conv or attention

    with pytest.raises(nbt.MetricsError, match="no FLOP-counted operation"):
        nbt.step_metrics(step)


def test_unknown_peak_that_cannot_be_measured_is_a_metrics_error(make_gpt: Any) -> None:
    setup = make_gpt()

    def broken_probe(device: torch.device, dtype: torch.dtype) -> float:
        raise RuntimeError("no timer on this device")

    expected = r"not in nbtoolkit's table.*no timer on this device.*peak_flops="
    with pytest.raises(nbt.MetricsError, match=expected):
        nbt.step_metrics(setup.step, steps=1, warmup=0, measure_peak=broken_probe)


def test_a_dtype_whose_matmul_cannot_run_is_a_metrics_error(make_gpt: Any) -> None:
    setup = make_gpt()
    # no CPU kernel multiplies bool matrices: the peak can be neither looked up nor measured
    expected = r"CPU.*in bool is not in nbtoolkit's table.*measuring it failed"
    with pytest.raises(nbt.MetricsError, match=expected):
        nbt.step_metrics(setup.step, steps=1, warmup=0, dtype=torch.bool)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), math.inf])
def test_a_measurement_giving_no_number_is_a_metrics_error(make_gpt: Any, bad: float) -> None:
    setup = make_gpt()
    with pytest.raises(nbt.MetricsError, match="not a positive number"):
        nbt.step_metrics(setup.step, steps=1, warmup=0, measure_peak=lambda device, dtype: bad)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 0}, "steps=0"),
        ({"warmup": -1}, "warmup=-1"),
        ({"tokens_per_step": 0}, "tokens_per_step=0"),
        ({"peak_flops": 0}, "peak_flops=0"),
        ({"peak_flops": float("nan")}, "peak_flops=nan"),
        ({"dtype": "float77"}, "not a torch dtype"),
    ],
)
def test_bad_arguments_are_usage_errors(make_gpt: Any, kwargs: dict[str, Any], match: str) -> None:
    setup = make_gpt()
    with pytest.raises(nbt.NbtUsageError, match=match):
        nbt.step_metrics(setup.step, **kwargs)


def test_a_step_that_is_not_callable_is_a_usage_error() -> None:
    with pytest.raises(nbt.NbtUsageError, match="zero-argument callable"):
        nbt.step_metrics(42)  # type: ignore[arg-type]
