"""Every exception class defined in the package derives from FlashdraftError (the CLI's exit-2 handler)."""

import importlib
import inspect
import pkgutil

import pytest
import typer
from typer.testing import CliRunner

import flashdraft
from flashdraft.errors import FlashdraftError, exit_on_error


def _modules():
    for info in pkgutil.walk_packages(flashdraft.__path__, "flashdraft."):
        yield importlib.import_module(info.name)


def test_every_error_class_derives_from_flashdraft_error():
    found = {}
    for mod in _modules():
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.__name__:
                found[f"{mod.__name__}.{name}"] = obj
    assert len(found) >= 15, sorted(found)  # the walk reached the stages' error classes
    stray = sorted(k for k, cls in found.items() if cls is not FlashdraftError and not issubclass(cls, FlashdraftError))
    assert not stray, f"error classes outside the FlashdraftError tree: {stray}"


def test_second_bases_are_kept():
    from flashdraft.generate.output import OutputError
    from flashdraft.mix.domains import MixError
    from flashdraft.train.objective import TrainError

    assert issubclass(MixError, ValueError) and issubclass(TrainError, ValueError)
    assert issubclass(OutputError, RuntimeError)


@pytest.mark.parametrize("exc", [FlashdraftError("bad thing; do this"), ValueError("bug")])
def test_exit_on_error_turns_flashdraft_errors_into_status_2(exc):
    app = typer.Typer()

    @app.command()
    def cmd() -> None:
        with exit_on_error():
            raise exc

    r = CliRunner().invoke(app, [])
    if isinstance(exc, FlashdraftError):
        assert r.exit_code == 2 and "error: bad thing; do this" in r.output
    else:  # a bug is not dressed up as a user error
        assert r.exit_code == 1 and isinstance(r.exception, ValueError)


def test_the_flashdraft_command_exits_2_on_any_stage_error(tmp_path, monkeypatch):
    """The handler in flashdraft.cli covers errors a verb does not catch itself (here: run, which lists its own)."""
    from flashdraft.cli import app
    from flashdraft.decode.config import DecodeConfig
    from flashdraft.records import RecordError

    def failing(*args, **kwargs):
        raise RecordError(f"{tmp_path}/d.jsonl:3 is not valid JSON; the file must hold one JSON object per line")

    monkeypatch.setattr(DecodeConfig, "load", failing)
    r = CliRunner().invoke(app, ["run", "hello"])
    assert r.exit_code == 2 and "d.jsonl:3 is not valid JSON" in r.output
