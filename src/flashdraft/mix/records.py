"""Stream samples from JSONL, Parquet and saved HF datasets, normalising common chat layouts.

Every reader yields *batches* of raw rows (dicts), so that millions of samples pass through in
bounded memory. :func:`to_sample` turns one raw row of any supported layout into a :class:`Sample`
(source, id, prompt text, response text, token count if known).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashdraft.mix.domains import MixError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant",
                "function_call": "assistant", "observation": "tool", "function_response": "tool",
                "ipython": "tool", "function": "tool"}


@dataclass(slots=True)
class Sample:
    """One normalised sample: ``prompt`` is every turn before the answer, ``response`` the answer."""

    source: str
    id: str
    prompt: str
    response: str
    n_tokens: int | None = None
    n_response_tokens: int | None = None


def data_files(path: str | Path) -> list[Path]:
    """The data files behind ``path``: itself, or the JSONL/Parquet files inside a folder (sorted)."""
    p = Path(path)
    if not p.exists():
        raise MixError(f"data path {p} does not exist; pass a .jsonl/.parquet file, a folder of them, "
                       "or a folder written by datasets.save_to_disk")
    if p.is_file():
        if not p.name.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES):
            raise MixError(f"cannot read {p}: unknown file type {p.suffix!r}; use .jsonl or .parquet")
        return [p]
    if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists() or (p / "state.json").exists():
        return [p]
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(JSONL_SUFFIXES + PARQUET_SUFFIXES))
    if not files:
        raise MixError(f"folder {p} holds no .jsonl or .parquet files and is not a saved HF dataset")
    return files


def iter_rows(path: str | Path, batch_size: int = 4096) -> Iterator[list[dict[str, Any]]]:
    """Yield batches of raw rows (dicts) from every file behind ``path``, streaming."""
    for f in data_files(path):
        if f.is_dir():
            yield from _iter_hf(f, batch_size)
        elif f.name.endswith(PARQUET_SUFFIXES):
            yield from _iter_parquet(f, batch_size)
        else:
            yield from _iter_jsonl(f, batch_size)


def _iter_jsonl(path: Path, batch_size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise MixError(f"cannot open {path}: {e.strerror}; check the path and its permissions") from None
    with fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise MixError(f"{path}:{lineno} is not UTF-8 text; re-encode the file as UTF-8 JSON Lines") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise MixError(f"{path}:{lineno} is not valid JSON ({e.msg}); the file must hold one JSON "
                               "object per line (JSON Lines)") from None
            if not isinstance(row, dict):
                raise MixError(f"{path}:{lineno} holds a {type(row).__name__}, not a JSON object; "
                               "each line must be one sample object")
            batch.append(row)
            if len(batch) >= batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def _iter_parquet(path: Path, batch_size: int) -> Iterator[list[dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise MixError(f"cannot read {path} as Parquet ({e}); check that the file is complete") from None
    for rb in pf.iter_batches(batch_size=batch_size):
        yield rb.to_pylist()


def _iter_hf(path: Path, batch_size: int) -> Iterator[list[dict[str, Any]]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise MixError(f"cannot load {path} with datasets.load_from_disk ({e})") from None
    splits = list(ds.values()) if isinstance(ds, datasets.DatasetDict) else [ds]
    for split in splits:
        for batch in split.iter(batch_size=batch_size):
            keys = list(batch)
            n = len(batch[keys[0]]) if keys else 0
            yield [{k: batch[k][i] for k in keys} for i in range(n)]


def _part_text(p: Any) -> str:
    """Text of one content part. Anthropic ``tool_use`` blocks keep their call as JSON
    (``{"type": "tool_use", "name", "input"}``) and ``tool_result`` blocks keep their type and content,
    so that signals see the call and the observation."""
    if not isinstance(p, dict):
        return str(p)
    kind = p.get("type")
    if kind == "tool_use":
        return json.dumps({"type": "tool_use", "name": p.get("name"), "input": p.get("input")}, ensure_ascii=False,
                          default=str)
    if kind == "tool_result":
        inner = _content_text(p.get("content"))
        return json.dumps({"type": "tool_result", "tool_use_id": p.get("tool_use_id")}) + "\n" + inner
    return str(p.get("text") or p.get("content") or "")


def _content_text(content: Any) -> str:
    """Text of a message ``content``: a string, or a list of parts ({type: text, text}, tool_use, tool_result)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_part_text(p) for p in content)
    return json.dumps(content, ensure_ascii=False, default=str)


def _only_tool_results(content: Any) -> bool:
    """Whether a message's content is a list of Anthropic ``tool_result`` blocks only (an observation)."""
    return isinstance(content, list) and bool(content) and all(
        isinstance(p, dict) and p.get("type") == "tool_result" for p in content)


