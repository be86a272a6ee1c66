"""The one error base: every error flashdraft raises on purpose derives from :class:`FlashdraftError`.

Each stage keeps its own class (``TrainError``, ``MixError``, ...) with its usual second base
(``ValueError``, ``RuntimeError``) so that ``except ValueError`` still catches it; a command line
verb turns any of them into ``error: <message>`` on stderr and exit status 2 (:func:`exit_on_error`).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager


class FlashdraftError(Exception):
    """A failure the user can fix: the message names the thing that is wrong and what to do about it."""


def os_error_message(e: OSError) -> str | None:
    """One line for an operating-system failure the user fixes outside flashdraft (a full disk, a file where a
    folder belongs, no permission), naming the path and the fix; None for any other OSError (a bug keeps its
    traceback)."""
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"no space left on the device{where}; free space or write to another folder, then run the command "
                "again (finished files are complete; generate and train continue with --resume)")
    if e.errno in (errno.EEXIST, errno.ENOTDIR):
        return f"a file stands where a folder is needed{where}; pass a folder path, or move that file away"
    if e.errno == errno.EISDIR:
        return f"a folder stands where a file is needed{where}; pass a file path"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write{where}: {e.strerror}; choose a path you can write to"
    return None


@contextmanager
def exit_on_error() -> Iterator[None]:
    """Command bodies run inside this: a :class:`FlashdraftError` (or an OSError of :func:`os_error_message`'s
    kinds) prints ``error: ...`` and exits with status 2."""
    try:
        yield
    except FlashdraftError as e:
        fail(e)
    except OSError as e:
        message = os_error_message(e)
        if message is None:
            raise
        fail(message)


def fail(e: Exception) -> None:
    """Print ``error: <e>`` on one line (no wrapping) and exit with status 2."""
    import typer

    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2) from None


def warn(message: str) -> None:
    """Say on stderr, in one line, that a setting was ignored or overridden (the command goes on)."""
    import sys

    print(f"warning: {message}", file=sys.stderr, flush=True)
