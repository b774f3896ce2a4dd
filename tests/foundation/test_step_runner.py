"""The one step runner (nbtoolkit.core.step_runner), its MeasureConfig and StepError, and that
every measuring API takes config=MeasureConfig."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.errors import NbtUsageError, StepError
from nbtoolkit.core.measure_config import DEFAULT_STEPS, DEFAULT_WARMUP, MeasureConfig, measure_config
from nbtoolkit.core.step_runner import call_step

PACKAGE = Path(nbt.__file__).parent


def test_measure_config_is_public_and_imports_no_torch() -> None:
    assert nbt.MeasureConfig is MeasureConfig
    from nbtoolkit.core.measure_config import MeasureConfig as from_optimize

    assert from_optimize is MeasureConfig  # OptimizeConfig.measure is the same class
    code = (
        "import sys, nbtoolkit as nbt; c = nbt.MeasureConfig(steps=2); "
        "print(c.steps, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2", "False"]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: MeasureConfig(steps=0), r"steps must be >= 1 and warmup >= 0, got steps=0, warmup=1"),
        (lambda: MeasureConfig(warmup=-1), r"got steps=3, warmup=-1"),
        (lambda: MeasureConfig(steps=2.5), r"steps must be >= 1"),  # type: ignore[arg-type]
        (lambda: MeasureConfig(steps=True), r"steps must be >= 1"),
        (lambda: MeasureConfig(synchronize="yes"), r"synchronize must be True or False, got 'yes'"),  # type: ignore[arg-type]
        (lambda: MeasureConfig(tokens_per_step=0), r"tokens_per_step must be a whole number >= 1"),
        (lambda: measure_config({"steps": 3}), r"config must be a nbtoolkit.MeasureConfig, got dict"),
    ],
)
def test_bad_settings_are_one_usage_error(make: Any, match: str) -> None:
    with pytest.raises(NbtUsageError, match=match):
        make()


def test_one_set_of_defaults_and_the_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NBTOOLKIT_MEASURE_STEPS", raising=False)
    monkeypatch.delenv("NBTOOLKIT_MEASURE_WARMUP", raising=False)
    assert (MeasureConfig().steps, MeasureConfig().warmup) == (DEFAULT_STEPS, DEFAULT_WARMUP)
    assert measure_config() == MeasureConfig()
    given = MeasureConfig(steps=7, warmup=0, synchronize=False)
    assert measure_config(given) is given
    assert measure_config(given, steps=2) == MeasureConfig(steps=2, warmup=0, synchronize=False)
    monkeypatch.setenv("NBTOOLKIT_MEASURE_STEPS", "4")
    assert measure_config().steps == 4  # the environment fills what the call leaves unset
    assert measure_config(steps=6).steps == 6  # the call wins over it
    assert measure_config(given).steps == 7  # an explicit config is not overridden by it


def test_runner_calls_warmup_then_timed_steps_and_times_only_those(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbtoolkit.core import step_runner

    clock = [0.0]
    calls: list[int] = []

    def step() -> int:
        calls.append(len(calls))
        clock[0] += 10.0 ** len(calls)  # each call takes a different, known time
        return len(calls)

    monkeypatch.setattr(step_runner.time, "perf_counter", lambda: clock[0])
    seen: list[str] = []
    run = step_runner.run_steps(step, MeasureConfig(steps=3, warmup=2), on_step=seen.append)
    assert calls == [0, 1, 2, 3, 4]
    assert run.warmup_times_s == [10.0, 100.0]
    assert run.times_s == [1_000.0, 10_000.0, 100_000.0]
    assert run.values == [3, 4, 5] and run.value == 5
    assert len(run.cpu_times_s) == 3 and run.peak_bytes is None
    assert seen == ["warm-up step"] * 2 + ["timed step"] * 3
    warm = step_runner.run_steps(step, MeasureConfig(steps=1, warmup=1), warmup_only=True)
    assert len(calls) == 6 and warm.times_s == [] and warm.warmup_times_s == [1_000_000.0]


def test_runner_synchronizes_around_timed_steps_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbtoolkit.core import step_runner

    events: list[str] = []
    monkeypatch.setattr(step_runner, "synchronize", lambda device=None: events.append(f"sync {device}"))
    step_runner.run_steps(lambda: events.append("step"), MeasureConfig(steps=1, warmup=0), device="cpu")
    assert events == ["sync cpu", "step", "sync cpu"]
    events.clear()
    step_runner.run_steps(lambda: events.append("step"), MeasureConfig(steps=2, warmup=0, synchronize=False))
    assert events == ["step", "step"]


def test_a_failing_step_is_one_step_error_with_the_original_chained() -> None:
    from nbtoolkit.core.step_runner import run_steps

    calls: list[int] = []

    def train_step() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("shape mismatch")

    with pytest.raises(StepError) as info:
        run_steps(train_step, MeasureConfig(steps=3, warmup=1))
    error = info.value
    assert isinstance(error, NbtUsageError) and isinstance(error.__cause__, RuntimeError)
    assert error.step == "train_step" and error.call == "timed step 2 of 3"
    assert str(error).startswith(
        "the step 'train_step' raised RuntimeError during the timed step 2 of 3: shape mismatch."
    )
    assert error._render_traceback_() == [f"StepError: {error}"]


def test_keyboard_interrupt_and_our_own_errors_pass_unchanged() -> None:
    from nbtoolkit.core.step_runner import run_steps

    def interrupted() -> None:
        raise KeyboardInterrupt

    def ours() -> None:
        raise nbt.CaptureError("nested")

    with pytest.raises(KeyboardInterrupt):
        run_steps(interrupted)
    with pytest.raises(nbt.CaptureError, match="nested"):
        run_steps(ours)


def _timing_loops(path: Path) -> list[int]:
    """Lines of `for`/`while` loops in ``path`` whose body reads ``perf_counter`` or ``process_time``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for loop in ast.walk(tree):
        if not isinstance(loop, (ast.For, ast.While, ast.AsyncFor)):
            continue
        for node in ast.walk(loop):
            if isinstance(node, ast.Attribute) and node.attr in ("perf_counter", "process_time"):
                found.append(loop.lineno)
                break
            if isinstance(node, ast.Name) and node.id in ("perf_counter", "process_time"):
                found.append(loop.lineno)
                break
    return found


