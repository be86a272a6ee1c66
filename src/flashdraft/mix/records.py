"""Mix's view of a record: the prompt and response as text, for the signals and classifiers.

Files and layouts are read by :mod:`flashdraft.records` (one rule per suffix, one layout parser);
this module renders each :class:`flashdraft.records.Sample` as text (roles as ``<|role|>`` lines, tool
calls and tool results kept as JSON so that the signals see them) and streams batches in bounded memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashdraft import records
from flashdraft.mix.domains import MixError


class MixRecordError(records.RecordError, MixError):
    """A file or row that mix cannot read: a :class:`~flashdraft.records.RecordError` that is also a MixError."""

    @classmethod
    def of(cls, e: records.RecordError) -> "MixRecordError":
        return cls(str(e), e.where, e.reason, e.fix)


@dataclass(slots=True)
class Sample:
    """The text view of one record: ``prompt`` is every turn before the answer, ``response`` the answer;
    ``messages`` are the record's messages as :mod:`flashdraft.records` read them."""

    source: str
    id: str
    prompt: str
    response: str
    n_tokens: int | None = None
    n_response_tokens: int | None = None
    messages: list[dict] | None = None


def _rows(path: str | Path) -> Iterator[tuple[records.Where, dict[str, Any]]]:
    try:
        yield from records.iter_rows(path)
    except records.RecordError as e:
        raise MixRecordError.of(e) from None


def iter_rows(path: str | Path, batch_size: int = 4096) -> Iterator[list[dict[str, Any]]]:
    """Yield batches of raw rows (dicts) from every file behind ``path``, streaming."""
    batch: list[dict[str, Any]] = []
    for _, row in _rows(path):
        batch.append(row)
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def _json(value: Any, **kw) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, **kw)


def _turn_text(m: dict[str, Any], anthropic: bool) -> str:
    """A message's text; in Anthropic rows the tool calls and results are written back as their blocks."""
    if not anthropic:
        return m["content"]
    if m["role"] == "tool":
        return json.dumps({"type": "tool_result", "tool_use_id": m.get("tool_call_id")}) + "\n" + m["content"]
    calls = [_json({"type": "tool_use", "name": c.get("function", {}).get("name"),
                    "input": c.get("function", {}).get("arguments")}) for c in m.get("tool_calls", [])]
    return "\n".join(([m["content"]] if m["content"] or not calls else []) + calls)


def _call_json(m: dict[str, Any], anthropic: bool) -> str:
    """OpenAI ``tool_calls`` / ``function_call`` of a message as JSON lines (empty in Anthropic rows)."""
    if anthropic:
        return ""
    return "".join("\n" + _json({key: m[key]}) for key in ("tool_calls", "function_call") if m.get(key))


def _render(m: dict[str, Any], anthropic: bool) -> str:
    return f"<|{m['role']}|>\n{_turn_text(m, anthropic)}{_call_json(m, anthropic)}"


def text_view(s: records.Sample, source: str, sid: str) -> Sample:
    """Render a record as prompt/response text. Chat layouts: prompt = the turns before the last assistant
    turn (``<|role|>`` lines), response = that turn, or a generate row's own ``response`` after all turns;
    prompt/answer layouts: the prompt text and the answer. ``tools``/``functions`` lead the prompt as JSON."""
    msgs, meta = s.messages, s.meta
    if s.layout in records.CHAT_LAYOUTS:
        anthropic = s.layout == "anthropic"
        if isinstance(meta.get("response"), str):
            prompt, response = "\n".join(_render(m, anthropic) for m in msgs), meta["response"]
        else:
            last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
            if last is None:
                prompt, response = "\n".join(_render(m, anthropic) for m in msgs), ""
            else:
                prompt = "\n".join(_render(m, anthropic) for m in msgs[:last])
                response = _turn_text(msgs[last], anthropic) + _call_json(msgs[last], anthropic)
    else:
        prompt = "\n".join(m["content"] for m in msgs if m["role"] not in ("assistant", "system"))
        response = "\n".join(m["content"] for m in msgs if m["role"] == "assistant")
    tools = meta.get("tools") or meta.get("functions")
    if tools:
        prompt = "<|tools|>\n" + (tools if isinstance(tools, str) else _json(tools)) + "\n" + prompt
    n_tok = n_resp = None
    ids = meta.get("token_ids")
    if ids is not None:
        n_tok = len(ids)
        mask = meta.get("loss_mask")
        n_resp = int(sum(mask)) if mask is not None else None
    return Sample(source, sid, prompt, response, n_tok, n_resp, msgs)


def to_sample(row: dict[str, Any], default_source: str, index: int, source_field: str = "source",
              where: records.Where | str | None = None) -> Sample:
    """Normalise one raw row of any layout :mod:`flashdraft.records` reads into a text :class:`Sample`."""
    source = str(row.get(source_field) or default_source)
    try:
        s = records.parse_row(row, where if where is not None else f"sample {index} of {source}")
    except records.RecordError as e:
        raise MixRecordError.of(e) from None
    return text_view(s, source, records.row_id(row) or str(index))


def iter_samples(path: str | Path, batch_size: int = 4096, source_field: str = "source") -> Iterator[list[Sample]]:
    """Yield batches of text :class:`Sample` from ``path`` (default source: the file/folder stem)."""
    batch: list[Sample] = []
    for index, (where, row) in enumerate(_rows(path)):
        default_source = where.path.stem if where.path.is_file() else where.path.name
        batch.append(to_sample(row, default_source, index, source_field, where))
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch
