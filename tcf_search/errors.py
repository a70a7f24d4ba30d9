"""How a command reports bad input: one line on stderr naming the field and the rule, exit 2,
never a traceback. Every project error derives from :class:`costmodel.errors.TcfError`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from costmodel.errors import TcfError

__all__ = ["TcfError", "one_line", "user_errors"]


def one_line(exc: BaseException) -> str:
    """The message's first line (the class name when it has none)."""
    text = str(exc)
    return text.splitlines()[0] if text.strip() else type(exc).__name__


@contextmanager
def user_errors() -> Iterator[None]:
    """Bad input (a :class:`TcfError`) becomes ``error: <one line>`` on stderr and exit 2."""
    try:
        yield
    except TcfError as exc:
        typer.echo(f"error: {one_line(exc)}", err=True)
        raise typer.Exit(2) from None
