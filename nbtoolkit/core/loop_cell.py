"""``--loop`` of the measuring cell magics: is the cell one step, or a whole training loop?

``%%nbt profile``, ``%%nbt memory``, ``%%nbt graphs`` and ``%%nbt metrics`` run their cell as a
step function, or, with ``--loop``, as a training loop whose steps the API finds
(:mod:`nbtoolkit.core.loop_measure`). Without ``--loop`` or ``--no-loop`` the magic decides from
the cell's code, parsed with :mod:`ast` (nothing is run to decide):

- a call ``X.train(...)`` or ``X.fit(...)`` where ``X`` is not a ``torch.nn.Module``
  (``model.train()`` switches a module to training mode: that is no loop). ``X`` is looked up
  in the notebook when it is a name there; otherwise its spelling decides (``trainer``,
  ``Trainer(...)``, anything with "trainer" in it);
- a ``for`` or ``while`` loop whose body calls ``X.step(...)`` on an optimizer (an object in the
  notebook that is a ``torch.optim.Optimizer``, else a name with "optim" in it or ``opt``), or
  ``scaler.step(optimizer)`` (AMP's GradScaler steps the optimizer it is given).

The magic says what it found above its result: "measured as a training loop (the cell calls
trainer.train()); --no-loop measures the cell as one step".
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Callable
from typing import Any

from nbtoolkit.core.loop_measure import AFTER_CHOICES
from nbtoolkit.core.magic_registry import Argument, MagicCall

__all__ = ["LOOP_ARGUMENTS", "cell_code", "cell_is_loop", "loop_reason"]

LOOP_ARGUMENTS = (
    Argument(
        "--loop",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the cell runs a whole training (trainer.train(), trainer.fit(...), a loop over batches): "
        "measure its training steps, found at each optimizer step, after its warm-up steps. "
        "Default: decided from the cell's code (a .train()/.fit() call on a trainer, or an "
        "optimizer.step() inside a for/while loop); --no-loop measures the cell as one step",
    ),
    Argument(
        "--after",
        choices=AFTER_CHOICES,
        default="stop",
        help="with a loop: stop it once its steps are measured (stop, the default) or let it run on "
        "to its end, unmeasured (continue)",
    ),
)


def cell_code(args: argparse.Namespace, call: MagicCall) -> tuple[Callable[[], Any], bool]:
    """The cell as a function, and whether it is a training loop (:func:`cell_is_loop`)."""
    loop = cell_is_loop(args, call)
    code = call.cell_function()
    if loop:  # not a name to show: the loop's notes and errors call it "the training loop"
        code.__name__ = "<cell>"
    return code, loop


def cell_is_loop(args: argparse.Namespace, call: MagicCall) -> bool:
    """``--loop``/``--no-loop`` as given; else whether the cell looks like a loop (said in the output)."""
    if args.loop is not None:
        return bool(args.loop)
    reason = loop_reason(call.cell or "", call.user_ns, transform=call.shell.transform_cell)
    if reason is None:
        return False
    print(f"measured as a training loop ({reason}); --no-loop measures the cell as one step")
    return True


def loop_reason(source: str, user_ns: dict[str, Any], *, transform: Any = None) -> str | None:
    """Why the cell's code looks like a training loop (``"the cell calls trainer.train()"``), or None."""
    try:
        tree = ast.parse(transform(source) if transform is not None else source)
    except SyntaxError:
        return None  # running the cell reports its syntax error
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _method(node) in ("train", "fit"):
            receiver = node.func.value  # type: ignore[attr-defined]  # _method checked it is an Attribute
            if _is_trainer(receiver, user_ns):
                return f"the cell calls {ast.unparse(receiver)}.{_method(node)}()"
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            for inner in (n for statement in node.body for n in ast.walk(statement)):
                if not isinstance(inner, ast.Call) or _method(inner) != "step":
                    continue
                if _steps_optimizer(inner, user_ns):
                    kind = "while" if isinstance(node, ast.While) else "for"
                    return f"the cell runs {ast.unparse(inner.func)}() inside a {kind} loop"
    return None


def _method(call: ast.Call) -> str | None:
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def _value(node: ast.expr, user_ns: dict[str, Any]) -> tuple[bool, Any]:
    """(True, the object) when ``node`` is a name or ``a.b`` path that exists in the notebook."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in user_ns:
        return False, None
    value = user_ns[node.id]
    for part in reversed(parts):
        try:
            value = getattr(value, part)
        except Exception:  # a property that raises: decide from the spelling
            return False, None
    return True, value


def _instance_of(value: Any, module: str, dotted: str) -> bool:
    """isinstance against a torch class, without importing torch for a notebook that has none."""
    if module not in sys.modules:
        return False
    target: Any = sys.modules[module]
    for part in dotted.split("."):
        target = getattr(target, part, None)
    return isinstance(target, type) and isinstance(value, target)


def _is_trainer(receiver: ast.expr, user_ns: dict[str, Any]) -> bool:
    known, value = _value(receiver, user_ns)
    if known:
        return not _instance_of(value, "torch", "nn.Module")
    if isinstance(receiver, ast.Call):  # Trainer(...).train()
        receiver = receiver.func
    return "trainer" in ast.unparse(receiver).lower()


def _steps_optimizer(call: ast.Call, user_ns: dict[str, Any]) -> bool:
    receiver = call.func.value  # type: ignore[attr-defined]  # _method checked it is an Attribute
    known, value = _value(receiver, user_ns)
    if known and _instance_of(value, "torch", "optim.Optimizer"):
        return True
    spelled = ast.unparse(receiver).lower()
    if "scaler" in spelled:
        return bool(call.args)  # scaler.step(optimizer)
    return "optim" in spelled or spelled.rsplit(".", 1)[-1] == "opt"
