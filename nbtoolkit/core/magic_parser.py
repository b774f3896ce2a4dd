"""argparse that reports errors as IPython UsageErrors instead of exiting the kernel."""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["MagicArgumentParser"]


class MagicArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise ``UsageError(usage + message)``.

    argparse's default calls ``sys.exit``, which in a kernel would print a
    SystemExit traceback. IPython shows a UsageError as one short message.
    """

    def error(self, message: str) -> NoReturn:
        from IPython.core.error import UsageError

        raise UsageError(f"{message}\n{self.format_usage().strip()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        from IPython.core.error import UsageError

        raise UsageError(message or self.format_usage().strip())
