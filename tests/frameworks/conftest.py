"""Every test here leaves torch as it found it: no optimizer hook, no wrapped backward or GradScaler."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def no_loop_hooks_left() -> Iterator[None]:
    from torch.optim import optimizer as optim_module

    before = (torch.autograd.backward, torch.amp.GradScaler.step, torch.amp.GradScaler.update)
    yield
    from nbtoolkit.core import loop_boundaries

    assert loop_boundaries.active_listeners() == 0
    assert not optim_module._global_optimizer_post_hooks
    assert not optim_module._global_optimizer_pre_hooks
    assert (torch.autograd.backward, torch.amp.GradScaler.step, torch.amp.GradScaler.update) == before
