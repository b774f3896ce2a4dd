"""Rank-prefixed output: each line a rank printed appears as ``[rank N] line`` in the notebook.

Chunks arrive from ranks in arbitrary pieces (half lines, several lines); a line is
printed once it is complete, so lines of different ranks never mix. What remains
unterminated when the call ends is flushed with :meth:`RankPrefixedPrinter.flush`.
"""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["RankPrefixedPrinter", "prefix_lines"]


def prefix_lines(rank: int, text: str) -> str:
    """``text`` with ``[rank N] `` before every line (a trailing newline is kept)."""
    lines = text.splitlines(keepends=True)
    return "".join(f"[rank {rank}] {line}" for line in lines)


class RankPrefixedPrinter:
    """An output callback for :meth:`Cluster.execute` writing prefixed lines to our streams."""

    def __init__(self, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> None:
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._partial: dict[tuple[int, str], str] = {}

    def _stream(self, name: str) -> TextIO:
        chosen = self._streams.get(name)
        if chosen is not None:
            return chosen
        return sys.stderr if name == "stderr" else sys.stdout

    def __call__(self, rank: int, stream: str, text: str) -> None:
        key = (rank, stream)
        buffered = self._partial.pop(key, "") + text
        complete, _, rest = buffered.rpartition("\n")
        if rest:
            self._partial[key] = rest
        if complete or buffered.endswith("\n"):
            out = self._stream(stream)
            out.write(prefix_lines(rank, complete + "\n"))
            out.flush()

    def flush(self) -> None:
        for (rank, stream), rest in sorted(self._partial.items()):
            out = self._stream(stream)
            out.write(prefix_lines(rank, rest + "\n"))
            out.flush()
        self._partial.clear()
