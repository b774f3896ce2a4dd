"""Every name in nbtoolkit.__all__ resolves to a real object (the lazy map has no dangling entries)."""

from __future__ import annotations

import nbtoolkit as nbt


def test_every_public_name_resolves() -> None:
    missing = []
    for name in nbt.__all__:
        try:
            getattr(nbt, name)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, "public names that do not resolve:\n" + "\n".join(missing)
