"""The house by feature: packages named by what they do, over a small core, with one-way imports.

Read from the code itself (the AST of every module; imports inside functions and under
``TYPE_CHECKING`` counted like any other), so a new arrow that goes the wrong way fails here
before anyone has to notice it. README, "How the code is laid out", draws the same picture.

- Every top-level package is a feature declared in :data:`NEEDS`, with the features it may
  import. ``core`` imports no feature; a feature imports ``core`` and what it declares.
- The declared needs form no circle, and no two files import each other through any path: a
  module's imports go one way, down, inside a feature as between features.
- Inside a feature the magic module is the top: no module of the package imports it (only the
  dispatcher at the top of the house, ``nbtoolkit.magic_dispatch``).
- A module past :data:`REVIEW_LINES` lines is a soft limit: it is listed in :data:`REVIEWED`
  with why it stays whole, or it is split by job.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nbtoolkit"

# feature -> the features it may import (core is implied for all but core). Bottom to top.
NEEDS: dict[str, set[str]] = {
    "core": set(),
    "timeline": set(),
    "metrics": set(),
    "trace": {"timeline", "metrics"},
    "memory": {"timeline"},
    "compile": set(),
    "recompute": {"memory", "metrics"},
    "cluster": {"trace", "memory", "compile", "metrics"},
    "integrations": {"cluster", "recompute", "trace", "memory", "compile"},
    "reporting": set(),
    "capacity": {"recompute", "metrics", "integrations"},
}
TOP = {"nbtoolkit", "nbtoolkit.magic_dispatch"}  # the package's __init__ and the magic dispatcher wire it all
REVIEW_LINES = 600
# module -> why it stays one module past REVIEW_LINES lines (a review, not a waiver: say the job).
REVIEWED: dict[str, str] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _feature(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and module not in TOP else "top"


def _imports(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute name) of every nbtoolkit import in the file, wherever it sits."""
    module = module or _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name == "nbtoolkit" or name.startswith("nbtoolkit.")]


MODULES = sorted(PACKAGE.rglob("*.py"))
NAMES = {_module_name(p): p for p in MODULES}


def _resolve(name: str, names: dict[str, Path]) -> str | None:
    """The module an imported name lives in (``a.b.C`` -> ``a.b``), or None outside the package."""
    while name not in names and "." in name:
        name = name.rpartition(".")[0]
    return name if name in names else None


def _graph(names: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {module it imports: first line}, every import counted."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in names.items():
        targets: dict[str, int] = {}
        for line, imported in _imports(path, name):
            target = _resolve(imported, names)
            if target is not None and target not in (name, "nbtoolkit"):
                targets.setdefault(target, line)
        graph[name] = targets
    return graph


def _wrong_feature_imports(path: Path, module: str) -> str | None:
    """A message naming the imports of ``path`` that reach a feature it does not declare, or None."""
    feature = _feature(module)
    if feature == "top":
        return None
    allowed = {feature} | ({"core"} if feature != "core" else set()) | NEEDS.get(feature, set())
    wrong = [
        f"line {line}: {target}"
        for line, target in _imports(path, module)
        if _feature(target) not in allowed and target != "nbtoolkit"
    ]
    if not wrong:
        return None
    return (
        f"{path.name} is in feature {feature!r}, which may import only {sorted(allowed)}; it imports "
        + "; ".join(wrong)
        + ". Move the code to where it belongs, or declare the need in NEEDS if the feature really has it."
    )


def _cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle of ``graph`` (depth-first search for a back edge), or None."""
    state: dict[str, int] = {}
    trail: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        trail.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*trail[trail.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        trail.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_every_feature_is_declared() -> None:
    features = {_feature(name) for name in NAMES} - {"top"}
    assert features <= set(NEEDS), f"new package(s) {features - set(NEEDS)}: declare them in NEEDS"
    for feature, needs in NEEDS.items():
        assert needs <= set(NEEDS) - {"core"}, f"{feature} needs an undeclared feature: {needs}"


def test_declared_needs_form_no_circle() -> None:
    assert _cycle({f: dict.fromkeys(n, 0) for f, n in NEEDS.items()}) is None


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_stay_inside_declared_features(path: Path) -> None:
    problem = _wrong_feature_imports(path, _module_name(path))
    assert problem is None, problem


def test_declared_needs_are_used() -> None:
    # NEEDS is the picture of the house: a need no import uses any more is removed from it
    used: dict[str, set[str]] = {}
    for source, targets in _graph(NAMES).items():
        for target in targets:
            if _feature(source) not in ("top", _feature(target)):
                used.setdefault(_feature(source), set()).add(_feature(target))
    unused = {f: needs - used.get(f, set()) for f, needs in NEEDS.items()}
    stale = {f: sorted(names) for f, names in unused.items() if names}
    assert not stale, f"declared in NEEDS but never imported: {stale}"


def test_no_import_cycle_between_files() -> None:
    graph = _graph(NAMES)
    cycle = _cycle(graph)
    assert cycle is None, "import cycle (every import counted): " + " -> ".join(cycle or [])


def test_a_feature_magic_is_the_top_of_its_feature() -> None:
    graph = _graph(NAMES)
    magics = {name for name in NAMES if name.endswith(".magic")}
    assert magics, "no feature magic modules found"
    wrong = [
        f"{source} imports {target} (line {line})"
        for source, targets in graph.items()
        for target, line in targets.items()
        if target in magics and source not in TOP
    ]
    assert not wrong, "; ".join(wrong)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_a_long_module_was_reviewed(path: Path) -> None:
    name = _module_name(path)
    lines = len(path.read_text().splitlines())
    if lines > REVIEW_LINES:
        assert name in REVIEWED, (
            f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it by job, or list it in "
            "REVIEWED with the one job it holds"
        )


def test_the_checks_can_fail(tmp_path: Path) -> None:
    # A core module reaching a feature inside a function, a relative import reaching an undeclared
    # feature, a type-only import closing a circle, and a module importing a magic are all named.
    sample = tmp_path / "probe.py"
    sample.write_text("def f():\n    from nbtoolkit.memory.figures import timeline_figure\n")
    problem = _wrong_feature_imports(sample, "nbtoolkit.core.probe") or ""
    assert "line 2: nbtoolkit.memory.figures" in problem
    sample.write_text("from ..cluster import cluster\nfrom . import _kernels\n")
    problem = _wrong_feature_imports(sample, "nbtoolkit.trace.probe") or ""
    assert "line 1: nbtoolkit.cluster.cluster" in problem and "_kernels" not in problem
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nbtoolkit.x.b import B\n")
    b.write_text("def f():\n    from nbtoolkit.x.a import A\n")
    cycle = _cycle(_graph({"nbtoolkit.x.a": a, "nbtoolkit.x.b": b}))
    assert cycle is not None and set(cycle) == {"nbtoolkit.x.a", "nbtoolkit.x.b"}
    assert _cycle({"core": {}, "trace": {"core": 0}}) is None


def test_no_package_hides_a_public_name() -> None:
    # Importing nbtoolkit.X sets the attribute X on the package, over the lazy public name:
    # a feature package named like a public function (nbt.report) would make it a module.
    import nbtoolkit

    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert not (packages | modules) & set(nbtoolkit.__all__)
