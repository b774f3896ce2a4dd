"""ipywidgets that keep a static form: ``text/html`` beside the widget view in their display bundle.

A widget's view needs its model, and the model lives in the kernel. After the kernel shuts down,
in nbconvert's HTML export, on GitHub or nbviewer, the view has nothing to draw. Front ends
render the richest form of a bundle they can: nbconvert skips a widget view whose state the
notebook did not save (JupyterLab saves none unless asked) and shows the bundle's ``text/html``
instead. So every widget nbtoolkit shows carries a static HTML form of what it shows, computed
when it is displayed: the timeline widgets an SVG overview (:mod:`nbtoolkit.timeline.widget`),
the boxes built here whatever HTML their maker gives.

ipywidgets is imported when a box is made, not with this module.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

__all__ = ["static_vbox"]


@lru_cache(maxsize=1)
def _static_vbox_class() -> type:
    import ipywidgets as widgets

    class StaticVBox(widgets.VBox):
        """A VBox whose display bundle also holds ``nbt_static_html()`` as ``text/html``."""

        nbt_static_html: Callable[[], str]

        def _repr_mimebundle_(self, **kwargs: Any) -> Any:
            bundle = super()._repr_mimebundle_(**kwargs)
            data = bundle[0] if isinstance(bundle, tuple) else bundle
            if isinstance(data, dict) and "application/vnd.jupyter.widget-view+json" in data:
                data["text/html"] = self.nbt_static_html()
            return bundle

    return StaticVBox


def static_vbox(children: list[Any], static_html: Callable[[], str], **kwargs: Any) -> Any:
    """An ipywidgets ``VBox`` of ``children`` whose display also carries ``static_html()``.

    ``static_html`` is called at each display, so the static form shows the widget's state then
    (escape foreign text in it, as everywhere: :func:`nbtoolkit.core.result.escape`).
    """
    box = _static_vbox_class()(children, **kwargs)
    box.nbt_static_html = static_html
    return box
