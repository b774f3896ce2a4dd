"""The handle every reversible model change returns: ``.undo()`` puts the model back exactly.

Changes are made by setting an instance attribute ``forward`` on a module (the class's
``forward`` stays untouched); undoing restores the previous instance attribute, or removes
it when there was none. Nothing else about the module (parameters, buffers, hooks,
state_dict) is touched, so after ``undo()`` the model is the object it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Applied", "ForwardStates", "replace_forward"]

_MISSING = object()


class Applied:
    """A list of undo actions, run in reverse order by :meth:`undo` (idempotent).

    Also a context manager: ``with plan.apply(model): ...`` undoes on exit.
    ``changes`` describes in words what was applied.
    """

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self.changes: list[str] = []
        self.undone = False

    def add(self, description: str, undo: Callable[[], None]) -> None:
        self.changes.append(description)
        self._undo.append(undo)

    def extend(self, other: Applied) -> None:
        """Take over another handle's changes (undone together, in reverse order)."""
        self.changes.extend(other.changes)
        self._undo.extend(other._undo)
        other._undo = []

    def undo(self) -> None:
        """Restore the model as it was before the changes. Safe to call twice."""
        while self._undo:
            self._undo.pop()()
        self.undone = True

    def __enter__(self) -> Applied:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()

    def __repr__(self) -> str:
        state = "undone" if self.undone and not self._undo else "applied"
        return f"<Applied ({state}): {'; '.join(self.changes) or 'nothing'}>"


def replace_forward(
    module: Any, make: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> Callable[[], None]:
    """Set ``module.forward = make(current_forward)``; return the function that restores it."""
    previous = module.__dict__.get("forward", _MISSING)
    module.forward = make(module.forward)

    def restore() -> None:
        if previous is _MISSING:
            module.__dict__.pop("forward", None)
        else:
            module.forward = previous

    return restore


class ForwardStates:
    """The ``forward`` instance attributes of every module of a model at one moment, to put back;
    and any other instance attributes named in ``also`` (the library checkpointing flags that
    applying a plan turns off, ``nbtoolkit.recompute.framework_checkpointing``).

    ``nbt.optimize`` captures the model before and after applying its changes and switches
    between the two for every interleaved step: setting attributes back costs microseconds,
    and the compiled forward object stays the same, so switching never recompiles.
    """

    def __init__(self, model: Any, also: tuple[str, ...] = ()) -> None:
        names = ("forward", *also)
        self._values = [
            (module, name, module.__dict__.get(name, _MISSING))
            for module in model.modules()
            for name in names
        ]

    def restore(self) -> None:
        """Set every captured instance attribute back to what it was when captured."""
        for module, name, value in self._values:
            if value is _MISSING:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = value
