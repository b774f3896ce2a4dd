"""Fixtures of the cluster tests: the multi-host bed (three network namespaces, Ray on two), and a
local two-rank cluster per test module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.multihost import BedUnavailable, MultiHostBed, bed_unavailable_reason


@pytest.fixture(scope="module")
def multihost() -> Iterator[MultiHostBed]:
    """A Ray head on host 1 and a worker node on host 2; this process is host 3 (see multihost.py).

    Skips naming the reason where the bed cannot be built (not root, not inside a private
    network namespace, no `ip`); a bed that fails to start fails the tests with the step
    and Ray's log. Namespaces and processes are removed afterwards, whatever happened.
    """
    reason = bed_unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        bed = MultiHostBed.start()
    except BedUnavailable as exc:
        pytest.fail(str(exc))
    try:
        yield bed
    finally:
        bed.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A local 2-rank cluster for one test module (gloo; 120 s for a collective, time enough on a
    loaded 2-core machine), closed after it. A module needing other sizes defines its own."""
    import nbtoolkit as nbt

    local = nbt.Cluster.local(ranks=2, collective_timeout_s=120)
    try:
        yield local
    finally:
        local.close()
