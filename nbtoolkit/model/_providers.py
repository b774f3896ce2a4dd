"""Methods on model objects whose work is done by a higher layer, found through a registry.

The model layer is the bottom of the house: it imports no analysis, view or optimization
(tests/foundation/test_layers.py fails if it does). Yet ``timeline.peak_bytes``,
``timeline.figure()`` or ``report.explorer()`` read best as methods of the object. So the model
class declares the method and asks this registry for the function that does the work; the
layer that owns the work registers it with ``@provides("MemoryTimeline.figure")`` where the
function is defined.

The registry is filled when those modules are imported. The top package (``nbtoolkit``)
installs a loader that imports them on the first lookup that misses, so a method works
however the object was made (``nbt.load_memory_timeline``, a pickle from a rank, ``load``),
and ``import nbtoolkit`` stays as light as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["add_loader", "provided", "provides"]

_Function = TypeVar("_Function", bound=Callable[..., Any])

# "Class.method" -> the function of a higher layer that implements it.
_PROVIDERS: dict[str, Callable[..., Any]] = {}
# Called once each on the first miss; the top package adds the one that imports every layer.
_LOADERS: list[Callable[[], None]] = []


def provides(name: str) -> Callable[[_Function], _Function]:
    """Register the decorated function as the implementation of the model method ``name``."""

    def register(function: _Function) -> _Function:
        _PROVIDERS[name] = function
        return function

    return register


def add_loader(loader: Callable[[], None]) -> None:
    """Add a callable that imports the modules registering providers (run on the first miss)."""
    _LOADERS.append(loader)


def provided(name: str) -> Callable[..., Any]:
    """The function registered for the model method ``name``; loads the providing layers once if needed."""
    function = _PROVIDERS.get(name)
    while function is None and _LOADERS:
        _LOADERS.pop(0)()
        function = _PROVIDERS.get(name)
    if function is None:
        raise NotImplementedError(
            f"{name} is implemented outside nbtoolkit.model and nothing registered it: "
            "import nbtoolkit (the package registers every layer) rather than a model module alone"
        )
    return function
