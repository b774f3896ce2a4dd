"""The magic and the API function it calls must show the same thing (issue 21).

``assert_same_display(a, b)`` compares what a notebook would show for each: the MIME bundle
of a result object (text and HTML), else its repr. ``mask`` blanks what differs between two
runs of a measurement (times), so two captures of the same cell compare equal.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest


def displayed(value: Any, mask: str | None = None) -> dict[str, str]:
    bundle = value._repr_mimebundle_() if hasattr(value, "_repr_mimebundle_") else {"text/plain": repr(value)}
    if mask:
        bundle = {kind: re.sub(mask, "<masked>", text) for kind, text in bundle.items()}
    return bundle


@pytest.fixture
def assert_same_display() -> Callable[..., None]:
    def check(from_magic: Any, from_api: Any, *, mask: str | None = None) -> None:
        assert type(from_magic) is type(from_api)
        assert displayed(from_magic, mask) == displayed(from_api, mask)

    return check
