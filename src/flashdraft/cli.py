"""The ``flashdraft`` command line: one verb per pipeline stage.

Every verb runs under one handler: a :class:`~flashdraft.errors.FlashdraftError` (any stage's error
class) prints ``error: <message>`` and exits with status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import typer

from flashdraft.errors import exit_on_error

app = typer.Typer(
    help="flashdraft: lossless speculative decoding (generate -> mix -> train -> decode/bench -> export).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """flashdraft: lossless speculative decoding (generate -> mix -> train -> decode/bench -> export)."""


def guarded(command: Callable) -> Callable:
    """``command`` with the exit-2 handler around it (typer reads the wrapped signature)."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        with exit_on_error():
            return command(*args, **kwargs)

    return run


def _register() -> None:
    from flashdraft.bench.cli import app as bench_app
    from flashdraft.decode.cli import decode
    from flashdraft.demo.cli import demo
    from flashdraft.export.cli import export, import_, serve_cmd
    from flashdraft.generate.cli import generate
    from flashdraft.mix.cli import app as mix_app
    from flashdraft.train.cli import train
    from flashdraft.train.features_cli import features

    for sub in (mix_app, bench_app):
        for info in sub.registered_commands:
            info.callback = guarded(info.callback)
    app.command(name="generate")(guarded(generate))
    app.add_typer(mix_app, name="mix")
    app.command(name="features", help="Train stage: cache the target's features for offline training (see train --features).")(guarded(features))
    app.command(name="train")(guarded(train))
    app.command(name="decode")(guarded(decode))
    app.command(name="run", help="Alias of decode.")(guarded(decode))
    app.add_typer(bench_app, name="bench")
    app.command(name="export")(guarded(export))
    app.command(name="import")(guarded(import_))
    app.command(name="serve-cmd")(guarded(serve_cmd))
    app.command(name="demo")(guarded(demo))


_register()

if __name__ == "__main__":
    app()
