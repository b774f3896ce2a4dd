"""The delayed progress bar: hidden for quick work, shown for slow work, always closed."""

from __future__ import annotations

import time

import pytest

from nbtoolkit.core.progress import progress


def test_quick_work_shows_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with progress("quick", total=3, delay_s=5.0) as bar:
        for _ in range(3):
            bar.update(1)
    assert "quick" not in capsys.readouterr().err


def test_slow_work_shows_the_bar_and_closes_it_on_error(capsys: pytest.CaptureFixture[str]) -> None:
    def slow_then_fail() -> None:
        with progress("slow work", total=2, delay_s=0.05) as bar:
            bars.append(bar)
            time.sleep(0.1)
            bar.update(1)
            raise RuntimeError("boom")

    bars: list[object] = []
    with pytest.raises(RuntimeError, match="boom"):
        slow_then_fail()
    assert "slow work" in capsys.readouterr().err
    assert getattr(bars[0], "disable", False) is True  # tqdm marks a closed bar disabled
