"""The ``%nbt`` / ``%%nbt`` dispatcher: split the line, find the subcommand, parse, call, store.

It holds no feature logic. Each feature's ``magic`` module registers its subcommands with
:func:`nbtoolkit.core.magic_registry.register` when imported; :func:`load_subcommands` imports them,
by name, here: this module sits at the top of the house, beside the package's ``__init__``.
A new feature's magic module is one more line in it.
"""

from __future__ import annotations

import shlex
from typing import Any

from nbtoolkit.core.magic_registry import MagicCall, Subcommand, all_subcommands, get_subcommand

__all__ = ["dispatch", "help_text", "load_subcommands", "register_magics", "unregister_magics"]

_loaded = False


def load_subcommands() -> None:
    """Import each feature's magic module once, which registers its subcommands (light: no torch)."""
    global _loaded
    if _loaded:
        return
    import nbtoolkit.capacity.magic
    import nbtoolkit.cluster.magic
    import nbtoolkit.compile.magic
    import nbtoolkit.memory.magic
    import nbtoolkit.metrics.magic
    import nbtoolkit.recompute.magic
    import nbtoolkit.reporting.magic
    import nbtoolkit.trace.magic  # noqa: F401  (each import registers its subcommands)

    _loaded = True


def help_text(name: str | None = None) -> str:
    """``%nbt help``: every subcommand with its one-line summary; ``%nbt help SUB``: its usage."""
    load_subcommands()
    if name:
        sub = get_subcommand(name)
        if sub is None:
            raise _usage_error(f"unknown subcommand {name!r}")
        return sub.build_parser().format_help().rstrip()
    rows = [("help [SUB]", "%nbt", "list subcommands, or show one subcommand's usage")]
    rows += [(s.name, s.prefix, s.summary) for s in all_subcommands()]
    width = max(len(r[0]) for r in rows)
    pwidth = max(len(r[1]) for r in rows)
    lines = ["nbtoolkit magics (%nbt for a line, %%nbt for a cell):", ""]
    lines += [f"  {p:<{pwidth}}  {n:<{width}}  {s}" for n, p, s in rows]
    lines += ["", "`%nbt help SUB` shows the arguments of one subcommand."]
    return "\n".join(lines)


class _HelpText(str):
    """Help shown as plain text (a str subclass whose repr is itself, not quoted)."""

    def __repr__(self) -> str:
        return str(self)


def _usage_error(message: str) -> Exception:
    from IPython.core.error import UsageError

    return UsageError(f"{message}\nusage: %nbt SUBCOMMAND [ARGS]   (see `%nbt help`)")


def dispatch(shell: Any, line: str, cell: str | None = None) -> Any:
    """Run one ``%nbt`` line (``cell`` is None) or ``%%nbt`` cell."""
    load_subcommands()
    try:
        words = shlex.split(line, posix=True)
    except ValueError as exc:  # an unclosed quote
        raise _usage_error(f"cannot split the line: {exc}") from None
    if not words or words[0] in {"help", "-h", "--help"}:
        if cell is not None and cell.strip():
            raise _usage_error("`%%nbt help` takes no cell body")
        return _HelpText(help_text(words[1] if len(words) > 1 else None))
    sub = get_subcommand(words[0])
    if sub is None:
        raise _usage_error(f"unknown subcommand {words[0]!r}")
    _check_mode(sub, cell)
    args = sub.build_parser().parse_args(words[1:])
    result = sub.handler(args, MagicCall(shell=shell, line=line, cell=cell))
    if result is not None and sub.store_result:
        shell.user_ns[args.name] = result
    return result


def _check_mode(sub: Subcommand, cell: str | None) -> None:
    if sub.mode == "line" and cell is not None:
        raise _usage_error(
            f"`{sub.name}` is a line magic: use `%nbt {sub.name} ...`, not `%%nbt`\n{sub.usage()}"
        )
    if sub.mode == "cell" and cell is None:
        raise _usage_error(
            f"`{sub.name}` runs a cell: use `%%nbt {sub.name}` at the top of the cell\n{sub.usage()}"
        )


def _make_magics_class() -> type:
    from IPython.core.magic import Magics, line_cell_magic, magics_class

    @magics_class
    class NbtMagics(Magics):
        """The ``%nbt`` / ``%%nbt`` magic; run ``%nbt help``."""

        @line_cell_magic
        def nbt(self, line: str, cell: str | None = None) -> Any:
            return dispatch(self.shell, line, cell)

    return NbtMagics


def register_magics(ipython: Any) -> None:
    ipython.register_magics(_make_magics_class())


def unregister_magics(ipython: Any) -> None:
    manager = ipython.magics_manager
    for kind in ("line", "cell"):
        manager.magics[kind].pop("nbt", None)
