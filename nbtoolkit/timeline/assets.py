"""Where the front-end sources of nbtoolkit's custom widgets are, in a wheel and in a checkout.

The sources live in the repository's top-level ``widgets/`` folder (ES modules and CSS, no build
step). The wheel ships them inside the package as ``nbtoolkit/_widgets`` (pyproject's
``[tool.hatch.build.targets.wheel.force-include]``). An installed package looks there first; a
source checkout (editable install, or ``PYTHONPATH`` pointing at the repository) has no
``_widgets`` and finds ``widgets/`` beside the package instead.
"""

from __future__ import annotations

from pathlib import Path

from nbtoolkit.core.errors import NbtError

__all__ = ["WIDGET_DIR_IN_PACKAGE", "widget_asset", "widget_dirs"]

WIDGET_DIR_IN_PACKAGE = "_widgets"  # must match the force-include target in pyproject.toml


def widget_dirs(package_dir: Path | None = None) -> list[Path]:
    """The folders searched for widget sources, in order: the wheel's, then the checkout's."""
    package = package_dir if package_dir is not None else Path(__file__).resolve().parents[1]
    return [package / WIDGET_DIR_IN_PACKAGE, package.parent / "widgets"]


def widget_asset(name: str, *, package_dir: Path | None = None) -> Path:
    """The path of the front-end file ``name`` (``timeline.js``); a clear error if it is not shipped."""
    searched = widget_dirs(package_dir)
    for folder in searched:
        candidate = folder / name
        if candidate.is_file():
            return candidate
    raise NbtError(
        f"nbtoolkit's widget source {name!r} is missing (looked in {', '.join(map(str, searched))}); "
        "the installation is incomplete: reinstall nbtoolkit (the wheel ships it as nbtoolkit/_widgets)"
    )
