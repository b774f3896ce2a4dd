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
