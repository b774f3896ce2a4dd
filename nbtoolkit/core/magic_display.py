"""``--widget`` / ``--static``: the choice between the zoomable timeline widget and the static
figure, shared by the magics that can show one (``trace``, ``memory``, ``snapshot``).

**Widget or static, in the magics** (``%nbt trace``, ``%%nbt memory``, ``%nbt snapshot``):
``--widget`` / ``--static`` decide for one call; otherwise :func:`widgets_enabled` does:

- ``NBT_WIDGETS=1`` (or ``on``) always, ``NBT_WIDGETS=0`` (or ``off``) never;
- ``NBT_WIDGETS`` unset or ``auto``: a widget only in a kernel that a widget-capable front end
  started: an IPython *kernel* (not terminal IPython) that Jupyter Server started for a notebook
  (it sets ``JPY_SESSION_NAME``: JupyterLab, Notebook 7), or VS Code (``VSCODE_PID``) or Colab.
  Kernels started by nbval, nbconvert or papermill have none of these, so walkthroughs
  validated by nbval and exported reports keep their static figures and text unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from nbtoolkit.core.errors import NbtUsageError
from nbtoolkit.core.magic_registry import Argument

__all__ = ["DISPLAY_ARGUMENTS", "WIDGETS_ENV", "show_widget", "widgets_enabled"]

WIDGETS_ENV = "NBT_WIDGETS"
_ON = {"1", "on", "yes", "true", "widget"}
_OFF = {"0", "off", "no", "false", "static"}

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
        raise NbtUsageError("--widget and --static exclude each other: pick one")
    if args.widget or args.static:
        return bool(args.widget)
    return bool(widgets_enabled())


def widgets_enabled(environ: dict[str, str] | None = None, shell: Any = None) -> bool:
    """Whether the magics show a widget (see the module docstring for the rule)."""
    env = os.environ if environ is None else environ
    mode = env.get(WIDGETS_ENV, "auto").strip().lower() or "auto"
    if mode in _ON:
        return True
    if mode in _OFF:
        return False
    if mode != "auto":
        raise NbtUsageError(f"{WIDGETS_ENV}={mode!r} is not one of auto, 1/on, 0/off")
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:  # plain Python, terminal IPython
        return False
    return bool(env.get("JPY_SESSION_NAME") or env.get("VSCODE_PID") or "google.colab" in sys.modules)
