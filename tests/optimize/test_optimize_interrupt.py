"""``nbt.optimize`` stopped by a real SIGINT (Kernel → Interrupt, Ctrl-C) mid-compile and mid-step:
KeyboardInterrupt within a second, and the model as it was (issue 41; the optimize panel relies
on it to say "interrupted" and nothing more).

The signal is sent by a timer thread once the progress callback reports the chosen moment; the
measurement runs under ``core.main_thread.interruptible`` as the panel's does.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import nbtoolkit as nbt
from nbtoolkit.core.main_thread import interruptible
from tests.optimize._models import make_gpt


@pytest.fixture(scope="module", autouse=True)
def _torch_compile_initialised() -> None:
    # torch's first torch.compile installs its own LazyTraceHandler (one-time init, not ours)
    torch.compile(lambda x: x + 1, backend="eager")(torch.zeros(1))


def _last_before_run(done: int, total: int, what: str) -> bool:
    """The before-side is measured; the next step is the first compiled one (compilation)."""
    return what.startswith("compiling") or what == "before: memory step"


def _after_timed(done: int, total: int, what: str) -> bool:
    return what == "after: timed step" or (what.startswith("measuring") and done * 2 > total)


def _before_timed(done: int, total: int, what: str) -> bool:
    """During the baseline: the unchanged model's warm-up, before anything is applied."""
    return what.startswith("warming up") and "before the change" in what


def _interrupted_run(
    compile: dict[str, Any], moment: Callable[[int, int, str], bool], delay_s: float
) -> tuple[Any, dict[str, Any], list[str], float]:
    torch.manual_seed(0)
    model, step = make_gpt(hidden=[64, 128, 64, 128])
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    labels: list[str] = []
    sent: dict[str, float] = {}

    def progress(done: int, total: int, what: str) -> None:
        labels.append(what)
        if "armed" not in sent and moment(done, total, what):
            sent["armed"] = 0.0

            def send() -> None:
                time.sleep(delay_s)
                sent["at"] = time.monotonic()
                os.kill(os.getpid(), signal.SIGINT)

            threading.Thread(target=send, daemon=True).start()

    with pytest.raises(KeyboardInterrupt):
        interruptible(lambda: nbt.optimize(model, step, compile=compile, recompute=["blocks.0", "blocks.2"],
                                           steps=20, progress=progress))
    took = time.monotonic() - sent["at"]
    torch._dynamo.reset()
    return model, initial, labels, took


def _as_before(model: Any, initial: dict[str, Any]) -> tuple[bool, bool]:
    unwrapped = all("forward" not in m.__dict__ for m in model.modules())  # no compile, no checkpoint
    weights = all(torch.equal(initial[k], v) for k, v in model.state_dict().items())
    return unwrapped, weights


@pytest.mark.slow
def test_interrupt_mid_compile_stops_at_once_and_restores_the_model() -> None:
    model, initial, labels, took = _interrupted_run({"backend": "inductor"}, _last_before_run, 0.2)
    assert not any(label.startswith("after:") for label in labels)  # no compiled step had finished
    assert took < 1.0
    assert _as_before(model, initial) == (True, True)


def test_interrupt_mid_step_stops_at_once_and_restores_the_model() -> None:
    model, initial, _, took = _interrupted_run({"backend": "eager"}, _after_timed, 0.05)
    assert took < 1.0
    assert _as_before(model, initial) == (True, True)


def test_interrupt_during_the_baseline_restores_the_weights_too() -> None:
    model, initial, _, took = _interrupted_run({"backend": "eager"}, _before_timed, 0.05)
    assert took < 1.0
    assert _as_before(model, initial) == (True, True)
