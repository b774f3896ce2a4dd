"""Fixtures of the optimize tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_intra_op_thread() -> Iterator[None]:
    """One torch thread while these tests run, restored afterwards.

    The CI machine has 2 cores shared with other jobs; with 2 intra-op threads every
    parallel region waits for both to be scheduled, and a 1 ms block forward can take
    300 ms. The planner's choices depend on measured forward times, so steadier is better.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def short_timing_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recompute planner's extra timing rounds (while its costs are imprecise) stop after 2 s
    here instead of 20: these tests check choices and displays, not the costs' precision, and
    the CI's 2 cores are shared."""
    from nbtoolkit.recompute import recompute_timing

    monkeypatch.setattr(recompute_timing, "TIME_LIMIT_S", 2.0)
