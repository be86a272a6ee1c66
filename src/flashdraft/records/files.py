"""Rows out of record files: one rule per suffix, one way to name a bad row.

* ``.jsonl`` / ``.ndjson``: JSON Lines, one object per line (blank lines skipped), UTF-8;
* ``.json``: one JSON document, a list of records or an object holding one record;
* ``.parquet`` / ``.pq``: read through pyarrow in batches;
* a folder written by ``datasets.save_to_disk``: ``datasets.load_from_disk`` (of a ``DatasetDict`` the
  ``train`` split if there is one, else every split in order);
* a ``flashdraft generate`` output folder: its ``part-*.parquet`` files (not the manifest or errors);
* any other folder: the record files inside it (recursively, sorted by path).

Every row comes with a :class:`Where` (file and 1-based line, or 0-based row) and every problem is a
:class:`RecordError` that names the file, the line or row, the reason and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashdraft.errors import FlashdraftError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet", ".pq")
DATA_SUFFIXES = JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES
DATASET_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")
FORMATS = ".jsonl (JSON Lines), .json (one JSON document), .parquet, or a datasets.save_to_disk folder"


@dataclass(frozen=True)
class Where:
    """A row's place: ``line`` (1-based) in a JSON Lines file, else ``row`` (0-based) in its file or dataset."""

    path: Path
    line: int | None = None
    row: int | None = None

    def __str__(self) -> str:
        if self.line is not None:
            return f"{self.path}:{self.line}"
        return f"{self.path} row {self.row}" if self.row is not None else str(self.path)

    @property
    def key(self) -> str:
        """Short id of the place inside its file: ``line7`` or ``row3``."""
        return f"line{self.line}" if self.line is not None else f"row{self.row}"


class RecordError(FlashdraftError, ValueError):
    """A record file or row that cannot be read: ``<where> <reason>; <fix>``."""

    def __init__(self, message: str, where: Where | str | None = None, reason: str = "", fix: str = ""):
        super().__init__(message)
        self.where, self.reason, self.fix = where, reason, fix

    @classmethod
    def row(cls, where: Where | str | None, reason: str, fix: str = "") -> "RecordError":
        """A bad row: the message is ``<where> <reason>; <fix>`` (``reason`` starts with a verb: "is", "has")."""
        text = f"{where if where is not None else 'record'} {reason}" + (f"; {fix}" if fix else "")
        return cls(text, where, reason, fix)


def data_files(path: str | Path) -> list[Path]:
    """The record files behind ``path`` (a datasets folder counts as one); errors say what to pass instead."""
    p = Path(path)
    if not p.exists():
        raise RecordError(f"data path {p} does not exist; pass a {FORMATS}, or a folder of record files")
    if p.is_file():
        if not p.name.endswith(DATA_SUFFIXES):
            raise RecordError(f"cannot read {p}: unknown file type {p.suffix!r}; use {FORMATS}")
        return [p]
    if any((p / m).exists() for m in DATASET_MARKERS):
        return [p]
    parts = sorted(p.glob("part-*.parquet"))
    if parts:  # a `flashdraft generate` output folder
        return parts
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(DATA_SUFFIXES))
    if not files:
        raise RecordError(f"folder {p} holds no .jsonl, .json or .parquet files and is not a saved datasets folder; "
                          "pass record files or a folder written by datasets.save_to_disk")
    return files


def iter_rows(path: str | Path, keep_bad: bool = False,
              batch_size: int = 4096) -> Iterator[tuple[Where, dict[str, Any] | RecordError]]:
    """``(where, row)`` for every row behind ``path``, streaming. A row that is not a JSON object (or a line
    that is not JSON) raises its :class:`RecordError`, or is yielded in place of the row if ``keep_bad``."""
    for f in data_files(path):
        if f.is_dir():
            rows = _dataset_rows(f, batch_size)
        elif f.name.endswith(PARQUET_SUFFIXES):
            rows = _parquet_rows(f, batch_size)
        elif f.name.endswith(JSON_SUFFIXES):
            rows = _json_rows(f)
        else:
            rows = _jsonl_rows(f)
        for where, row in rows:
            if isinstance(row, RecordError) and not keep_bad:
                raise row
            yield where, row


def _object(where: Where, row: Any, fix: str) -> dict[str, Any] | RecordError:
    if isinstance(row, dict):
        return row
    return RecordError.row(where, f"holds a {type(row).__name__}, not a JSON object", fix)


def _jsonl_rows(path: Path) -> Iterator[tuple[Where, dict[str, Any] | RecordError]]:
    fix = "each line must be one record object (JSON Lines)"
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise RecordError(f"cannot open {path}: {e.strerror}; check the path and its permissions") from None
    with fh:
        for n, raw in enumerate(fh, 1):
            where = Where(path, line=n)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield where, RecordError.row(where, "is not UTF-8 text", "re-encode the file as UTF-8 JSON Lines")
                continue
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                yield where, RecordError.row(where, f"is not valid JSON ({e.msg})",
                                             "the file must hold one JSON object per line (JSON Lines)")
                continue
            yield where, _object(where, row, fix)


def _json_rows(path: Path) -> Iterator[tuple[Where, dict[str, Any] | RecordError]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RecordError(f"{path} is not one JSON document ({e.msg} at line {e.lineno}); a .json file holds a list "
                          "of records or one record object; name a file of one record per line .jsonl") from None
    except UnicodeDecodeError:
        raise RecordError(f"{path} is not UTF-8 text; re-encode it as UTF-8 JSON") from None
    for n, row in enumerate(data if isinstance(data, list) else [data]):
        where = Where(path, row=n)
        yield where, _object(where, row, "a .json file holds a list of record objects or one record object")


def _parquet_rows(path: Path, batch_size: int) -> Iterator[tuple[Where, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise RecordError(f"cannot read {path} as Parquet ({e}); check that the file is complete") from None
    n = 0
    for batch in pf.iter_batches(batch_size=batch_size):
        for row in batch.to_pylist():
            yield Where(path, row=n), row
            n += 1


def _dataset_rows(path: Path, batch_size: int) -> Iterator[tuple[Where, dict[str, Any]]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise RecordError(f"cannot load {path} with datasets.load_from_disk ({e}); pass the folder that "
                          "save_to_disk wrote") from None
    if isinstance(ds, datasets.DatasetDict):
        splits = [ds["train"]] if "train" in ds else list(ds.values())
    else:
        splits = [ds]
    n = 0
    for split in splits:
        for batch in split.iter(batch_size=batch_size):  # columns -> rows
            keys = list(batch)
            for i in range(len(batch[keys[0]]) if keys else 0):
                yield Where(path, row=n), {k: batch[k][i] for k in keys}
                n += 1
