"""The package's public surface: the exception tree, the sorted lazy __all__, fast import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import nbtoolkit as nbt
from nbtoolkit.core.result import Result, escape, html_table

HEAVY = ["torch", "ray", "deepspeed", "plotly", "pandas", "pyarrow"]


def test_all_is_sorted_unique_and_covers_the_lazy_map() -> None:
    assert nbt.__all__ == sorted(set(nbt.__all__))
    assert set(nbt._LAZY_EXPORTS) <= set(nbt.__all__)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'not_a_thing'"):
        nbt.not_a_thing


def test_every_error_derives_from_nbterror() -> None:
    errors = [nbt.TraceError, nbt.CompileLogError, nbt.SnapshotError, nbt.PlanError,
              nbt.ClusterError, nbt.CaptureError, nbt.MetricsError, nbt.NbtUsageError]
    for error in errors:
        assert issubclass(error, nbt.NbtError)
    # IPython shows our errors as one line, not as a traceback through nbtoolkit's internals.
    assert nbt.TraceError("bad file x.json")._render_traceback_() == ["TraceError: bad file x.json"]


def _modules_after(code: str) -> dict[str, bool]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_and_load_ext_import_nothing_heavy() -> None:
    loaded = _modules_after(
        "import nbtoolkit\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance()\n"
        "shell.run_line_magic('load_ext', 'nbtoolkit')\n"
        "from nbtoolkit.magic_dispatch import help_text\n"
        "help_text()\n"
    )
    heavy = [name for name, present in loaded.items() if present]
    assert not heavy, f"%load_ext nbtoolkit imported heavy modules: {heavy}"


class _Sample(Result):
    def __init__(self, name: str) -> None:
        self.name = name

    def _text(self) -> str:
        return f"Sample {self.name}"

    def _html(self) -> str:
        return f"<b>{escape(self.name)}</b>"


def test_result_bundle_always_has_plain_text_and_escapes_html() -> None:
    bundle = _Sample("<script>alert(1)</script>")._repr_mimebundle_()
    assert bundle["text/plain"] == "Sample <script>alert(1)</script>"
    assert "<script>" not in bundle["text/html"]
    assert "&lt;script&gt;" in bundle["text/html"]
    assert repr(_Sample("x")) == "Sample x"


def test_html_table_escapes_cells_and_headers() -> None:
    import pandas as pd
    frame = pd.DataFrame({"<th>": ["<img src=x onerror=alert(1)>", "ok"], "n": [1234567, 2]})
    html = html_table(frame)
    assert "<img" not in html and "&lt;img" in html
    assert "&lt;th&gt;" in html
    assert "1,234,567" in html


def test_every_declared_dependency_is_imported_by_the_package() -> None:
    # pyproject declares nothing that nbtoolkit never imports (dev tools aside): a dependency
    # is a cost every user installs, so it must earn its place in the code.
    import ast
    import importlib.metadata
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib", reason="tomllib (Python 3.11+) reads pyproject.toml")
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    # The frameworks extra installs what nbtoolkit measures, not what it runs on: it recognises a
    # Trainer by its class's module (core/loop_stop.py) and never imports the framework, so that
    # `%load_ext nbtoolkit` never pays for transformers. Those packages are checked below by name.
    measured_not_imported = {"frameworks"}
    declared = list(project["dependencies"]) + [
        d for name, deps in extras.items() if name not in ("dev", "all", *measured_not_imported) for d in deps
    ]
    modules_of: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            modules_of.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    imported: set[str] = set()
    for path in (root / "nbtoolkit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
    unused = []
    for requirement in declared:
        dist = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        modules = modules_of.get(dist)
        assert modules, f"{dist} is declared but not installed here: run `make setup`"
        if not modules & imported:
            unused.append(dist)
    assert not unused, f"declared in pyproject.toml but never imported by nbtoolkit: {unused}"
    # Each package of the frameworks extra is one nbtoolkit knows by name (an adapter or a detector).
    source = "\n".join(p.read_text() for p in (root / "nbtoolkit").rglob("*.py"))
    for name in measured_not_imported:
        for requirement in extras[name]:
            dist = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()
            assert dist in source, f"{dist} is in the {name} extra but nbtoolkit never names it"
