"""What to change to remove a graph break: one hint per common kind of break, each one checked.

A hint is given only where the change it names is known to remove the break: every hint
here has a test in ``tests/graphs/test_fix_hints.py`` that compiles the break and the code
changed as the hint says, on torch 2.13, and finds the break gone (the Hugging Face ones
on a small random-weight Llama). Where no hint of ours fits, the report shows torch's own
first hint, marked as torch's (nbtoolkit has not checked it).

A break is matched on its type (torch's ``gb_type``), torch's explanation and developer
context (``reason``), where it is (``user_file``; ``inside_torch`` when the break was inside
torch's own code) and the source line: the same ``.item()`` needs a different change when
its number feeds an ``if``. First matching rule wins.

Findings behind the wording (torch 2.13):

- ``Tensor.backward()``: torch's hint reads "Set torch._dynamo.trace_autograd_ops=True"; the
  setting is ``torch._dynamo.config.trace_autograd_ops``, and it removes the break only when
  the compiled function does not return the loss itself (``return loss`` gives a new break,
  "autograd.grad consumed returned tensor's grad_fn"; ``return loss.detach()`` does not).
- torch's optimizer graph-breaks on purpose around every ``step()`` (``_use_grad`` in
  torch/optim/optimizer.py); ``torch.compile(opt.step)`` on its own still breaks there.
  Only calling ``opt.step()`` outside the compiled function removes those breaks.
- ``Optimizer.zero_grad`` is marked as skipped by Dynamo: it runs eagerly wherever it is called.
- ``capture_scalar_outputs = True`` removes an ``.item()`` break when the number is used in
  tensor math, but not when a Python ``if`` tests it: that becomes "Data-dependent branching".
- transformers: gradient checkpointing with ``use_cache=True`` logs a warning
  (``logger.warning_once``) that breaks the graph; a decoder layer checkpointed by
  ``torch.utils.checkpoint`` (e.g. ``apply_activation_checkpointing``) writes the KV cache,
  "HOP: Unsafe side effect". ``model.config.use_cache = False`` removes both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FIX_HINTS", "BreakFacts", "classify_break", "fix_hint"]


@dataclass(frozen=True)
class BreakFacts:
    """What the hints look at, from one row of a GraphReport's ``breaks``."""

    gb_type: str
    explanation: str = ""
    reason: str = ""  # torch's whole message: explanation, hints and developer context
    user_file: str = ""  # the break site (a library's file when the break is inside one)
    source_line: str = ""
    inside_torch: str = ""  # "torch/optim/optimizer.py:79" when the break was inside torch


def _has(pattern: str, *fields: str) -> Callable[[BreakFacts], bool]:
    compiled = re.compile(pattern)
    return lambda f: any(compiled.search(getattr(f, name) or "") for name in fields)


def _all(*tests: Callable[[BreakFacts], bool]) -> Callable[[BreakFacts], bool]:
    return lambda f: all(t(f) for t in tests)


def _none(test: Callable[[BreakFacts], bool]) -> Callable[[BreakFacts], bool]:
    return lambda f: not test(f)


_TYPE_AND_EXPLANATION = ("gb_type", "explanation")
_USER_GRAPH_BREAK = _has(r"torch\._dynamo\.graph_break\(\)", *_TYPE_AND_EXPLANATION)
_IN_TORCH_OPTIM = _has(r"^torch[/\\]optim[/\\]", "inside_torch")
_IN_TRANSFORMERS = _has(r"[/\\]transformers[/\\]", "user_file")
_HF_CHECKPOINT_WARNING = _has(
    r"use_cache=True` is incompatible with gradient checkpointing|Caching is incompatible with gradient "
    r"checkpointing",
    "reason",
)
_SCALAR = _has(
    r"Tensor\.item\(\)|capture_scalar_outputs|Data dependent operator|tolist\(\)", *_TYPE_AND_EXPLANATION
)
# the number is tested by Python: `if loss.item() > x:`, `while ...`, `assert ...`, `a if t.item() else b`
_BRANCHES = _has(r"^\s*(?:if|elif|while|assert)\b|\bif\b.+\belse\b", "source_line")

_HF_USE_CACHE = (
    "Set model.config.use_cache = False (or pass use_cache=False to the model) for training. "
    "transformers keeps a KV cache only for generation; with gradient checkpointing it warns and switches "
    "the cache off itself, and that warning breaks the graph, while a decoder layer checkpointed with "
    "torch.utils.checkpoint writes the cache inside the checkpoint, which Dynamo cannot trace "
    "(HOP: Unsafe side effect)."
)

