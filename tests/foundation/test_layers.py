"""The house has one-way layers: a module imports only its own layer and the layers below it.

Read from the code itself (the AST of every module, imports inside functions and under
TYPE_CHECKING included), so a new upward import fails here before anyone has to notice it.
The layers, bottom to top (README, "Development"):

    base           errors, units
    model          plain data, schemas, constants, the ProfilerStep parser
    io, analysis   readers/writers of model objects; pure functions of model objects (siblings:
                   neither imports the other)
    capture        every run of an instrument (profiler, memory profiler, compile capture, FLOPs)
    optimizations  reversible model changes and their measurement
    views          figures, widgets, HTML
    cluster        Ray ranks and torch.distributed
    integrations   DeepSpeed
    magics         the IPython layer; the package's __init__ sits on top of everything

A model method whose work lives higher up goes through nbtoolkit.model._providers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "nbtoolkit"

BASE = {"errors", "units"}
# layer -> the layers it may import (its own layer is always allowed).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "units": {"errors"},
    "model": BASE,
    "io": BASE | {"model"},
    "datasets": BASE,  # the real-data locator: an io-level module that needs nothing but errors
    "analysis": BASE | {"model"},
    "capture": BASE | {"model", "io", "analysis"},
    "optimizations": BASE | {"model", "io", "analysis", "capture"},
    "views": BASE | {"model", "io", "analysis", "capture", "optimizations"},
    "cluster": BASE | {"model", "io", "datasets", "analysis", "capture", "optimizations", "views"},
    "integrations": BASE | {"model", "io", "analysis", "capture", "optimizations", "views", "cluster"},
    "magics": BASE | {"model", "io", "datasets", "analysis", "capture", "optimizations", "views", "cluster",
                      "integrations"},
}
MAX_LINES = 520  # "about 500": a module past this holds more than one job; split it by job

def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "nbtoolkit"


def _type_only_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports that never run)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(child) for stmt in node.body for child in ast.walk(stmt)}
    return inside


def _imports(path: Path, module: str | None = None, *, runtime_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every nbtoolkit import in the file, wherever it sits.

    ``runtime_only`` leaves out imports under ``if TYPE_CHECKING:``: a module may name a type of a
    sibling that imports it (no cycle at run time), but never a type of a higher layer.
    """
    module = module or _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_only_nodes(tree) if runtime_only else set()
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{alias.name}" for alias in node.names] if target.count(".") == 1 or \
                target == "nbtoolkit" else [target]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name == "nbtoolkit" or name.startswith("nbtoolkit.")]


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_layer_is_declared() -> None:
    layers = {_layer(_module_name(p)) for p in MODULES} - {"nbtoolkit"}
    assert layers <= set(ALLOWED), f"new top-level module(s) {layers - set(ALLOWED)}: give them a layer here"


def _upward_imports(path: Path, module: str) -> str | None:
    """A message naming the imports of ``path`` that go to a higher layer, or None."""
    layer = _layer(module)
    if layer == "nbtoolkit":
        return None  # the package's __init__ is the top: it wires every layer
    allowed = ALLOWED[layer] | {layer}
    upward = [
        f"line {line}: {target}"
        for line, target in _imports(path, module)
        if target != "nbtoolkit" and _layer(target) not in allowed and _layer(target) in ALLOWED
    ]
    if not upward:
        return None
    return (
        f"{path.name} is in layer {layer!r}, which may import only {sorted(allowed)}; it imports "
        + "; ".join(upward)
        + ". Move the code down, or let the higher layer register it in nbtoolkit.model._providers."
    )


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_upward_import(path: Path) -> None:
    problem = _upward_imports(path, _module_name(path))
    assert problem is None, problem


def test_no_import_cycle_between_modules() -> None:
    # Imports that run (TYPE_CHECKING blocks aside), inside functions included.
    names = {_module_name(p): p for p in MODULES}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = set()
        for _, imported in _imports(path, runtime_only=True):
            target = imported
            while target not in names and "." in target:
                target = target.rpartition(".")[0]  # a name imported from a module: the module
            if target in names and target not in (name, "nbtoolkit"):
                targets.add(target)
        graph[name] = targets
    # Depth-first search for a back edge; report the cycle it closes.
    state: dict[str, int] = {}
    trail: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        trail.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*trail[trail.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        trail.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_module_holds_one_job(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it by job"


def test_the_detector_sees_upward_and_relative_imports(tmp_path: Path) -> None:
    # The checks above must be able to fail: a model module importing views inside a function,
    # or analysis reaching io through a relative import, is named with its line.
    sample = tmp_path / "probe.py"
    sample.write_text("def f():\n    from nbtoolkit.views.memory import timeline_figure\n")
    assert "line 2: nbtoolkit.views.memory" in (_upward_imports(sample, "nbtoolkit.model.probe") or "")
    sample.write_text("from ..io import kineto\nfrom . import _intervals\n")
    problem = _upward_imports(sample, "nbtoolkit.analysis.probe") or ""
    assert "line 1: nbtoolkit.io.kineto" in problem and "_intervals" not in problem
