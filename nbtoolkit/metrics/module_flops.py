"""Which module each counted op belongs to, forward, backward and recomputation alike.

Why not torch's ``ModuleTracker`` (what ``FlopCounterMode`` uses): it says a module is
running in backward between two gradient hooks, one on the module's outputs ("entered") and
one on its inputs ("left"). A module that returns its input (``nn.Identity``, ``nn.Dropout``
with p=0 or in eval, timm's ``fc_norm``/``head_drop``/``drop_path``/``ls``) has the same
tensor as input and output: its "left" hook fires before its "entered" one, so it is never
left, and every backward op after it is billed to it. On a timm ViT ``fc_norm`` and
``head_drop`` each carried 66.6% of the step and the shares added up to over 200%.

Here the attribution follows the autograd graph instead of tensors:

- *forward* (and the forward that activation checkpointing re-runs inside backward): the
  innermost module whose ``forward`` is running, from global forward pre/post hooks.
- *backward*: each op runs inside one autograd node (``torch._C._current_autograd_node()``),
  and each node was created by an op of one module's forward. When a module's forward
  returns, the nodes it created are found by walking back from its outputs' ``grad_fn``
  through ``next_functions``, keeping to the sequence numbers handed out during that call
  (``torch._C._autograd._get_sequence_nr()`` before and after: nodes of the module's inputs
  are older and stop the walk). Inner modules return first, so a node goes to the innermost
  module that created it. A module that creates no node (an Identity) owns nothing.

Every op thus has one owner (or none: ops outside every module, such as a loss computed in
the step function). *Exclusive* (``self_*``) FLOPs are the owner's; *inclusive* FLOPs are
the owner's and its callers' (the module that was running when it was first called, and so
on up): a parent's inclusive count is its own plus its children's, each op once.

Limits: a node no module output leads to (a value a module stores aside, such as an
auxiliary loss) stays unowned, and its backward FLOPs count only in the step's total.
Under non-reentrant checkpointing, an op the recomputation re-runs outside any module call
is billed to the module of the backward node that triggered the recomputation.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ModuleAttribution"]

# Past this nesting, an output structure is not searched for tensors (a self-referencing object).
_MAX_OUTPUT_DEPTH = 6


@dataclass
class _Call:
    """One running ``forward``: the module, its name, and the autograd sequence number at entry."""

    module: Any
    name: str
    first_sequence_nr: int


def _tensors(value: Any, depth: int = 0) -> Iterator[Any]:
    """The tensors in a module's output: tuples, lists, dicts (HF ``ModelOutput``), dataclasses."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif depth >= _MAX_OUTPUT_DEPTH or isinstance(value, (str, bytes)):
        return
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _tensors(item, depth + 1)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            yield from _tensors(getattr(value, name, None), depth + 1)


class ModuleAttribution:
    """``with ModuleAttribution() as modules: ...``: names the module each op belongs to.

    Installs global module forward hooks on entry and removes them on exit (also when the
    step raises). ``owner(backward=...)`` is the innermost module of the op running now;
    ``chain(name)`` that module and its callers, innermost first.
    """

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._alive: list[Any] = []  # keeps named modules alive so that their ids stay theirs
        self._taken: set[str] = set()
        self.parent: dict[str, str | None] = {}
        self._stack: list[_Call] = []
        self._node_owner: dict[Any, str] = {}
        self._handles: list[Any] = []

    # ---- context ---------------------------------------------------------------------
    def __enter__(self) -> ModuleAttribution:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [
            register_module_forward_pre_hook(self._enter_forward),
            # always_call: the hook runs when forward raises too, so the stack never keeps a
            # module that is no longer running
            register_module_forward_hook(self._leave_forward, always_call=True),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stack.clear()
        self._node_owner.clear()  # the nodes hold the step's graph: let it go
        self._alive.clear()

    # ---- names -----------------------------------------------------------------------
    def _name(self, module: Any) -> str:
        """The module's name: ``Root.attr.path`` for a module inside a called model, as torch's
        ModuleTracker names them; a module first met outside every named model is a new root
        named by its class (``Linear``, then ``Linear#2`` for another one)."""
        known = self._names.get(id(module))
        if known is not None:
            return known
        root = type(module).__name__
        if root in self._taken:
            number = 2
            while f"{root}#{number}" in self._taken:
                number += 1
            root = f"{root}#{number}"
        for path, sub in module.named_modules():
            if id(sub) not in self._names:
                name = f"{root}.{path}" if path else root
                self._names[id(sub)] = name
                self._taken.add(name)
                self._alive.append(sub)
        return self._names[id(module)]

    # ---- hooks -----------------------------------------------------------------------
    def _enter_forward(self, module: Any, args: Any) -> None:
        import torch

        name = self._name(module)
        if name not in self.parent:  # the first caller is the parent (a recomputation has none)
            self.parent[name] = self._stack[-1].name if self._stack else None
        self._stack.append(_Call(module, name, torch._C._autograd._get_sequence_nr()))

    def _leave_forward(self, module: Any, args: Any, output: Any) -> None:
        import torch

        for index in range(len(self._stack) - 1, -1, -1):
            if self._stack[index].module is module:
                call = self._stack[index]
                del self._stack[index:]
                break
        else:
            return  # entered before the hooks were installed
        end = torch._C._autograd._get_sequence_nr()
        if end == call.first_sequence_nr:
            return  # created no autograd node (no grad, or an Identity)
        self._claim_nodes(output, call, end)

    def _claim_nodes(self, output: Any, call: _Call, end: int) -> None:
        """Give ``call``'s module the nodes its forward created that no inner module claimed."""
        frontier = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
        seen: dict[int, Any] = {}  # holds the nodes too: a freed wrapper's id could come back
        while frontier:
            node = frontier.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            try:
                number = node._sequence_nr()
            except (AttributeError, RuntimeError):
                continue
            if not call.first_sequence_nr <= number < end:
                continue  # older (the module's inputs) or not a node of this call
            self._node_owner.setdefault(node, call.name)
            frontier.extend(child for child, _ in node.next_functions if child is not None)

    # ---- queries ---------------------------------------------------------------------
    def owner(self, *, backward: bool) -> str | None:
        """The innermost module of the op running now, or None when it belongs to none.

        In backward, the module whose forward created the running autograd node; else (the
        forward, a recomputation inside backward) the innermost running ``forward``.
        """
        import torch

        if backward:
            node = torch._C._current_autograd_node()
            if node is not None:
                name = self._node_owner.get(node)
                if name is not None:
                    return name
        return self._stack[-1].name if self._stack else None

    def chain(self, name: str) -> list[str]:
        """``name`` and the modules that called it, innermost first (each once)."""
        names: list[str] = []
        current: str | None = name
        while current is not None and current not in names:
            names.append(current)
            current = self.parent.get(current)
        return names