# (category, test, hint). First match wins. Every hint names torch 2.13's actual API and is
# checked by tests/graphs/test_fix_hints.py.
FIX_HINTS: list[tuple[str, Callable[[BreakFacts], bool], str]] = [
    (
        "optimizer",
        _all(_USER_GRAPH_BREAK, _IN_TORCH_OPTIM),
        (
            "Call opt.step() outside the compiled function (e.g. right after it). torch's optimizer breaks "
            "the graph on purpose around every step() (torch/optim/optimizer.py, _use_grad), so that the "
            "update is traced without autograd; torch.compile(opt.step) on its own still breaks there once."
        ),
    ),
    (
        "torch_internal",
        _all(_USER_GRAPH_BREAK, lambda f: bool(f.inside_torch)),
        (
            "This graph_break() call is torch's own (see inside_torch), reached from the line shown; "
            "nbtoolkit knows no change that removes it other than calling that torch function outside "
            "the compiled function."
        ),
    ),
    (
        "graph_break_call",
        _USER_GRAPH_BREAK,
        "Remove the explicit torch._dynamo.graph_break() call: it splits the graph on purpose.",
    ),
    (
        "backward",
        _has(r"Unsupported Tensor\.backward\(\) call", "gb_type"),
        (
            "To trace backward() into the graph, set torch._dynamo.config.trace_autograd_ops = True and "
            "return loss.detach() rather than loss from the compiled function (a returned loss whose graph "
            "backward() consumed breaks again). Without it, this break costs only the switch out of the "
            "graph: the backward pass runs in autograd's engine either way and is not counted in its cost."
        ),
    ),
    ("hf_use_cache", _all(_has(r"^HOP: Unsafe side effect", "gb_type"), _IN_TRANSFORMERS), _HF_USE_CACHE),
    ("hf_use_cache", _HF_CHECKPOINT_WARNING, _HF_USE_CACHE),
    (
        "checkpoint_side_effect",
        _all(_has(r"^HOP: Unsafe side effect", "gb_type"), _has(r"checkpoint", "explanation", "reason")),
        (
            "Move the write (to a dict, list or object attribute outside the function) out of the "
            "checkpointed function, or set "
            "torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True if the write need not "
            "be repeated when the backward pass recomputes the function."
        ),
    ),
    (
        "scalar_branch",
        _all(_SCALAR, _BRANCHES),
        (
            "Keep this check out of the compiled step: return the tensor and test it after the step (or "
            "decide with tensors, torch.where). The number decides a Python branch here, so "
            "torch._dynamo.config.capture_scalar_outputs = True would only move the break to the branch "
            "(Data-dependent branching)."
        ),
    ),
    (
        "scalar",
        _SCALAR,
        (
            "Set torch._dynamo.config.capture_scalar_outputs = True, so that Dynamo traces .item() into the "
            "graph as a symbolic number, or keep the value a tensor. The break comes from turning a tensor "
            "into a Python number (.item(), .tolist(), float(t)); .tolist() of float tensors still breaks."
        ),
    ),
    (
        "logging",
        _all(
            # the builtin named is warnings.warn; other builtins' explanations cite it as an example
            _has(r"logging\.Logger|logging function|builtin `_?warnings\.warn", *_TYPE_AND_EXPLANATION),
            _none(_has(r"`print`", "explanation")),
        ),
        (
            "Move the logging call out of the compiled step, or add it to "
            "torch._dynamo.config.ignore_logging_functions (e.g. .add(logger.info), .add(warnings.warn)): "
            "Dynamo then drops the call inside compiled code."
        ),
    ),
    (
        "print",
        _has(r"`print`|builtin print|\bprint\b", *_TYPE_AND_EXPLANATION),
        (
            "Move print() out of the compiled step, or run "
            "torch._dynamo.config.reorderable_logging_functions.add(print) so that Dynamo prints after "
            "the graph instead of breaking it."
        ),
    ),
    (
        "control_flow",
        _has(
            r"Data-dependent branching|generic_jump|dynamic control flow|data-dependent",
            *_TYPE_AND_EXPLANATION,
        ),
        (
            "Replace the Python `if` on a tensor's value: torch.where(cond, a, b) (or apply the transform "
            "unconditionally), or torch.cond(pred, true_fn, false_fn, operands) for two real branches."
        ),
    ),
    (
        "numpy",
        _has(r"numpy|torch\._numpy", *_TYPE_AND_EXPLANATION),
        (
            "A NumPy call Dynamo cannot trace: use the equivalent torch operation on tensors (Dynamo traces "
            "torch ops into the graph), or do the NumPy work outside the compiled step."
        ),
    ),
    (
        "disabled",
        _has(
            r"torch\.compiler\.disable|compiler\.disable\(\)|disable\(\)`?d function", *_TYPE_AND_EXPLANATION
        ),
        (
            "The called function is excluded with torch.compiler.disable: remove the decorator if the "
            "function is traceable, or call it outside the compiled step."
        ),
    ),
    (
        "zero_grad",
        _has(r"Optimizer\.zero_grad", "explanation"),
        (
            "Call opt.zero_grad() outside the compiled function: Dynamo never traces it (torch marks it as "
            "skipped), so it runs eagerly wherever it is called."
        ),
    ),
    (
        "unsupported_call",
        _has(
            r"marked as skipped|builtin|third-party|C/C\+\+|Unsupported function|unsupported",
            *_TYPE_AND_EXPLANATION,
        ),
        (
            "Call it outside the compiled step: Dynamo does not trace this call (a builtin, a C extension or "
            "a skipped library). A function of tensors can enter the graph as one opaque op when wrapped as "
            "a custom op (torch.library.custom_op)."
        ),
    ),
]

TORCH_HINT_PREFIX = "torch's hint (not checked by nbtoolkit): "


def classify_break(gb_type: str, explanation: str = "", **facts: str) -> str:
    """The category of a break (``scalar``, ``print``, ``optimizer``, ``backward`` ...), else ``other``.

    ``facts``: the other fields of :class:`BreakFacts` (``reason``, ``user_file``,
    ``source_line``, ``inside_torch``), where known.
    """
    found = BreakFacts(gb_type or "", explanation or "", **{k: v or "" for k, v in facts.items()})
    for category, test, _ in FIX_HINTS:
        if test(found):
            return category
    return "other"


def fix_hint(gb_type: str, explanation: str = "", torch_hints: str = "", **facts: str) -> str:
    """A short hint of what to change for this break, or torch's own first hint (marked as such)."""
    found = BreakFacts(gb_type or "", explanation or "", **{k: v or "" for k, v in facts.items()})
    for _, test, hint in FIX_HINTS:
        if test(found):
            return hint
    first = next((h.strip() for h in (torch_hints or "").splitlines() if h.strip()), "")
    if first:
        return TORCH_HINT_PREFIX + first
    return "See the break's registry page for what Dynamo supports here."
