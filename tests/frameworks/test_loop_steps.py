"""LoopSteps on plain PyTorch loops: step boundaries, stopping, and every way a loop can fail.

Each loop counts its own optimizer steps (a list it appends to), so the assertions compare what
LoopSteps says with what the loop really did.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import pytest
import torch

from nbtoolkit.core.errors import LoopEndedError, LoopError, StepError, TrainingStopped
from nbtoolkit.core.training_loop import LoopSteps


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def accumulating_loop(steps: int, *, accumulation: int = 3, log: list[str] | None = None) -> Any:
    """A plain loop: ``accumulation`` backward passes per optimizer step, a LR scheduler after it."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    record = log if log is not None else []

    def loop() -> str:
        for _ in range(steps):
            for _ in range(accumulation):
                torch.nn.functional.mse_loss(model(torch.randn(4, 8)), torch.zeros(4, 1)).backward()
            record.append("step")  # before the step: LoopSteps pauses inside optimizer.step()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        return "finished"

    loop.optimizer = optimizer  # type: ignore[attr-defined]
    loop.scheduler = scheduler  # type: ignore[attr-defined]
    return loop


def test_steps_end_at_optimizer_steps_and_the_loop_is_stopped_after_them() -> None:
    log: list[str] = []
    loop = accumulating_loop(20, accumulation=3, log=log)
    with LoopSteps(loop, warmup=2) as step:
        step.start()
        assert len(log) == 2  # the warm-up ran to the end of its second optimizer step
        for expected in (3, 4, 5, 6):
            step()
            assert len(log) == expected
    outcome = step.outcome
    assert outcome is not None
    assert outcome.measured_steps == 4 and outcome.warmup_steps == 2 and step.steps_done == 4
    assert len(log) == 6  # stopped right after the last measured step, not run to its end
    assert outcome.backward_passes_per_step == [3, 3, 3, 3]
    assert outcome.stopped_by == "nbtoolkit.TrainingStopped raised at the optimizer step"
    assert outcome.framework == "plain loop" and outcome.optimizers == 1
    # the scheduler of step k runs after its optimizer step: 6 steps, 5 scheduler steps done
    assert loop.scheduler.last_epoch == 5
    assert "steps 3-6 of loop() measured (2 warm-up steps skipped)" in outcome.note()
    assert "3 backward passes per step" in outcome.note()


def test_after_continue_runs_the_loop_to_its_end_and_returns_its_value() -> None:
    log: list[str] = []
    step = LoopSteps(accumulating_loop(9, accumulation=1, log=log), warmup=1, after="continue")
    step()
    step()
    outcome = step.finish()
    assert len(log) == 9
    assert outcome.stopped_by == "ran to its end" and outcome.loop_value == "finished"
    assert outcome.measured_steps == 2
    assert step.finish() is outcome  # idempotent
    step.close()


def test_the_optimizer_stays_usable_after_a_stop() -> None:
    loop = accumulating_loop(50, accumulation=1)
    with LoopSteps(loop, warmup=0) as step:
        step()
        step()
    optimizer = loop.optimizer
    assert optimizer.state_dict()["state"]  # momentum buffers are there
    # the same loop runs again from the start, to its end, with no nbtoolkit in between
    assert loop() == "finished"


