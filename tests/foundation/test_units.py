"""The one place quantities are printed: the same number reads the same in every result."""

from __future__ import annotations

import math

import pytest

from nbtoolkit.core.units import (
    format_bytes,
    format_flop_rate,
    format_flops,
    format_percent,
    format_seconds,
    memory_viz_size,
)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0 B"), (512, "512 B"), (1023, "1,023 B"), (1024, "1.00 KiB"), (1536, "1.50 KiB"),
        (75.8 * 2**20, "75.80 MiB"), (-3 * 2**30, "-3.00 GiB"), (5 * 2**50, "5,120.00 TiB"),
        (None, "-"), (math.nan, "-"),
    ],
)
def test_format_bytes(value: float | None, text: str) -> None:
    assert format_bytes(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(2.5, "2.50 s"), (0.0123, "12.3 ms"), (0.0001, "100 µs"), (-0.002, "-2.0 ms"), (None, "-")],
)
def test_format_seconds(value: float | None, text: str) -> None:
    assert format_seconds(value) == text


def test_flops_and_percent() -> None:
    assert format_flops(1.234e9) == "1.23 GFLOP"
    assert format_flop_rate(312e12) == "312.00 TFLOP/s"
    assert format_flops(12) == "12 FLOP"
    assert [format_percent(x) for x in (0.412, 0.0412, 0.00041)] == ["41.2%", "4.12%", "0.041%"]


def test_memory_viz_size_matches_torch_text() -> None:
    # The exact strings torch.cuda._memory_viz prints, kept apart from format_bytes on purpose.
    assert memory_viz_size(4.1 * 2**30) == "4.1GiB"
    assert memory_viz_size(512) == "512.0B"


def test_every_result_module_uses_the_one_formatter() -> None:
    # One formatter, imported where it is defined: no module keeps a copy or lists it as its own.
    from nbtoolkit.memory import timeline as memory
    from nbtoolkit.recompute import comparison

    assert comparison.format_bytes is format_bytes is memory.format_bytes
    assert comparison.format_seconds is format_seconds
    assert "format_bytes" not in comparison.__all__ and "format_bytes" not in memory.__all__