def _render_turn(role: str, msg: dict[str, Any], text: str) -> str:
    """One turn as plain text; tool calls and tool results keep their JSON so signals can see them."""
    extra = ""
    for key in ("tool_calls", "function_call"):
        if msg.get(key):
            extra += "\n" + json.dumps({key: msg[key]}, ensure_ascii=False, default=str)
    return f"<|{role}|>\n{text}{extra}"


def _split_turns(turns: list[tuple[str, dict[str, Any], str]]) -> tuple[str, str]:
    """Prompt = all turns before the last assistant turn (rendered with roles); response = that turn."""
    last = max((i for i, (r, _, _) in enumerate(turns) if r == "assistant"), default=None)
    if last is None:
        return "\n".join(_render_turn(r, m, t) for r, m, t in turns), ""
    role, msg, text = turns[last]
    resp = text
    for key in ("tool_calls", "function_call"):
        if msg.get(key):
            resp += "\n" + json.dumps({key: msg[key]}, ensure_ascii=False, default=str)
    prompt = "\n".join(_render_turn(r, m, t) for r, m, t in turns[:last])
    return prompt, resp


def to_sample(row: dict[str, Any], default_source: str, index: int, source_field: str = "source") -> Sample:
    """Normalise one raw row of any supported layout into a :class:`Sample`.

    Layouts: flashdraft generate rows (``messages`` + ``response``), ``messages`` (OpenAI style),
    ShareGPT ``conversations`` ({from, value}), ``{prompt, response|completion}``,
    ``{instruction, input, output}``, ``{question, answer}`` and ``{text}``. Content may be a list of
    parts, Anthropic ``tool_use`` / ``tool_result`` blocks included (a user turn holding only tool results
    is read as a tool turn). A ``tools`` /
    ``functions`` field is prepended to the prompt as JSON.
    """
    source = str(row.get(source_field) or default_source)
    sid = str(row.get("id") if row.get("id") is not None else index)
    prompt, response = "", ""
    if isinstance(row.get("messages"), list) or isinstance(row.get("conversations"), list):
        raw = row.get("messages") if isinstance(row.get("messages"), list) else row["conversations"]
        turns = []
        for m in raw:
            if not isinstance(m, dict):
                continue
            role = str(m.get("role") or m.get("from") or "user").lower()
            role = ROLE_ALIASES.get(role, role)
            content = m.get("content", m.get("value"))
            if role == "user" and _only_tool_results(content):
                role = "tool"  # Anthropic: tool results arrive as a user turn
            turns.append((role, m, _content_text(content)))
        if isinstance(row.get("response"), str):
            prompt = "\n".join(_render_turn(r, m, t) for r, m, t in turns)
            response = row["response"]
        else:
            prompt, response = _split_turns(turns)
    elif "instruction" in row or "output" in row:
        prompt = "\n\n".join(str(row[k]) for k in ("instruction", "input") if row.get(k))
        response = str(row.get("output") or "")
    elif "prompt" in row or "response" in row or "completion" in row:
        prompt = _content_text(row.get("prompt"))
        response = _content_text(row.get("response", row.get("completion")))
    elif "question" in row:
        prompt, response = str(row.get("question") or ""), str(row.get("answer") or "")
    elif "text" in row:
        response = str(row.get("text") or "")
    else:
        raise MixError(f"sample {sid} of {source} has none of the known fields (messages, conversations, "
                       "prompt/response, instruction/output, question/answer, text); found "
                       f"{sorted(row)[:10]}; convert it to one of those layouts")
    tools = row.get("tools") or row.get("functions")
    if tools:
        prompt = "<|tools|>\n" + (tools if isinstance(tools, str) else json.dumps(tools, ensure_ascii=False,
                                                                                  default=str)) + "\n" + prompt
    n_tok = n_resp = None
    ids = row.get("token_ids")
    if ids is not None:
        n_tok = len(ids)
        mask = row.get("loss_mask")
        n_resp = int(sum(mask)) if mask is not None else None
    return Sample(source, sid, prompt, response, n_tok, n_resp)


def iter_samples(path: str | Path, batch_size: int = 4096, source_field: str = "source") -> Iterator[list[Sample]]:
    """Yield batches of normalised :class:`Sample` from ``path`` (default source: the file/folder stem)."""
    index = 0
    for f in data_files(path):
        default_source = f.stem if f.is_file() else f.name
        it = (_iter_hf(f, batch_size) if f.is_dir() else
              _iter_parquet(f, batch_size) if f.name.endswith(PARQUET_SUFFIXES) else _iter_jsonl(f, batch_size))
        for rows in it:
            out = []
            for row in rows:
                out.append(to_sample(row, default_source, index, source_field))
                index += 1
            yield out
