"""Records: the one reader of chat and prompt data for every stage (generate, mix, train, bench, eval).

:mod:`flashdraft.records.files` turns paths into rows (one rule per suffix, :class:`RecordError` naming
the file and line of a bad row); :mod:`flashdraft.records.layouts` turns a row of any supported layout
into a :class:`Sample` of OpenAI-style messages. Stages keep their own policy on top (generate refuses
tool turns it cannot replay, mix renders text for its signals, train tokenises).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from flashdraft.records.files import DATA_SUFFIXES, FORMATS, RecordError, Where, data_files, iter_rows
from flashdraft.records.layouts import (
    CHAT_LAYOUTS, ID_KEYS, LAYOUTS, PROMPT_LAYOUTS, ROLE_ALIASES, Sample, content_hash, detect_layout, parse_row, row_id,
    unknown_layout,
)

__all__ = [
    "CHAT_LAYOUTS", "DATA_SUFFIXES", "FORMATS", "ID_KEYS", "LAYOUTS", "PROMPT_LAYOUTS", "ROLE_ALIASES", "RecordError",
    "Sample", "Where", "content_hash", "data_files", "detect_layout", "iter_rows", "parse_row", "prompt_text",
    "prompt_turns", "read_prompt_rows", "read_prompts", "read_samples", "row_id", "unknown_layout",
]


def read_samples(path: str | Path, layouts: tuple[str, ...] = LAYOUTS) -> Iterator[tuple[Where, Sample]]:
    """``(where, sample)`` for every row behind ``path``; ``sample.source`` is the file (or folder) stem and
    ``sample.id`` the row's own id (``ID_KEYS``) or its place in the file. Bad rows raise :class:`RecordError`."""
    for where, row in iter_rows(path):
        s = parse_row(row, where, layouts)
        s.source = where.path.stem if where.path.is_file() else where.path.name
        s.id = row_id(row) or where.key
        yield where, s


def prompt_turns(sample: Sample) -> list[dict]:
    """The turns before the first assistant turn: what a prompt set asks."""
    return list(itertools.takewhile(lambda m: m["role"] != "assistant", sample.messages))


def prompt_text(sample: Sample) -> str:
    """The text a plain-continuation prompt set uses: the turns before the first assistant turn (blank-line joined)."""
    return "\n\n".join(m["content"] for m in prompt_turns(sample))


def read_prompt_rows(path: str | Path, limit: int | None = None) -> Iterator[tuple[Where, Sample | list[int]]]:
    """Prompt rows of a file, at most ``limit``: a row's ``prompt_ids`` (token ids) if it has them, else the row
    as a :class:`Sample` (its prompt: :func:`prompt_turns`, :func:`prompt_text`)."""
    for n, (where, row) in enumerate(iter_rows(path)):
        if limit is not None and n >= limit:
            return
        if "prompt_ids" in row:
            yield where, [int(t) for t in row["prompt_ids"]]
        else:
            yield where, parse_row(row, where, PROMPT_LAYOUTS)


def read_prompts(path: str | Path, limit: int | None = None) -> Iterator[tuple[Where, str | list[int]]]:
    """Prompts of a file, at most ``limit``: a row's ``prompt_ids`` (token ids) if it has them, else the
    text of its turns before the first answer (:func:`prompt_text`)."""
    for where, x in read_prompt_rows(path, limit):
        yield where, x if isinstance(x, list) else prompt_text(x)
