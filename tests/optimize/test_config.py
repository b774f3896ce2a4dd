"""Config dataclasses of optimize and plan_recompute: checks when made, from_env, optimize()'s mapping."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.measure_config import MeasureConfig
from nbtoolkit.recompute.config import OptimizeConfig, RecomputeConfig
from nbtoolkit.recompute.optimize import config_from_arguments, optimize
from nbtoolkit.recompute.planner import plan_recompute
from tests.optimize._models import make_gpt


def test_configs_are_keyword_only_and_frozen() -> None:
    assert (nbt.OptimizeConfig, nbt.MeasureConfig, nbt.RecomputeConfig) == (
        OptimizeConfig, MeasureConfig, RecomputeConfig
    )
    with pytest.raises(TypeError):
        MeasureConfig(5)  # type: ignore[misc]
    config = OptimizeConfig(recompute=["blocks.0"], budget_bytes="1.5GB")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.amp = "bf16"  # type: ignore[misc]
    assert config.recompute == ("blocks.0",) and config.blocks == ["blocks.0"]
    assert config.budget_bytes == 1_500_000_000
    assert config.plan == RecomputeConfig(steps=2)  # planning inside optimize: two timing rounds
    assert OptimizeConfig(compile="max-autotune").compile_options == {"mode": "max-autotune"}
    assert OptimizeConfig().compile_options is None


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: MeasureConfig(steps=0), "steps must be >= 1 and warmup >= 0"),
        (lambda: MeasureConfig(warmup=-1), "steps must be >= 1 and warmup >= 0"),
        (lambda: MeasureConfig(steps=True), "steps must be >= 1"),
        (lambda: MeasureConfig(tokens_per_step=0), "tokens_per_step must be a whole number >= 1"),
        (lambda: RecomputeConfig(steps=0), "steps must be >= 1, got 0"),
        (lambda: RecomputeConfig(blocks=[]), "blocks is empty"),
        (lambda: OptimizeConfig(recompute="auto"), "recompute='auto' needs a memory budget"),
        (lambda: OptimizeConfig(recompute="sometimes"),
         "recompute must be None, 'auto', a list of module names or a plan"),
        (lambda: OptimizeConfig(amp="fp8"), "amp must be None, 'bf16' or 'fp16'"),
        (lambda: OptimizeConfig(compile={"mode": "fastest"}), "compile mode 'fastest'"),
        (lambda: OptimizeConfig(budget_bytes="lots"), "cannot read budget 'lots'"),
    ],
)
def test_bad_settings_fail_when_the_config_is_made(make: Any, match: str) -> None:
    with pytest.raises(NbtUsageError, match=match):
        make()


def test_measure_from_env_fills_only_what_is_not_given() -> None:
    environ = {"NBTOOLKIT_MEASURE_STEPS": "3", "NBTOOLKIT_MEASURE_WARMUP": "0"}
    assert MeasureConfig.from_env(environ=environ) == MeasureConfig(steps=3, warmup=0)
    assert MeasureConfig.from_env(environ=environ, steps=7) == MeasureConfig(steps=7, warmup=0)
    assert MeasureConfig.from_env(environ={}) == MeasureConfig()
    assert MeasureConfig.from_env(environ={}, steps=None, categories=False) == MeasureConfig(categories=False)
    with pytest.raises(NbtUsageError, match=r"NBTOOLKIT_MEASURE_STEPS='many' is not understood"):
        MeasureConfig.from_env(environ={"NBTOOLKIT_MEASURE_STEPS": "many"})
    with pytest.raises(NbtUsageError, match=r"NBTOOLKIT_MEASURE_WARMUP='-1' is not understood.*>= 0"):
        MeasureConfig.from_env(environ={"NBTOOLKIT_MEASURE_WARMUP": "-1"})


def test_optimize_from_env_reads_the_switch_and_the_budget() -> None:
    environ = {
        "NBTOOLKIT_RECOMPUTE": " Auto ", "NBTOOLKIT_MEMORY_BUDGET": "512MiB", "NBTOOLKIT_MEASURE_STEPS": "2",
    }
    config = OptimizeConfig.from_env(environ=environ)
    assert config.recompute == "auto"
    assert config.budget_bytes == 512 * 2**20
    assert config.measure.steps == 2
    # given in code wins: names instead of "auto", a budget in bytes, an explicit measure config
    given = OptimizeConfig.from_env(
        environ=environ, recompute=["blocks.1"], budget_bytes=1000, measure=MeasureConfig(steps=4)
    )
    assert (given.recompute, given.budget_bytes, given.measure.steps) == (("blocks.1",), 1000, 4)
    for off in ("off", "no", "0", ""):
        assert OptimizeConfig.from_env(environ={"NBTOOLKIT_RECOMPUTE": off}).recompute is None
    with pytest.raises(NbtUsageError, match="NBTOOLKIT_RECOMPUTE='maybe' is not understood"):
        OptimizeConfig.from_env(environ={"NBTOOLKIT_RECOMPUTE": "maybe"})
    with pytest.raises(NbtUsageError, match="cannot read NBTOOLKIT_MEMORY_BUDGET 'a lot'"):
        OptimizeConfig.from_env(environ={"NBTOOLKIT_MEMORY_BUDGET": "a lot"})
    with pytest.raises(NbtUsageError, match="needs a memory budget"):
        OptimizeConfig.from_env(environ={"NBTOOLKIT_RECOMPUTE": "auto"})


def test_optimize_arguments_map_onto_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NBTOOLKIT_RECOMPUTE", "NBTOOLKIT_MEMORY_BUDGET", "NBTOOLKIT_MEASURE_STEPS",
                 "NBTOOLKIT_MEASURE_WARMUP"):
        monkeypatch.delenv(name, raising=False)
    assert config_from_arguments() == OptimizeConfig()
    config = config_from_arguments(
        compile={"backend": "eager"}, recompute="auto", budget_bytes="1MB", amp="bf16", steps=3, undo=False,
    )
    assert config == OptimizeConfig(
        compile={"backend": "eager"}, recompute="auto", budget_bytes=1_000_000, amp="bf16", undo=False,
        measure=MeasureConfig(steps=3),
    )
    # how each side is measured, beyond steps, is a MeasureConfig: optimize() has no warmup=, metrics=...
    with pytest.raises(NbtUsageError, match=r"unknown optimize\(\) setting\(s\) \['metrics', 'warmup'\]"):
        config_from_arguments(warmup=1, metrics=False)
    monkeypatch.setenv("NBTOOLKIT_MEASURE_WARMUP", "4")
    assert config_from_arguments(steps=3).measure == MeasureConfig(steps=3, warmup=4)
    with pytest.raises(NbtUsageError, match=r"unknown optimize\(\) setting\(s\) \['stepz'\]"):
        config_from_arguments(stepz=3)


def test_config_and_separate_arguments_are_not_mixed() -> None:
    model, step = make_gpt(hidden=[16, 16], dim=16, batch=2, seq=8)
    with pytest.raises(NbtUsageError, match=r"amp, steps given both as argument\(s\) and in config="):
        optimize(model, step, config=OptimizeConfig(), steps=3, amp="bf16")
    with pytest.raises(NbtUsageError, match="config must be an OptimizeConfig or a MeasureConfig, got dict"):
        optimize(model, step, config={"steps": 3})  # type: ignore[arg-type]
    with pytest.raises(NbtUsageError, match="verify given both as argument"):
        plan_recompute(model, step, None, verify=False, config=RecomputeConfig())
    wrong = "config must be a RecomputeConfig or a MeasureConfig, got OptimizeConfig"
    with pytest.raises(NbtUsageError, match=wrong):
        plan_recompute(model, step, None, config=OptimizeConfig())  # type: ignore[arg-type]


def test_optimize_runs_from_a_config() -> None:
    model, step = make_gpt(hidden=[16, 16], dim=16, batch=2, seq=8)
    config = OptimizeConfig(
        recompute=["blocks.1"], measure=MeasureConfig(steps=1, warmup=0, categories=False, metrics=False)
    )
    comparison = optimize(model, step, config=config)
    assert comparison.after.config["recompute"] == ["blocks.1"]
    # steps=1: at least one interleaved round, more while the answer is unclear; both sides alike
    rounds = comparison.timing.rounds
    assert rounds >= 1 and len(comparison.before.step_times_s) == len(comparison.after.step_times_s) == rounds
    assert comparison.before.peak_by_category == {}
    assert comparison.before.config["recompute"] == []  # the baseline ran without changes
    assert comparison.changes == ["checkpoint 1 block(s): blocks.1"]


def test_plan_recompute_runs_from_a_config() -> None:
    model, step = make_gpt(hidden=[16, 32], dim=16, batch=2, seq=8)
    plan = plan_recompute(model, step, None, config=RecomputeConfig(blocks=["blocks.1"], steps=1))
    assert list(plan.candidates["block"]) == ["blocks.1"]
