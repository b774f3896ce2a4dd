"""nbt.report / %nbt report: one self-contained, escaped HTML file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbtoolkit as nbt
from nbtoolkit.core.result import Result, escape


class _Finding(Result):
    def __init__(self, name: str, with_figure: bool = False) -> None:
        self.name = name
        self.with_figure = with_figure

    def _text(self) -> str:
        return f"Finding {self.name}"

    def _html(self) -> str:
        return f"<p class='finding'>{escape(self.name)}</p>"

    def _report_figures(self) -> list[object]:
        if not self.with_figure:
            return []
        import plotly.graph_objects as go

        return [go.Figure(go.Bar(x=["rank 0", "rank 1"], y=[41.5, 58.25]))]


def test_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    out = nbt.report(
        ("Overlap <script>alert(1)</script>", _Finding("<img src=x onerror=alert(1)>", with_figure=True)),
        _Finding("second"),
        path=tmp_path / "r.html",
        title="review <b>",
    )
    text = (tmp_path / "r.html").read_text()
    assert out.sections == ("Overlap <script>alert(1)</script>", "_Finding 2")
    assert out.size_bytes == (tmp_path / "r.html").stat().st_size
    assert "<script>alert(1)</script>" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "review &lt;b&gt;" in text
    # plotly.js is inlined exactly once and nothing is loaded from a network.
    assert text.count("plotly.js v") >= 1
    assert re.search(r"<script[^>]*\bsrc=", text) is None
    assert "<link " not in text
    assert "58.25" in text


def test_report_refuses_bad_paths_and_empty_input(tmp_path: Path) -> None:
    with pytest.raises(nbt.NbtUsageError, match="needs at least one result"):
        nbt.report(path=tmp_path / "r.html")
    with pytest.raises(nbt.NbtUsageError, match=r"ending in \.html"):
        nbt.report(_Finding("a"), path=tmp_path / "r.txt")
    with pytest.raises(nbt.NbtUsageError, match="does not exist"):
        nbt.report(_Finding("a"), path=tmp_path / "missing" / "r.html")
    # a bare number has nothing to show: refused, naming the item, before anything is written
    with pytest.raises(nbt.NbtUsageError, match="cannot show item 2, a int"):
        nbt.report(_Finding("a"), 5, path=tmp_path / "n.html")
    assert not (tmp_path / "n.html").exists()


def test_report_shows_text_notes_as_escaped_paragraphs(tmp_path: Path) -> None:
    written = nbt.report(_Finding("a"), ("why", "<b>bold</b> & more"), path=tmp_path / "r.html")
    text = written.path.read_text()
    assert "<p>&lt;b&gt;bold&lt;/b&gt; &amp; more</p>" in text
    assert written.sections == ("_Finding 1", "why")


def test_report_magic_collects_the_notebook_results(tmp_path: Path) -> None:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbtoolkit")
    try:
        shell.user_ns["finding_a"] = _Finding("alpha")
        shell.user_ns["_private"] = _Finding("hidden")
        target = tmp_path / "nb.html"
        written = shell.run_line_magic("nbt", f"report {target} --title Review")
        assert "finding_a" in written.sections
        assert "_private" not in written.sections
        assert "alpha" in target.read_text()
        result = shell.run_cell(f"%nbt report {tmp_path / 'x.html'} no_such_var")
        assert isinstance(result.error_in_exec, nbt.NbtUsageError)
    finally:
        shell.run_line_magic("unload_ext", "nbtoolkit")
        shell.user_ns.pop("finding_a", None)
        shell.user_ns.pop("_private", None)


def test_report_of_a_profiled_trace_embeds_its_timeline(tmp_path: Path) -> None:
    import torch

    layer = torch.nn.Linear(8, 8)
    trace = nbt.profile(lambda: layer(torch.randn(4, 8)).sum().backward(), steps=1, warmup=0)
    out = nbt.report(("profile", trace), path=tmp_path / "t.html")
    text = (tmp_path / "t.html").read_text()
    assert out.sections == ("profile",)
    assert "plotly.js v" in text  # the timeline figure came along, with plotly inlined
    assert "aten::addmm" in text or "aten::linear" in text
