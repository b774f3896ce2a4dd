"""Unpack wheels into one folder for PYTHONPATH, without pip (the device machine may lack it).

A wheel is a zip of what pip would copy into site-packages; pip also sets the executable bits
recorded in the zip (PuLP's bundled CBC solver needs them), so this does too. Wheels of a
distribution that is already unpacked in the target (same file name) are skipped.

Usage: python3 scripts/unpack_wheels.py WHEEL_FOLDER TARGET_FOLDER
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path


def unpack(wheels: Path, target: Path) -> list[str]:
    target.mkdir(parents=True, exist_ok=True)
    done = target / ".unpacked"
    seen = set(done.read_text().split()) if done.exists() else set()
    unpacked = []
    for wheel in sorted(wheels.glob("*.whl")):
        if wheel.name in seen:
            continue
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                path = Path(archive.extract(info, target))
                mode = (info.external_attr >> 16) & 0o777
                if mode & 0o111 and path.is_file():
                    path.chmod(mode | 0o644)
        seen.add(wheel.name)
        unpacked.append(wheel.name)
    done.write_text("\n".join(sorted(seen)))
    return unpacked


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    names = unpack(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"[gpu-truth] unpacked {len(names)} wheel(s) into {sys.argv[2]}")
