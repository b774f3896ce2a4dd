"""Which training framework runs a loop, and how to ask it to stop after the current step.

:class:`~nbtoolkit.core.training_loop.LoopSteps` pauses a training loop inside its optimizer step.
To end the loop cleanly after the measured steps, it asks the framework the loop runs in to stop
the way the framework's own callbacks do (early stopping), so that the trainer finishes its step,
runs its end-of-training code and stays usable for the next ``train()`` / ``fit()``:

- Hugging Face ``transformers.Trainer`` (and subclasses): ``trainer.control.should_training_stop``;
  the training loop checks it after each step's callbacks, which never reset it once set (the
  flag is reset only by ``on_train_begin``, at the start of the next ``train()``).
- Lightning ``Trainer`` (``lightning.pytorch`` or ``pytorch_lightning``): ``trainer.should_stop``,
  checked by the epoch and fit loops after each batch (``fit()`` resets it at its start).
- Anything else: no flag; :class:`~nbtoolkit.core.errors.TrainingStopped` is raised in the loop.

The framework object is found in the loop's own frames (the ``self`` of the frame that called
the optimizer's step, or one above it), so nothing is imported here: a framework the user does not
have is simply never recognised.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["Framework", "find_framework", "framework_of"]

HF_TRAINER = "transformers.Trainer"
LIGHTNING_TRAINER = "lightning Trainer"
PLAIN_LOOP = "plain loop"


@dataclass
class Framework:
    """The framework running a loop: ``kind`` (``"transformers.Trainer"``, ``"lightning Trainer"``
    or ``"plain loop"``) and its trainer object (None for a plain loop)."""

    kind: str
    trainer: Any = None

    @property
    def stop_flag(self) -> str | None:
        """How messages name the flag that stops this framework, or None (a plain loop)."""
        if self.kind == HF_TRAINER:
            return "HF control.should_training_stop"
        if self.kind == LIGHTNING_TRAINER:
            return "Lightning trainer.should_stop"
        return None

    def request_stop(self) -> bool:
        """Set the framework's stop flag; False when it has none (the caller raises instead)."""
        if self.kind == HF_TRAINER:
            control = getattr(self.trainer, "control", None)
            if control is None or not hasattr(control, "should_training_stop"):
                return False
            control.should_training_stop = True
            return True
        if self.kind == LIGHTNING_TRAINER:
            self.trainer.should_stop = True
            return True
        return False

    def known_optimizers(self) -> int | None:
        """How many optimizers step in one training step when the framework fixes it, else None.

        The HF Trainer steps one optimizer. Lightning with automatic optimization steps one (Lightning
        2 supports a single optimizer there); manual optimization may step any number.
        """
        if self.kind == HF_TRAINER:
            return 1
        if self.kind == LIGHTNING_TRAINER:
            module = getattr(self.trainer, "lightning_module", None)
            if module is not None and getattr(module, "automatic_optimization", False):
                return 1
        return None

    def steps_left(self) -> int | None:
        """Optimizer steps the trainer will still take before it ends on its own (counting the one
        in progress at a pause, which has not yet been counted), or None when it cannot tell."""
        try:
            if self.kind == HF_TRAINER:
                state = self.trainer.state
                max_steps, done = int(state.max_steps), int(state.global_step)
            elif self.kind == LIGHTNING_TRAINER:
                max_steps, done = int(self.trainer.max_steps), int(self.trainer.global_step)
            else:
                return None
        except (AttributeError, TypeError, ValueError):
            return None
        if max_steps <= 0:  # -1: bounded by epochs, which nbtoolkit does not count
            return None
        # At a pause the step in progress has stepped its optimizer but not yet counted itself.
        return max(max_steps - done - 1, 0)


    def no_steps_advice(self) -> str:
        """What to do about a loop that ended without stepping an optimizer."""
        if self.kind == LIGHTNING_TRAINER:
            done = getattr(self.trainer, "global_step", "?")
            most = getattr(self.trainer, "max_steps", "?")
            return (
                f"The Lightning Trainer is at global_step {done} of max_steps {most}: its next fit() "
                "continues that count, so once reached it has no steps left. Raise "
                "trainer.fit_loop.max_steps (or max_epochs), or make a new Trainer"
            )
        if self.kind == HF_TRAINER:
            return (
                "The HF Trainer's train() stepped no optimizer: raise args.max_steps / num_train_epochs, "
                "or give it a training dataset with rows"
            )
        return "Check that the loop calls optimizer.step() (a step ends at an optimizer step)"


def _class_names(obj: Any) -> list[tuple[str, str]]:
    return [(cls.__module__, cls.__name__) for cls in type(obj).__mro__]


def framework_of(obj: Any) -> str | None:
    """``"transformers.Trainer"`` / ``"lightning Trainer"`` when ``obj`` is (a subclass of) one."""
    for module, name in _class_names(obj):
        if name != "Trainer":
            continue
        if module.startswith("transformers."):
            return HF_TRAINER
        if module.startswith(("lightning.pytorch.", "pytorch_lightning.")):
            return LIGHTNING_TRAINER
    return None


def find_framework(frame: Any = None) -> Framework:
    """The framework whose trainer runs ``frame`` (default: the caller's frame) or a frame above it.

    Read once per loop, at its first optimizer step (a walk of a few dozen frames).
    """
    frame = frame if frame is not None else sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if candidate is not None:
            kind = framework_of(candidate)
            if kind is not None:
                return Framework(kind, candidate)
        frame = frame.f_back
    return Framework(PLAIN_LOOP)
