"""nbt.train_step on a real Hugging Face Trainer (a tiny Llama from its config, random weights, CPU).

The trainer counts its own optimizer steps (``trainer.state.global_step``): the assertions hold
what nbtoolkit says against it, and check that a stopped trainer trains again as if untouched.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers (the frameworks extra) is not installed")
pytest.importorskip("accelerate", reason="accelerate (which transformers.Trainer needs) is not installed")

import nbtoolkit as nbt
from nbtoolkit.core.training_loop import LoopSteps

from ._models import tiny_hf_trainer


def test_steps_of_trainer_train_then_a_clean_stop_and_the_next_train_works(tmp_path: Path) -> None:
    trainer = tiny_hf_trainer(tmp_path, max_steps=8)
    step = nbt.train_step(trainer, warmup=2)
    assert step.model is trainer.model and step.__name__ == "trainer.train()"
    with step:
        for _ in range(3):
            step()
        assert step.optimizer is not None and step.framework == "transformers.Trainer"
    outcome = step.outcome
    assert outcome is not None
    # stopped through the trainer's own flag right after the measured steps: 2 warm-up + 3
    assert trainer.state.global_step == 5
    assert outcome.stopped_by == "HF control.should_training_stop"
    assert type(outcome.loop_value).__name__ == "TrainOutput" and outcome.loop_value.global_step == 5
    assert outcome.measured_steps == 3 and outcome.optimizers == 1
    assert outcome.backward_passes_per_step == [1, 1, 1]
    assert outcome.note().startswith("steps 3-5 of trainer.train() measured (2 warm-up steps skipped)")
    assert "control.should_training_stop" in outcome.note()
    # the trainer is as usable as before: a plain train() runs its full max_steps
    result = trainer.train()
    assert result.global_step == 8 and trainer.state.global_step == 8


def test_after_continue_runs_the_trainer_to_max_steps_with_accumulation_counted(tmp_path: Path) -> None:
    trainer = tiny_hf_trainer(tmp_path, max_steps=5, accumulation=2)
    step = LoopSteps(trainer.train, warmup=1, after="continue")
    step()
    step()
    outcome = step.finish()
    assert trainer.state.global_step == 5 and outcome.stopped_by == "ran to its end"
    assert outcome.backward_passes_per_step == [2, 2]
    assert outcome.framework == "transformers.Trainer"  # found in the loop's frames
    assert "2 backward passes per step (gradient accumulation)" in outcome.note()
    step.close()


def test_a_trainer_out_of_steps_restarts_and_reserve_restarts_it_before_measuring(tmp_path: Path) -> None:
    trainer = tiny_hf_trainer(tmp_path, max_steps=3)
    with nbt.train_step(trainer, warmup=1) as step:
        step()
        step()  # steps 2 and 3: the trainer's last
        step()  # train() returned; a fresh train() gives a warm-up step, then this one
        assert step.outcome is None and trainer.state.global_step == 1  # paused in step 2 of run 2
        step.reserve(2)  # 1 step left, 2 asked: restarted now, not inside a measured step
        assert trainer.state.global_step == 0  # paused in the warm-up step of run 3
        step()
        step()
    outcome = step.outcome
    assert outcome is not None and outcome.restarts == 2 and outcome.measured_steps == 5
    assert outcome.warmup_steps == 3


def test_reserve_without_restart_says_the_steps_do_not_fit_before_measuring(tmp_path: Path) -> None:
    trainer = tiny_hf_trainer(tmp_path, max_steps=4)
    step = LoopSteps(trainer.train, warmup=1)
    expected = r"only 3 step\(s\) left after 1 warm-up and 0 measured step\(s\) of the 5 asked"
    with pytest.raises(nbt.LoopEndedError, match=expected) as caught:
        step.reserve(5)
    assert caught.value.measured == 0
    # stopped through the trainer's flag, not by an exception through it
    assert step.outcome is not None and step.outcome.stopped_by == "HF control.should_training_stop"


def test_train_step_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    known = r"transformers\.Trainer.*Lightning Trainer.*zero-argument callable"
    with pytest.raises(nbt.LoopError, match=known):
        nbt.train_step(object())
    with pytest.raises(nbt.LoopError, match="takes no module"):
        nbt.train_step(tiny_hf_trainer(tmp_path, max_steps=2), object())


def test_a_restart_keeps_the_trainers_optimizer_state_out_of_measured_peaks(tmp_path: Path) -> None:
    """A restarted ``trainer.train()`` keeps its optimizer and AdamW's state: steps measured after a
    restart (``reserve`` restarts the loop before the measurement) peak as those measured before it.
    (Issue 40's CI once saw a plan's peak 1.38 MiB, one AdamW state, above the stored run's.)"""
    import gc

    import torch

    trainer = tiny_hf_trainer(tmp_path, max_steps=3)

    def state_elements() -> list[int]:
        gc.collect()
        return sorted(
            sum(t.numel() for s in o.state.values() for t in s.values() if torch.is_tensor(t))
            for o in gc.get_objects()
            if isinstance(o, torch.optim.Optimizer)
        )

    with nbt.train_step(trainer, warmup=1) as step:
        before = nbt.memory_timeline(step, steps=1, model=trainer.model).peak_bytes
        optimizer, states = step.optimizer, state_elements()
        nbt.memory_timeline(step, steps=1, model=trainer.model)  # the run's last step
        after = nbt.memory_timeline(step, steps=2, model=trainer.model).peak_bytes  # restarted first
        assert step.optimizer is optimizer and state_elements() == states
    outcome = step.outcome
    assert outcome is not None and outcome.restarts == 1 and outcome.measured_steps == 4
    assert states and all(n > 0 for n in states)  # AdamW's state exists (exp_avg, exp_avg_sq, step)
    assert after == before, (before, after)
