"""The ``flashdraft`` command line: one verb per pipeline stage."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="flashdraft: lossless speculative decoding (generate -> mix -> train -> decode/bench -> export).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """flashdraft: lossless speculative decoding (generate -> mix -> train -> decode/bench -> export)."""


def _register() -> None:
    from flashdraft.bench.cli import app as bench_app
    from flashdraft.decode.cli import decode
    from flashdraft.generate.cli import generate
    from flashdraft.mix.cli import app as mix_app
    from flashdraft.train.cli import train
    from flashdraft.train.features_cli import features

    app.command(name="generate")(generate)
    app.add_typer(mix_app, name="mix")
    app.command(name="features", help="Train stage: cache the target's features for offline training (see train --features).")(features)
    app.command(name="train")(train)
    app.command(name="decode")(decode)
    app.command(name="run", help="Alias of decode.")(decode)
    app.add_typer(bench_app, name="bench")

    from flashdraft.export.cli import export, import_, serve_cmd

    app.command(name="export")(export)
    app.command(name="import")(import_)
    app.command(name="serve-cmd")(serve_cmd)


_register()

if __name__ == "__main__":
    app()
