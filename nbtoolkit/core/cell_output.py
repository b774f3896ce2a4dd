"""A static output in the notebook cell where a widget was shown, written (and rewritten) later.

A widget's view dies with the kernel ("Error displaying widget: model not found") and
nbconvert keeps only its text; what a person must still read later is written as an ordinary
output instead: a ``display_data`` message (``text/html`` and ``text/plain``) whose parent is
the cell's own ``execute_request``. JupyterLab keeps a cell's request open until the cell runs
again, so the output lands in that cell even when it is sent long after the cell finished
(from a button's handler); later versions replace it in place (``update_display_data``, one
``display_id``). It is saved with the notebook and exported like any other output.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

__all__ = ["CellOutput"]


class CellOutput:
    """One output slot in the cell that called :meth:`bind` (the cell that displays its owner)."""

    def __init__(self) -> None:
        self.display_id = f"nbt-{uuid.uuid4().hex}"
        self.bundle: dict[str, str] | None = None  # what was written last
        self._parent: dict[str, Any] | None = None
        self._shown = False

    def bind(self) -> None:
        """Remember the request being handled now (call it while the owner is displayed)."""
        import sys

        module = sys.modules.get("ipykernel.kernelbase")
        if module is not None and module.Kernel.initialized():
            parent = module.Kernel.instance().get_parent("shell")
            if parent and parent.get("header", {}).get("msg_type") == "execute_request":
                self._parent = parent

    @contextlib.contextmanager
    def _in_cell(self) -> Iterator[None]:
        """Display messages sent inside go to the bound cell (ipykernel's per-thread parent)."""
        from IPython import get_ipython

        shell = get_ipython()
        publisher = getattr(shell, "display_pub", None)
        if self._parent is None or publisher is None or not hasattr(publisher, "set_thread_parent"):
            yield
            return
        token = publisher.set_thread_parent(self._parent)
        try:
            yield
        finally:
            publisher.reset_thread_parent(token)

    def show(self, bundle: dict[str, str]) -> None:
        """Write ``bundle`` (mime type -> text) as the slot's output: the first time appended to the
        cell's outputs, afterwards replacing it."""
        from IPython.display import display

        self.bundle = dict(bundle)
        with self._in_cell():
            display(self.bundle, raw=True, display_id=self.display_id, update=self._shown)
        self._shown = True
