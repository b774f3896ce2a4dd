"""nbtoolkit's plotly figures: interactive where plotly.js runs, a static SVG everywhere else.

Every figure function of the package returns a :class:`StaticFigure`, a plotly ``go.Figure``
(everything plotly offers works on it) whose display carries, beside plotly's own JSON
(``application/vnd.plotly.v1+json``: JupyterLab, Notebook 7 and VS Code draw it interactively),
a ``text/html`` static picture: an inline SVG drawn by :mod:`nbtoolkit.core.figure_svg`. nbconvert's
HTML export, GitHub's notebook view, nbviewer and any front end without plotly's renderer show that
picture; the front ends that have one rank plotly's JSON first and stay interactive.

Why an SVG drawn here and not one of plotly's own static forms:

- plotly's ``text/html`` needs plotly.js: loaded from a CDN (no figure offline), or inlined, about
  4.8 MB. Once per figure, a notebook of 10 figures grows by 48 MB; once per notebook, the
  figures depend on the one output that carries the library (cleared or re-run out of order, they
  all go blank), and every notebook still grows by megabytes.
- kaleido (plotly's SVG/PNG export) drives a Chrome the user's machine may not have, and starts
  a browser for each export: not something a fresh clone or a CI runner can count on.
- matplotlib would be a second plotting library to install for one job.

The SVG costs no dependency, renders offline, is deterministic (same figure, same bytes), and
stays tens of kilobytes per figure whatever the data (lines thinned to the pixel, heatmaps as one
small PNG). What it gives up is interaction: no hover or zoom in the static copy.

plotly is imported when this module is (figure functions import it inside themselves), so
``%load_ext nbtoolkit`` stays light.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

__all__ = ["STATIC_MIME", "StaticFigure", "static_figure", "static_html"]

STATIC_MIME = "text/html"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
# A display bundle that holds one of these already has a form that needs no plotly.js.
_STATIC_FORMS = ("text/html", "image/svg+xml", "image/png", "image/jpeg")


def static_html(figure: Any) -> str:
    """The figure's static picture as the HTML that goes into a display bundle."""
    from nbtoolkit.core.figure_svg import figure_svg

    return f"<div class='nbt-figure-static'>{figure_svg(figure)}</div>"


class StaticFigure(go.Figure):
    """A ``go.Figure`` whose notebook display also carries a static SVG (see the module docstring)."""

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, validate: bool = True, **kwargs: Any
    ) -> dict[str, Any]:
        """plotly's bundle for the current renderers, plus the static picture where it has none.

        A renderer that already gives a static form (``pio.renderers.default = "png"`` or
        ``"notebook"``, which inlines plotly.js) is the user's choice and is left as it is.
        """
        return self._with_static(dict(super()._repr_mimebundle_(include, exclude, validate, **kwargs) or {}))

    def _with_static(self, bundle: dict[str, Any]) -> dict[str, Any]:
        if not any(kind in bundle for kind in _STATIC_FORMS):
            bundle[STATIC_MIME] = static_html(self)
        return bundle

    def _ipython_display_(self) -> None:
        """Show plotly's mimetype output and the static picture together, as one output.

        With renderers that produce no mimetype output (``"browser"`` opens a tab), plotly's
        own display runs unchanged: there is no notebook output to add a picture to.
        """
        import plotly.io as pio
        from IPython.display import display

        if not (pio.renderers.render_on_display and pio.renderers.default):
            super()._ipython_display_()
            return
        bundle = dict(super()._repr_mimebundle_() or {})
        if not bundle:
            super()._ipython_display_()
            return
        display(self._with_static(bundle), raw=True)


def static_figure(figure: Any) -> StaticFigure:
    """``figure`` as a :class:`StaticFigure` (a figure built elsewhere, e.g. by a helper we do not own)."""
    if isinstance(figure, StaticFigure):
        return figure
    return StaticFigure(figure)