#: Modules whose timing loops time something other than a user's step, and why.
NOT_STEPS = {"metrics/cpu_peak.py": "times matrix products for the CPU's measured peak, not a training step"}


def test_the_step_runner_holds_the_only_timing_loop() -> None:
    runner = PACKAGE / "core" / "step_runner.py"
    assert _timing_loops(runner), "the runner's own loop must be seen, or this check sees nothing"
    others = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != runner and str(path.relative_to(PACKAGE)) not in NOT_STEPS
        and (lines := _timing_loops(path))
    }
    assert others == {}, f"time steps with nbtoolkit.core.step_runner.run_steps instead: {others}"


def test_one_synchronize_helper() -> None:
    defined = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef) and node.name == "synchronize"
    ]
    assert defined == ["core/step_runner.py"]


# --- every measuring API takes config= ------------------------------------------------------


@pytest.fixture
def tiny() -> Any:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8)
    calls: list[int] = []

    def step() -> Any:
        calls.append(1)
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        return loss

    return model, step, calls


def test_profile_takes_config(tiny: Any) -> None:
    _, step, calls = tiny
    trace = nbt.profile(step, config=MeasureConfig(steps=2, warmup=1))
    assert list(trace.steps["step"]) == [0, 1] and len(calls) == 3
    trace = nbt.profile(step, steps=1, config=MeasureConfig(steps=2, warmup=0))  # steps= wins
    assert list(trace.steps["step"]) == [0] and len(calls) == 4


def test_step_metrics_takes_config(tiny: Any) -> None:
    model, step, calls = tiny
    metrics = nbt.step_metrics(step, model=model, config=MeasureConfig(steps=2, warmup=1), peak_flops=1e12)
    assert len(metrics.step_times_s) == 2 and metrics.warmup == 1
    assert len(calls) == 1 + 1 + 2  # warm-up, FLOP-counted, timed


def test_capture_graphs_takes_config(tiny: Any) -> None:
    _, step, calls = tiny
    report = nbt.capture_graphs(step, config=MeasureConfig(steps=2), eager_baseline=False, measure_cost=False)
    assert report.steps == 2 and len(calls) == 1 + 2  # the compiling call, then the timed ones


