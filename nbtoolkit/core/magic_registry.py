"""Subcommand registry of ``%nbt``: how a feature plugs into the magic without touching the dispatcher.

A subcommand module does::

    from nbtoolkit.core.magic_registry import Argument, MagicCall, Subcommand, register

    def _overlap(args, call: MagicCall):
        from nbtoolkit.trace.overlap import comm_comp_overlap   # heavy import inside
        return comm_comp_overlap(call.resolve(args.traces))

    register(Subcommand(
        name="overlap",
        summary="comm/compute overlap per rank of saved traces or a Trace variable",
        mode="line",
        arguments=(Argument("traces", help="a trace file, a folder of per-rank traces, or a variable"),),
        handler=_overlap,
    ))

The handler's return value is stored in the user namespace under ``--name``
(default ``_nbt``; every subcommand gets ``--name``) and displayed, unless it is None.
A handler calls one public function and returns its result: the magic shows exactly what
a script calling that function gets. An option's default is the API's own, read from the
function's signature with :class:`APIDefault` (never a second copy of the number).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import linecache
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "APIDefault",
    "Argument",
    "MagicCall",
    "Subcommand",
    "all_subcommands",
    "get_subcommand",
    "register",
]

Mode = Literal["line", "cell", "both"]

CELL_FILENAME = "<nbt-cell>"  # the file name a cell's code is compiled under (and known to linecache)


@dataclass(frozen=True)
class APIDefault:
    """An option's default taken from a public function's signature when the parser is built.

    ``APIDefault("nbtoolkit.trace.profile", "profile", "steps")`` is ``profile``'s default
    for ``steps``. Resolved lazily (on ``%nbt help SUB`` or a call), so ``%load_ext`` imports
    nothing of the API. Write ``(default %(default)s)`` in the help to show it.
    """

    module: str
    function: str  # a function, or "Class.method"
    parameter: str

    def resolve(self) -> Any:
        target: Any = importlib.import_module(self.module)
        for part in self.function.split("."):
            target = getattr(target, part)
        return inspect.signature(target).parameters[self.parameter].default


@dataclass(frozen=True)
class Argument:
    """One ``argparse.add_argument`` call: positional flags plus keyword options."""

    flags: tuple[str, ...]
    options: dict[str, Any]

    def __init__(self, *flags: str, **options: Any) -> None:
        object.__setattr__(self, "flags", flags)
        object.__setattr__(self, "options", options)


@dataclass
class MagicCall:
    """What a handler gets besides its parsed arguments: the shell, the cell, helpers."""

    shell: Any
    line: str
    cell: str | None

    @property
    def user_ns(self) -> dict[str, Any]:
        ns: dict[str, Any] = self.shell.user_ns
        return ns

    def resolve(self, name_or_path: str) -> Any:
        """A user variable of that name if there is one, else the string as a Path.

        ``~`` is left for the API function to expand: it checks the path (``model.paths.user_path``)
        and says what is wrong with it in one error.
        """
        if name_or_path.isidentifier() and name_or_path in self.user_ns:
            return self.user_ns[name_or_path]
        return Path(name_or_path)

    def lookup(self, name: str | None, what: str = "variable") -> Any:
        """A user variable that must exist; a clear usage error when it does not. None for no name."""
        from nbtoolkit.core.errors import NbtUsageError

        if name is None:  # an optional argument left out
            return None
        if name not in self.user_ns:
            raise NbtUsageError(f"no {what} named {name!r} in the notebook: define it first")
        return self.user_ns[name]

    def cell_function(self) -> Callable[[], Any]:
        """A zero-argument callable that runs the cell body in the user namespace.

        It returns the value of the last expression (like a cell does), so that
        ``%%nbt profile`` can show both the profile and what the cell computed.
        IPython syntax in the cell (``!cmd``, ``%magic``) is transformed first. The cell's
        lines are made known to ``linecache``, so tracebacks and graph breaks in it show source.
        """
        source = self.shell.transform_cell(self.cell or "")
        linecache.cache[CELL_FILENAME] = (len(source), None, source.splitlines(True), CELL_FILENAME)
        tree = ast.parse(source, filename=CELL_FILENAME)
        last_expr = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last_expr = ast.Expression(tree.body.pop().value)
        body = compile(tree, CELL_FILENAME, "exec")
        tail = compile(last_expr, CELL_FILENAME, "eval") if last_expr is not None else None
        user_ns = self.user_ns
        shell = self.shell
        lines = linecache.cache[CELL_FILENAME]

        def run_cell() -> Any:
            try:
                exec(body, user_ns)  # noqa: S102 - running the user's own cell is the point
                return eval(tail, user_ns) if tail is not None else None  # noqa: S307 - same
            except BaseException as exc:
                show_user_frames_only(exc, shell, lines)
                raise

        return run_cell


def show_user_frames_only(exc: BaseException, shell: Any, lines: tuple[Any, ...]) -> None:
    """Make IPython show ``exc`` (raised in a magic's cell) as it would in a plain cell.

    Between the ``%%nbt`` line and the user's code lie IPython's magic machinery and
    nbtoolkit's instruments (profiler, memory recorder): a plain cell shows none of them, and
    remote cells already leave them out (``nbtoolkit.cluster.rank_actor``). IPython asks an
    exception for ``_render_traceback_`` before formatting it; this sets one on the exception
    object that formats its traceback from the cell's own frame on, with IPython's formatter
    (colours, context lines), after putting the cell's lines back into ``linecache`` (a later
    ``%%nbt`` cell reuses the file name). The exception itself is unchanged: same type, same
    full ``__traceback__`` (``%debug`` still walks every frame). nbtoolkit's own errors keep
    their one-line display; an exception without a ``__dict__`` keeps the full traceback.
    """
    from nbtoolkit.core.errors import NbtError

    if isinstance(exc, NbtError) or shell is None or not hasattr(shell, "InteractiveTB"):
        return
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL_FILENAME:
        tb = tb.tb_next
    if tb is None:  # not raised from the cell's code (e.g. a KeyboardInterrupt in the instrument)
        return
    cell_tb = tb

    def render() -> list[str]:
        linecache.cache[CELL_FILENAME] = lines
        shown: list[str] = shell.InteractiveTB.structured_traceback(type(exc), exc, cell_tb)
        return shown

    # An exception type without instance attributes keeps IPython's full traceback.
    with contextlib.suppress(AttributeError, TypeError):
        exc._render_traceback_ = render  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Subcommand:
    """A ``%nbt`` subcommand: its name, one-line summary, arguments and handler."""

    name: str
    summary: str
    handler: Callable[[argparse.Namespace, MagicCall], Any]
    mode: Mode = "line"
    arguments: Sequence[Argument] = field(default_factory=tuple)
    description: str = ""
    store_result: bool = True

    @property
    def prefix(self) -> str:
        return {"line": "%nbt", "cell": "%%nbt", "both": "%nbt / %%nbt"}[self.mode]

    def build_parser(self) -> argparse.ArgumentParser:
        from nbtoolkit.core.magic_parser import MagicArgumentParser

        parser = MagicArgumentParser(
            prog=f"{self.prefix.split(' ')[0]} {self.name}",
            description=self.description or self.summary,
            add_help=False,
        )
        for argument in self.arguments:
            options = {
                key: value.resolve() if isinstance(value, APIDefault) else value
                for key, value in argument.options.items()
            }
            parser.add_argument(*argument.flags, **options)
        if self.store_result:
            parser.add_argument(
                "--name",
                default="_nbt",
                type=result_variable_name,
                help="store the result in this notebook variable (default: _nbt)",
            )
        return parser

    def usage(self) -> str:
        return self.build_parser().format_usage().strip()


#: names IPython keeps in the user namespace itself (output history, input history, the shell)
IPYTHON_NAMES = frozenset(
    {"_", "__", "___", "_i", "_ii", "_iii", "_ih", "_oh", "_dh", "In", "Out", "exit", "quit", "get_ipython",
     "_exit_code", "_sh"}
)
_IPYTHON_NUMBERED = re.compile(r"_i?\d+")  # _3 (output of cell 3), _i3 (its input)


def result_variable_name(text: str) -> str:
    """``--name``: a plain identifier that is neither a keyword, a builtin, a dunder nor IPython's own.

    The result is assigned into the user's namespace: ``--name __builtins__`` or ``--name print``
    would replace what every later cell relies on, and ``--name _oh`` (or ``Out``, ``_``, ``_i3``)
    what IPython's display of every later cell does, so such names are refused (argparse turns
    the ArgumentTypeError into the usage error of the subcommand).
    """
    import builtins
    import keyword

    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a Python variable name (letters, digits, _)")
    if text in IPYTHON_NAMES or _IPYTHON_NUMBERED.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a name IPython keeps its input and output history (or the shell) in: storing the "
            "result there would break the display of later cells; pick another name"
        )
    if text.startswith("__") and text.endswith("__"):
        raise argparse.ArgumentTypeError(f"{text!r} is a dunder name, which Python itself uses; pick another")
    if hasattr(builtins, text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a Python builtin: storing the result there would hide it in every later cell; "
            "pick another name"
        )
    return text


_SUBCOMMANDS: dict[str, Subcommand] = {}


def register(subcommand: Subcommand) -> Subcommand:
    """Add a subcommand. Registering a name twice replaces the first (handy when reloading)."""
    _SUBCOMMANDS[subcommand.name] = subcommand
    return subcommand


def get_subcommand(name: str) -> Subcommand | None:
    return _SUBCOMMANDS.get(name)


def all_subcommands() -> list[Subcommand]:
    return [_SUBCOMMANDS[name] for name in sorted(_SUBCOMMANDS)]