def test_the_loop_runs_under_the_callers_thread_local_torch_state() -> None:
    """A dispatch mode the caller pushes (as the memory capture does) sees the loop's operators."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops += 1
            return func(*args, **(kwargs or {}))

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loop() -> None:
        while True:
            model(torch.randn(2, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    with LoopSteps(loop, warmup=1) as step:
        with CountOps() as counted:
            step()
        inside = counted.ops
        step()  # outside the mode: it counts nothing more
        assert counted.ops == inside
    # forward, backward and the optimizer's update all dispatch through the mode: dozens of ops
    assert inside > 20


def two_optimizer_loop(batches: int, order: list[str]) -> Any:
    """A GAN-like loop: per batch the "critic" then the "generator" optimizer steps."""
    generator, critic = _model(), torch.nn.Linear(1, 1)
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.01)
    opt_c = torch.optim.SGD(critic.parameters(), lr=0.01)

    def loop() -> None:
        for _ in range(batches):
            critic(generator(torch.randn(4, 8)).detach()).mean().backward()
            order.append("critic")
            opt_c.step()
            opt_c.zero_grad()
            (-critic(generator(torch.randn(4, 8))).mean()).backward()
            order.append("generator")
            opt_g.step()
            opt_g.zero_grad()

    return loop


def test_two_optimizers_a_step_ends_after_the_one_that_closes_the_cycle() -> None:
    order: list[str] = []
    with LoopSteps(two_optimizer_loop(30, order), warmup=2) as step:
        step.start()
        assert order[-1] == "generator"  # the warm-up learned the cycle and ended at its close
        before = len(order)
        step()
        assert order[before:] == ["critic", "generator"]
        step()
        assert order[before:] == ["critic", "generator"] * 2
    outcome = step.outcome
    assert outcome is not None and outcome.optimizers == 2 and outcome.irregular_steps == 0
    assert outcome.backward_passes_per_step == [2, 2]


def test_a_loop_holding_two_optimizers_warms_up_until_its_cycle_is_learned() -> None:
    order: list[str] = []
    with LoopSteps(two_optimizer_loop(30, order), warmup=1) as step:
        step.start()
        assert order == ["critic", "generator", "critic", "generator"]  # one more warm-up step
        step()
        assert order[4:] == ["critic", "generator"]
    outcome = step.outcome
    assert outcome is not None and outcome.warmup_steps == 2 and outcome.irregular_steps == 0


def test_a_cycle_learned_in_a_measured_step_is_reported() -> None:
    order: list[str] = []
    with LoopSteps(two_optimizer_loop(30, order), warmup=0) as step:
        step()
        assert order == ["critic"]  # one optimizer assumed until a second one steps
        step()
        step()
    assert step.outcome is not None and step.outcome.irregular_steps == 1
    assert "spanned more than one optimizer cycle" in step.outcome.note()


def test_a_grad_scaler_step_ends_at_update_and_skipped_steps_are_counted() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    updates: list[int] = []

    def loop() -> None:
        for index in range(30):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(4, 8)).float().pow(2).mean()
            if index == 3:
                loss = loss * float("inf")  # inf gradients: the scaler skips this optimizer.step()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            updates.append(index)
            optimizer.zero_grad()

    with LoopSteps(loop, warmup=2) as step:
        for _ in range(4):
            step()
        assert len(updates) == 5  # the 6th step is paused at its update(), not yet appended
    outcome = step.outcome
    assert outcome is not None and outcome.grad_scaler and outcome.measured_steps == 4
    assert outcome.skipped_steps == 1  # loop index 3 is the second measured step
    assert int(optimizer.state_dict()["state"].__len__()) == 0  # SGD without momentum keeps no state
    assert "skipped 1 optimizer step" in outcome.note()


def test_an_accelerate_loop_steps_once_per_optimizer_step() -> None:
    accelerate = pytest.importorskip("accelerate", reason="accelerate (the frameworks extra) is missing")
    accelerator = accelerate.Accelerator(cpu=True)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=4)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    done: list[int] = []

    def loop() -> None:
        for (batch,) in data:
            accelerator.backward(model(batch).pow(2).mean())
            done.append(1)
            optimizer.step()
            optimizer.zero_grad()

    with LoopSteps(loop, warmup=1) as step:
        for _ in range(3):
            step()
    assert step.outcome is not None and step.outcome.optimizers == 1
    assert len(done) == 4 and step.outcome.backward_passes_per_step == [1, 1, 1]


# ---- errors ----


def test_a_loop_that_ends_before_the_steps_asked_says_how_many_were_measured() -> None:
    step = LoopSteps(accumulating_loop(4, accumulation=1), warmup=1)
    step()
    step()
    step()
    with pytest.raises(LoopEndedError, match=r"after 1 warm-up and 3 measured step") as caught:
        step()
    assert caught.value.measured == 3
    assert "more steps" in str(caught.value)
    with pytest.raises(LoopError, match="was finished"):
        step()


def test_a_loop_that_never_steps_an_optimizer_is_an_error() -> None:
    def loop() -> None:
        _model()(torch.randn(2, 8)).sum().backward()

    with pytest.raises(LoopEndedError, match=r"ended without stepping any optimizer.*optimizer\.step\(\)"):
        LoopSteps(loop).start()


def test_a_loop_stuck_without_optimizer_steps_is_stopped_at_the_time_limit() -> None:
    spins: list[int] = []

    def loop() -> None:
        while True:  # never reaches an optimizer step
            spins.append(1)
            time.sleep(0.01)

    started = time.perf_counter()
    step = LoopSteps(loop, warmup=0, step_time_limit_s=0.2)
    with pytest.raises(LoopError, match=r"stepped no optimizer within 0\.2 s.*step_time_limit_s"):
        step()
    # the first step gets three times the limit (it runs the loop's setup)
    assert 0.55 < time.perf_counter() - started < 5
    count = len(spins)
    time.sleep(0.1)
    assert len(spins) == count  # the loop is over, not running on somewhere


def test_a_slow_step_after_the_first_is_stopped_at_the_time_limit() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loop() -> None:
        for index in range(10):
            model(torch.randn(2, 8)).sum().backward()
            while index == 2:
                time.sleep(0.01)  # hangs in its third step
            optimizer.step()

    with LoopSteps(loop, warmup=1, step_time_limit_s=0.3) as step:
        step()
        with pytest.raises(LoopError, match=r"within 0\.3 s"):
            step()


def test_the_time_limit_holds_per_step_when_the_loop_runs_on_to_its_end() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    done: list[int] = []

    def loop() -> str:
        for _ in range(40):  # 40 steps of ~20 ms: the rest of the run is longer than the limit
            model(torch.randn(2, 8)).sum().backward()
            time.sleep(0.02)
            done.append(1)
            optimizer.step()
        return "end"

    step = LoopSteps(loop, warmup=1, after="continue", step_time_limit_s=0.4)
    step()
    outcome = step.finish()
    assert outcome.loop_value == "end" and len(done) == 40


def test_a_keyboard_interrupt_in_the_loop_reaches_the_caller_as_it_is() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loop() -> None:
        for index in range(10):
            model(torch.randn(2, 8)).sum().backward()
            optimizer.step()
            if index == 1:
                raise KeyboardInterrupt

    step = LoopSteps(loop, warmup=1)
    step()  # index 1's optimizer step; the interrupt comes right after it
    with pytest.raises(KeyboardInterrupt):
        step()
    assert step.outcome is not None  # closed: the fixture checks the hooks are gone


def test_a_loop_that_raises_becomes_a_step_error_chained_to_it() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loop() -> None:
        for index in range(10):
            model(torch.randn(2, 8)).sum().backward()
            optimizer.step()
            if index == 2:
                raise RuntimeError("out of data")

    step = LoopSteps(loop, warmup=1)
    step()
    step()
    with pytest.raises(StepError, match="raised RuntimeError: out of data") as caught:
        step()
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_except_exception_in_a_loop_does_not_swallow_the_stop() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    swallowed: list[str] = []

    def loop() -> None:
        for _ in range(10):
            try:
                model(torch.randn(2, 8)).sum().backward()
                optimizer.step()
            except Exception:
                swallowed.append("oops")

    with LoopSteps(loop, warmup=0) as step:
        step()
    assert not swallowed
    assert issubclass(TrainingStopped, BaseException) and not issubclass(TrainingStopped, Exception)


def test_restart_runs_the_loop_again_and_its_first_step_is_a_warm_up() -> None:
    log: list[str] = []
    with LoopSteps(accumulating_loop(3, accumulation=1, log=log), warmup=1, restart=True) as step:
        for _ in range(4):
            step()
    outcome = step.outcome
    assert outcome is not None and outcome.restarts == 1
    # run 1: 1 warm-up + 2 measured; run 2: 1 warm-up + 2 measured (the last one stopped there)
    assert outcome.measured_steps == 4 and outcome.warmup_steps == 2 and len(log) == 6


def test_restart_of_a_loop_with_no_steps_left_is_an_error() -> None:
    runs: list[int] = []
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loop() -> None:
        runs.append(1)
        if len(runs) > 1:
            return  # like a trainer that already reached its max_steps
        for _ in range(2):
            model(torch.randn(2, 8)).sum().backward()
            optimizer.step()

    step = LoopSteps(loop, warmup=0, restart=True)
    step()
    step()
    with pytest.raises(LoopEndedError, match="no steps left") as caught:
        step()
    assert caught.value.measured == 2


def test_a_step_from_another_thread_is_refused_clearly() -> None:
    with LoopSteps(accumulating_loop(20, accumulation=1), warmup=1) as step:
        step.start()
        errors: list[BaseException] = []

        def other() -> None:
            try:
                step()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], LoopError)
        assert "another thread" in str(errors[0])
        step()  # still usable from its own thread


def test_an_exception_in_the_with_block_stops_the_loop_and_goes_on() -> None:
    log: list[str] = []
    step = LoopSteps(accumulating_loop(20, accumulation=1, log=log), warmup=0)

    def measure() -> None:
        with step:
            step()
            raise KeyError("in the caller")

    with pytest.raises(KeyError):
        measure()
    assert step.outcome is not None and step.outcome.stopped_by.startswith("nbtoolkit.TrainingStopped")
    assert len(log) == 1


def test_an_abandoned_loop_is_closed_on_garbage_collection() -> None:
    log: list[str] = []
    step = LoopSteps(accumulating_loop(20, accumulation=1, log=log), warmup=1)
    step()
    del step
    gc.collect()
    # the fixture checks that the hooks are gone; the loop did not run on
    assert len(log) == 2


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(LoopError, match="zero-argument callable"):
        LoopSteps(42)  # type: ignore[arg-type]
    with pytest.raises(LoopError, match="'stop' or 'continue'"):
        LoopSteps(lambda: None, after="later")
    with pytest.raises(LoopError, match="warmup"):
        LoopSteps(lambda: None, warmup=-1)


def test_the_step_time_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from nbtoolkit.core.training_loop import default_step_time_limit

    monkeypatch.setenv("NBTOOLKIT_LOOP_STEP_LIMIT", "300")
    assert default_step_time_limit() == 300.0
    monkeypatch.setenv("NBTOOLKIT_LOOP_STEP_LIMIT", "soon")
    with pytest.raises(LoopError, match="NBTOOLKIT_LOOP_STEP_LIMIT='soon' is not a number"):
        LoopSteps(lambda: None)
