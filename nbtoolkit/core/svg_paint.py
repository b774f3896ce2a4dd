"""Colours and raster images for a figure's static SVG (:mod:`nbtoolkit.core.figure_svg`).

- CSS colour strings (``#rgb``, ``#rrggbb``, ``rgb()``, ``rgba()``) to RGB, and lighter tints of
  them (plotly fills a stacked area with its line colour at half opacity; the static picture
  paints the same tint opaque, so that stacked areas can overlap without mixing);
- a colour scale (plotly's ``[[0, colour], ..., [1, colour]]``) applied to an array;
- a PNG encoder (zlib and struct from the standard library): a heatmap goes into the SVG as one
  small image, one pixel per cell, instead of one ``<rect>`` per cell.
"""

from __future__ import annotations

import base64
import re
import struct
import zlib
from typing import Any

import numpy as np

__all__ = ["apply_colorscale", "png_data_uri", "rgb_of", "tint"]

_RGB = re.compile(r"rgba?\(\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)")


def rgb_of(color: Any) -> tuple[int, int, int] | None:
    """The RGB of a hex or rgb()/rgba() colour string; None for a named colour or anything else."""
    if not isinstance(color, str):
        return None
    text = color.strip().lower()
    if text.startswith("#") and len(text) in (4, 7):
        digits = text[1:] if len(text) == 7 else "".join(c * 2 for c in text[1:])
        try:
            return int(digits[0:2], 16), int(digits[2:4], 16), int(digits[4:6], 16)
        except ValueError:
            return None
    match = _RGB.match(text)
    if match:
        r, g, b = (min(255, int(float(v))) for v in match.groups())
        return r, g, b
    return None


def tint(color: str, share: float = 0.5) -> str:
    """``color`` mixed with white (``share`` of the colour kept); a named colour stays as it is."""
    rgb = rgb_of(color)
    if rgb is None:
        return color
    r, g, b = (round(255 - (255 - c) * share) for c in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


def _scale_points(colorscale: Any) -> tuple[np.ndarray, np.ndarray]:
    """Positions (0..1) and RGB rows of a colour scale given as a name or a list of pairs."""
    if isinstance(colorscale, str) or not colorscale:
        from plotly.colors import get_colorscale

        try:
            colorscale = get_colorscale(colorscale or "Plasma")
        except Exception:  # an unknown name: plotly's own default scale
            colorscale = get_colorscale("Plasma")
    positions, colours = [], []
    for position, colour in colorscale:
        rgb = rgb_of(colour)
        if rgb is not None:
            positions.append(float(position))
            colours.append(rgb)
    if not positions:
        return np.array([0.0, 1.0]), np.array([[240, 240, 240], [40, 40, 40]], dtype=float)
    return np.asarray(positions), np.asarray(colours, dtype=float)


def apply_colorscale(
    values: np.ndarray, colorscale: Any, lo: float, hi: float, *, reverse: bool = False
) -> np.ndarray:
    """RGBA (uint8, shape ``values.shape + (4,)``) of ``values`` on the scale; NaN transparent."""
    positions, colours = _scale_points(colorscale)
    if reverse:
        positions, colours = 1.0 - positions[::-1], colours[::-1]
    span = hi - lo if hi > lo else 1.0
    share = np.clip((np.asarray(values, dtype=float) - lo) / span, 0.0, 1.0)
    finite = np.isfinite(share)
    share = np.where(finite, share, 0.0)
    out = np.zeros((*share.shape, 4), dtype=np.uint8)
    for channel in range(3):
        out[..., channel] = np.round(np.interp(share, positions, colours[:, channel])).astype(np.uint8)
    out[..., 3] = np.where(finite, 255, 0)
    return out


def png_data_uri(rgba: np.ndarray) -> str:
    """An RGBA image (rows top to bottom, uint8 ``(h, w, 4)``) as a ``data:image/png`` URI."""
    height, width = rgba.shape[:2]
    rows = np.ascontiguousarray(rgba, dtype=np.uint8).reshape(height, width * 4)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)  # filter type 0 (none) on every row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))  # 8-bit RGBA
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