def test_memory_timeline_takes_config(tiny: Any) -> None:
    model, step, calls = tiny
    nbt.memory_timeline(step, model=model)
    assert len(calls) == 1  # without a config: one recorded call, no warm-up
    timeline = nbt.memory_timeline(step, model=model, config=MeasureConfig(steps=2, warmup=1))
    assert len(calls) == 1 + 3 and timeline.value is not None


def test_optimize_takes_a_measure_config(tiny: Any) -> None:
    model, step, _ = tiny
    # steps are the fewest interleaved rounds; a tiny time limit adds none beyond them
    config = MeasureConfig(
        steps=2, warmup=0, memory=False, categories=False, metrics=False, time_limit_s=1e-3
    )
    comparison = nbt.optimize(model, step, config=config)
    assert [len(m.step_times_s) for m in (comparison.before, comparison.after)] == [2, 2]
    comparison = nbt.optimize(model, step, steps=1, config=config)  # steps= wins over the config
    assert [len(m.step_times_s) for m in (comparison.before, comparison.after)] == [1, 1]


def test_plan_recompute_takes_a_measure_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbtoolkit.recompute import planner as recompute

    seen: dict[str, Any] = {}

    def fake_costs(step: Any, candidates: Any, *, steps: int, **_: Any) -> Any:
        seen["steps"] = steps
        raise nbt.PlanError("stop here")

    monkeypatch.setattr(recompute, "measure_recompute_costs", fake_costs)
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with pytest.raises(nbt.PlanError, match="stop here"):
        nbt.plan_recompute(model, lambda: None, None, blocks=["0"], config=MeasureConfig(steps=4))
    assert seen["steps"] == 4


def test_deepspeed_sweep_passes_config_to_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbtoolkit.integrations.deepspeed import sweep

    sent: list[MeasureConfig] = []

    class Stop(Exception):
        pass

    class FakeCluster:
        def run(self, fn: Any, ranks: Any = None) -> Any:
            fn()
            raise Stop

    def fake_rank(model_fn: Any, batch_fn: Any, config: Any, *, measure: MeasureConfig, **_: Any) -> Any:
        sent.append(measure)

    monkeypatch.setattr(sweep, "sweep_one_on_rank", fake_rank)
    with pytest.raises(Stop):
        sweep.zero_sweep(FakeCluster(), object, lambda rank: None, settings=[{"stage": 1}],  # type: ignore[arg-type]
                         warmup=0, config=MeasureConfig(steps=4, warmup=2))
    assert sent == [MeasureConfig(steps=4, warmup=0)]
    with pytest.raises(NbtUsageError, match="steps must be >= 1"):
        sweep.zero_sweep(FakeCluster(), object, lambda rank: None, steps=0)  # type: ignore[arg-type]


def test_deepspeed_and_fsdp2_ranks_time_with_the_runner() -> None:
    """The ranks' loop (shared by the ZeRO and FSDP2 sweeps) is the runner's: a failing step is a
    StepError there too."""
    import inspect

    from nbtoolkit.integrations import rank_measure
    from nbtoolkit.integrations.deepspeed import rank
    from nbtoolkit.integrations.fsdp2 import sweep_rank

    shared = inspect.getsource(rank_measure.time_and_profile_on_rank)
    assert "run_steps(step, measure, warmup_only=True)" in shared
    for sweep_one in (rank.sweep_one_on_rank, sweep_rank.sweep_one_on_rank):
        assert "time_and_profile_on_rank(" in inspect.getsource(sweep_one)
        assert "measure" in inspect.signature(sweep_one).parameters


def test_a_message_that_ends_a_sentence_is_not_given_a_second_period() -> None:
    def ends(text: str) -> Callable[[], None]:
        def step() -> None:
            raise RuntimeError(text)

        return step

    with pytest.raises(StepError) as ended:
        call_step(ends("modified by an inplace operation (check_nan=False)."), "timed step")
    assert "(check_nan=False). Run it once" in str(ended.value) and ".." not in str(ended.value)
    with pytest.raises(StepError) as bare:
        call_step(ends("no period"), "timed step")
    assert "no period. Run it once" in str(bare.value)
