"""``--widget`` / ``--static``: the choice between the zoomable timeline widget and the static
figure, shared by the magics that can show one (``trace``, ``memory``, ``snapshot``)."""

from __future__ import annotations

import argparse

from nbtoolkit.core.magic_registry import Argument

__all__ = ["DISPLAY_ARGUMENTS", "show_widget"]

DISPLAY_ARGUMENTS = (
    Argument(
        "--static",
        action="store_true",
        help="static figure and text, no widget (the default outside widget front ends; see NBT_WIDGETS)",
    ),
    Argument("--widget", action="store_true", help="the zoomable timeline widget, whatever the front end"),
)


def show_widget(args: argparse.Namespace) -> bool:
    """--widget / --static for this call, else the front end's default (``widgets_enabled()``)."""
    if args.widget and args.static:
        from nbtoolkit.core.errors import NbtUsageError

        raise NbtUsageError("--widget and --static exclude each other: pick one")
    if args.widget or args.static:
        return bool(args.widget)
    from nbtoolkit.timeline.static import widgets_enabled

    return bool(widgets_enabled())
