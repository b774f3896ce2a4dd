"""Shared pieces of the notebook builders in this folder."""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

md = new_markdown_cell
IGNORE = "# NBVAL_IGNORE_OUTPUT\n"


def code(src):
    """A code cell; a first line ``# NBVAL_IGNORE_OUTPUT`` becomes nbval's cell tag instead.

    The tag also works for cell magics, whose first line must be the magic itself.
    """
    ignore = src.startswith(IGNORE)
    cell = new_code_cell(src[len(IGNORE):] if ignore else src)
    if ignore:
        cell.metadata["tags"] = ["nbval-ignore-output"]
    return cell


def write(cells, name):
    """Write notebooks/NAME.ipynb (unexecuted) with the python3 kernel."""
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, str(Path(__file__).resolve().parents[1] / f"{name}.ipynb"))
