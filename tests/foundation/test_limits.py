"""The readers' limits: one table, each raised through its environment variable, refused when no size."""

from __future__ import annotations

import pytest

from nbtoolkit.core.bounded import LIMITS, limit, limit_hint
from nbtoolkit.core.errors import NbtUsageError


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_each_limit_has_a_default_and_is_raised_by_its_variable(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = LIMITS[name]
    assert spec.env.startswith("NBT_MAX_") and spec.default > 0 and spec.bounds
    monkeypatch.delenv(spec.env, raising=False)
    assert limit(name) == spec.default
    raised = min(2 * spec.default, spec.most or 2 * spec.default)
    monkeypatch.setenv(spec.env, str(raised))
    assert limit(name) == raised
    assert spec.env in limit_hint(name) and "raise it" in limit_hint(name)
    for bad in ("lots", "-5", "0"):
        monkeypatch.setenv(spec.env, bad)
        with pytest.raises(NbtUsageError, match=spec.env):
            limit(name)


def test_sizes_take_units_and_counts_take_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBT_MAX_EVENT_BYTES", "1.5GiB")
    assert limit("event_bytes") == int(1.5 * 2**30)
    monkeypatch.setenv("NBT_MAX_WORLD_SIZE", "1MiB")
    with pytest.raises(NbtUsageError, match="NBT_MAX_WORLD_SIZE='1MiB' is not a positive whole number"):
        limit("world_size")
