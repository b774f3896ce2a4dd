"""nbt.train_step on a real Lightning Trainer (CPU, a tiny MLP, an in-memory datamodule).

Lightning counts its optimizer steps in ``trainer.global_step`` (each optimizer's step, in manual
optimization); the assertions hold nbtoolkit's counts against it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("lightning", reason="lightning (the frameworks extra) is not installed")

import nbtoolkit as nbt

from ._models import tiny_lightning

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


def test_steps_of_trainer_fit_then_a_clean_stop_and_the_next_fit_goes_on() -> None:
    trainer, module, data = tiny_lightning(max_steps=9)
    step = nbt.train_step(trainer, module, datamodule=data, warmup=2)
    assert step.model is module and step.__name__ == "trainer.fit()"
    with step:
        for _ in range(3):
            step()
    outcome = step.outcome
    assert outcome is not None and outcome.framework == "lightning Trainer"
    assert trainer.global_step == 5 and outcome.stopped_by == "Lightning trainer.should_stop"
    assert outcome.measured_steps == 3 and outcome.backward_passes_per_step == [1, 1, 1]
    assert "trainer.should_stop" in outcome.note()
    # Lightning's next fit() on the same Trainer goes on from step 5 to its max_steps
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 9 and not trainer.interrupted


def test_manual_optimization_with_two_optimizers_steps_whole_cycles() -> None:
    trainer, module, data = tiny_lightning(max_steps=40, manual_gan=True)
    with nbt.train_step(trainer, module, datamodule=data, warmup=2) as step:
        step.start()
        before = trainer.global_step
        step()
        step()
        # Lightning counts each optimizer's step: two per batch, so four in two steps
        assert trainer.global_step - before == 4
    outcome = step.outcome
    assert outcome is not None and outcome.optimizers == 2 and outcome.irregular_steps == 0
    assert outcome.backward_passes_per_step == [2, 2]


def test_a_stop_flag_the_trainer_does_not_honour_falls_back_to_raising() -> None:
    # min_steps makes Lightning ignore should_stop until it is reached
    trainer, module, data = tiny_lightning(max_steps=40, min_steps=30)
    with nbt.train_step(trainer, module, datamodule=data, warmup=1) as step:
        step()
    outcome = step.outcome
    assert outcome is not None and outcome.stopped_by.startswith("nbtoolkit.TrainingStopped")
    # the flag was given three more optimizer steps, then the loop was stopped by raising
    assert trainer.global_step == 2 + 3
    # stopped by raising through Lightning's interrupt handling, the Trainer still fits on
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 40


def test_a_trainer_at_its_max_steps_says_it_has_no_steps_left() -> None:
    trainer, module, data = tiny_lightning(max_steps=3)
    trainer.fit(module, datamodule=data)
    step = nbt.train_step(trainer, module, datamodule=data)
    with pytest.raises(nbt.LoopEndedError, match=r"global_step 3 of max_steps 3.*fit_loop\.max_steps"):
        step()


def test_train_step_needs_the_lightning_module() -> None:
    trainer, _, _ = tiny_lightning(max_steps=3)
    with pytest.raises(nbt.LoopError, match="needs the LightningModule"):
        nbt.train_step(trainer)
