"""``nbt.train_step``: a training run as it is, as the zero-argument step every measuring API takes.

::

    step = nbt.train_step(trainer)                    # Hugging Face Trainer (or a subclass)
    step = nbt.train_step(trainer, module, datamodule=dm)   # Lightning Trainer + LightningModule
    step = nbt.train_step(my_accelerate_loop)         # any zero-argument callable running a loop

    nbt.profile(step, steps=3)                        # what the trainer does in 3 of its steps
    step.close()                                      # stop the trainer cleanly (or use `with`)

The step is a :class:`~nbtoolkit.core.training_loop.LoopSteps` with ``restart=True``: when the
trainer runs out of steps, the next step starts ``train()`` / ``fit()`` again. It carries
``.model`` (the HF trainer's model, the LightningModule, None for a callable) so that callers can
pass ``model=step.model``, and ``.optimizer`` once the loop stepped one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtoolkit.core.errors import LoopError
from nbtoolkit.core.loop_stop import HF_TRAINER, LIGHTNING_TRAINER, framework_of
from nbtoolkit.core.training_loop import LoopSteps

__all__ = ["train_step"]

KNOWN = (
    "a Hugging Face transformers.Trainer (or a subclass), a Lightning Trainer with its LightningModule "
    "(train_step(trainer, module, datamodule=...)), or a zero-argument callable that runs the loop "
    "(an accelerate or plain PyTorch loop)"
)


def _is_lightning_module(obj: Any) -> bool:
    return any(
        cls.__name__ == "LightningModule" and cls.__module__.startswith(("lightning.", "pytorch_lightning."))
        for cls in type(obj).__mro__
    )


def _lightning_fit(
    trainer: Any, module: Any, datamodule: Any, fit_kwargs: dict[str, Any]
) -> Callable[[], Any]:
    if module is None or not _is_lightning_module(module):
        raise LoopError(
            f"train_step(lightning Trainer, module) needs the LightningModule to fit as its second argument, "
            f"got {type(module).__name__}: call nbt.train_step(trainer, module, datamodule=...)"
        )

    def fit() -> Any:
        # A Trainer that was stopped before its max_steps resumes its step count on the next fit();
        # one that reached it gives no step, which LoopSteps reports as "no steps left".
        return trainer.fit(module, datamodule=datamodule, **fit_kwargs)

    return fit


def train_step(
    trainer: Any,
    module: Any = None,
    *,
    datamodule: Any = None,
    warmup: int = 1,
    step_time_limit_s: float | None = None,
    **fit_kwargs: Any,
) -> LoopSteps:
    """The training ``trainer`` runs, as a zero-argument step (a :class:`LoopSteps`).

    Args:
        trainer: a ``transformers.Trainer``, a Lightning ``Trainer`` (then ``module`` is the
            LightningModule to fit), or a zero-argument callable running a whole training loop.
        module: the LightningModule (Lightning only).
        datamodule: the LightningDataModule (Lightning only; or pass ``train_dataloaders=`` in
            ``fit_kwargs``).
        warmup: steps run unmeasured after the trainer's setup (and after each restart).
        step_time_limit_s: the longest one step may take (default 120 s, or NBTOOLKIT_LOOP_STEP_LIMIT).
        fit_kwargs: passed to ``trainer.fit`` (Lightning only).

    Raises:
        LoopError: ``trainer`` is none of the kinds above.
    """
    kind = framework_of(trainer)
    model: Any = None
    if kind == HF_TRAINER:
        if module is not None or datamodule is not None or fit_kwargs:
            raise LoopError(
                "train_step(transformers.Trainer) takes no module, datamodule or fit arguments: the trainer "
                "already holds its model and datasets; call nbt.train_step(trainer)"
            )
        loop: Callable[[], Any] = trainer.train
        model, name = trainer.model, "trainer.train()"
    elif kind == LIGHTNING_TRAINER:
        loop = _lightning_fit(trainer, module, datamodule, fit_kwargs)
        model, name = module, "trainer.fit()"
    elif callable(trainer) and not isinstance(trainer, type):
        if module is not None or datamodule is not None or fit_kwargs:
            raise LoopError(
                "train_step(callable) takes no module, datamodule or fit arguments: the callable runs the "
                "whole loop; wrap them in it (lambda: my_loop(model, data))"
            )
        loop, name = trainer, None
        model = getattr(trainer, "model", None)
    else:
        raise LoopError(f"train_step cannot run a {type(trainer).__name__}: it takes {KNOWN}")
    step = LoopSteps(
        loop,
        warmup=warmup,
        restart=True,
        step_time_limit_s=step_time_limit_s,
        name=name,
        trainer=trainer if kind is not None else None,
    )
    step.model = model
    return step
