"""The one error base: every error flashdraft raises on purpose derives from :class:`FlashdraftError`.

Each stage keeps its own class (``TrainError``, ``MixError``, ...) with its usual second base
(``ValueError``, ``RuntimeError``) so that ``except ValueError`` still catches it; a command line
verb turns any of them into ``error: <message>`` on stderr and exit status 2 (:func:`exit_on_error`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class FlashdraftError(Exception):
    """A failure the user can fix: the message names the thing that is wrong and what to do about it."""


@contextmanager
def exit_on_error() -> Iterator[None]:
    """Command bodies run inside this: a :class:`FlashdraftError` prints ``error: ...`` and exits with status 2."""
    try:
        yield
    except FlashdraftError as e:
        import typer

        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
