"""Chat layouts -> one :class:`Sample` of OpenAI-style messages. The only place that knows the layouts.

Layouts, detected in this order (``LAYOUTS``):

* ``openai``: ``messages`` = [{role, content}]; content is text, ``null`` (a turn of ``tool_calls`` only)
  or a list of parts whose ``text`` parts are joined by newlines (image/audio parts are left out and named
  in the message's ``skipped_parts``);
* ``sharegpt``: ``conversations`` = [{from, value}] (or [{role, content}]);
* ``anthropic``: either of the two with content blocks ``text`` / ``tool_use`` / ``tool_result``:
  a ``tool_use`` block becomes an assistant ``tool_calls`` entry
  (``{"id", "type": "function", "function": {"name", "arguments": <input>}}``) and each ``tool_result``
  block a ``{"role": "tool", "content", "tool_call_id"}`` message;
* ``alpaca``: ``instruction`` + ``input`` (joined by a blank line) with ``output``;
* ``prompt``: ``prompt`` (text or messages) with ``response`` or ``completion``, and an optional ``system``;
* ``qa``: ``question`` with ``answer``;
* ``text``: ``text`` alone (an assistant turn without a prompt);
* ``tokens``: ``token_ids`` (+ ``loss_mask``) alone, already tokenised (no messages).

Roles go through one alias table (``ROLE_ALIASES``: ShareGPT ``human``/``gpt``, ``model``, tool roles);
unknown roles are kept, lower-cased, for the stage to accept or refuse. Fields a layout does not use
(``id``, ``source``, ``tools``, ``token_ids``, a generate row's ``response``, ...) stay in ``Sample.meta``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from flashdraft.records.files import RecordError, Where

LAYOUTS = ("openai", "sharegpt", "alpaca", "prompt", "qa", "text", "tokens")  # "anthropic" is found inside the first two
LAYOUT_FIELDS = {
    "openai": "messages (OpenAI)", "sharegpt": "conversations (ShareGPT)", "prompt": "prompt/response|completion",
    "alpaca": "instruction/input/output", "qa": "question/answer", "text": "text", "tokens": "token_ids/loss_mask",
}
CHAT_LAYOUTS = ("openai", "sharegpt", "anthropic")
PROMPT_LAYOUTS = ("openai", "sharegpt", "alpaca", "prompt", "qa")  # the layouts that hold a prompt to answer
ID_KEYS = ("id", "uuid", "conversation_id", "primary_id", "prompt_id", "task_id")
ROLE_ALIASES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bard": "assistant", "bing": "assistant", "model": "assistant", "bot": "assistant", "function_call": "assistant",
    "system": "system", "tool": "tool", "observation": "tool", "function_response": "tool", "ipython": "tool",
    "function": "tool",
}
_USED = {
    "openai": ("messages",), "sharegpt": ("conversations",), "prompt": ("prompt", "response", "completion", "system"),
    "alpaca": ("instruction", "input", "output"), "qa": ("question", "answer"), "text": ("text",), "tokens": (),
}


@dataclass
class Sample:
    """One record: ``messages`` ([{role, content[, tool_calls | tool_call_id | skipped_parts]}], content always
    text), the layout it came in, and the row's other fields in ``meta``. ``source``/``id`` are set by the reader."""

    source: str
    id: str
    messages: list[dict]
    layout: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_only(self) -> bool:
        """No assistant turn: a prompt to answer, not a conversation to learn from."""
        return not any(m["role"] == "assistant" for m in self.messages)

    @property
    def prompt_key(self) -> str:
        """Content hash of the non-assistant turns: identical prompts share it (deduplication)."""
        return content_hash(self.messages)


def content_hash(messages: list[dict]) -> str:
    turns = [[m["role"], m["content"]] for m in messages if m["role"] != "assistant"]
    return hashlib.sha256(json.dumps(turns, ensure_ascii=False).encode()).hexdigest()[:20]


def row_id(row: dict[str, Any]) -> str | None:
    """The row's own id: the first non-empty of ``ID_KEYS``."""
    raw = next((row[k] for k in ID_KEYS if row.get(k) not in (None, "")), None)
    return None if raw is None else str(raw)


def detect_layout(row: dict[str, Any], layouts: tuple[str, ...] = LAYOUTS) -> str | None:
    """The first of ``layouts`` whose fields the row has (``None``: none of them)."""
    found = {
        "openai": isinstance(row.get("messages"), list),
        "sharegpt": isinstance(row.get("conversations"), list),
        "prompt": "prompt" in row or "response" in row or "completion" in row,
        "alpaca": "instruction" in row or "output" in row,
        "qa": "question" in row,
        "text": "text" in row,
        "tokens": "token_ids" in row,
    }
    return next((name for name in layouts if found[name]), None)


def unknown_layout(row: dict[str, Any], layouts: tuple[str, ...] = LAYOUTS) -> str:
    """Reason text for a row of no known layout (names the keys found and the layouts read)."""
    return (f"has none of the known fields; keys found: {sorted(row)[:12]}; layouts read: "
            + ", ".join(LAYOUT_FIELDS[name] for name in layouts))


def parse_row(row: dict[str, Any], where: Where | str | None = None, layouts: tuple[str, ...] = LAYOUTS) -> Sample:
    """One raw row -> :class:`Sample` (``source``/``id`` empty); a row that cannot be read raises
    :class:`RecordError` naming ``where``."""
    layout = detect_layout(row, layouts)
    if layout is None:
        raise RecordError.row(where, unknown_layout(row, layouts), "rename the fields or convert the file")
    try:
        if layout in ("openai", "sharegpt"):
            msgs, blocks = _turns(row["messages" if layout == "openai" else "conversations"])
            layout = "anthropic" if blocks else layout
        else:
            msgs = _pair(row, layout)
    except RecordError as e:
        raise RecordError.row(where, e.reason, e.fix) from None
    used = _USED["openai" if layout == "anthropic" else layout]
    return Sample("", "", msgs, layout, {k: v for k, v in row.items() if k not in used})


def _bad(reason: str, fix: str = "") -> RecordError:
    """A problem found inside a row; :func:`parse_row` adds the row's place."""
    return RecordError.row(None, reason, fix)


def _scalar(value: Any, what: str) -> str:
    """Text of a plain field (numbers are written out; ``None`` is empty)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    raise _bad(f"has a {what} of type {type(value).__name__}, expected text")


def _pair(row: dict[str, Any], layout: str) -> list[dict]:
    if layout == "prompt":
        p = row.get("prompt")
        msgs = _turns(p)[0] if isinstance(p, list) else [{"role": "user", "content": _scalar(p, "prompt")}]
        if isinstance(row.get("system"), str) and row["system"]:
            msgs.insert(0, {"role": "system", "content": row["system"]})
        answer = row.get("response", row.get("completion"))
    elif layout == "alpaca":
        msgs = [{"role": "user", "content": "\n\n".join(_scalar(row[k], k) for k in ("instruction", "input")
                                                          if row.get(k))}]
        answer = row.get("output")
    elif layout == "qa":
        msgs, answer = [{"role": "user", "content": _scalar(row.get("question"), "question")}], row.get("answer")
    elif layout == "text":
        msgs, answer = [], row.get("text")
    else:  # tokens
        return []
    if answer is not None:
        msgs.append({"role": "assistant", "content": _scalar(answer, "response")})
    return msgs


def _turns(turns: list) -> tuple[list[dict], bool]:
    """Messages of a ``messages``/``conversations`` list, and whether Anthropic tool blocks were seen."""
    out: list[dict] = []
    blocks = False
    for t in turns:
        if not isinstance(t, dict):
            raise _bad(f"has a turn that is a {type(t).__name__}, not an object: {str(t)[:80]}",
                       "each turn must be {role, content} or ShareGPT {from, value}")
        raw_role = t.get("role", t.get("from"))
        calls = t.get("tool_calls") or t.get("function_call")
        if raw_role is None or ("content" not in t and "value" not in t and not calls):
            raise _bad(f"has a turn without 'role'/'content' (or ShareGPT 'from'/'value'): {str(t)[:80]}",
                       "give every turn a role and a content")
        role = str(raw_role).lower()
        role = ROLE_ALIASES.get(role, role)
        msgs, seen = _message(role, t.get("content", t.get("value")), t)
        out += msgs
        blocks |= seen
    return out, blocks


def _message(role: str, content: Any, turn: dict) -> tuple[list[dict], bool]:
    """One turn -> its messages (tool results split off as ``tool`` messages) and whether it had tool blocks."""
    msg: dict[str, Any] = {"role": role, "content": ""}
    for key in ("tool_calls", "function_call", "tool_call_id"):
        if turn.get(key):
            msg[key] = turn[key]
    if content is None or isinstance(content, str):
        msg["content"] = content or ""
        return [msg], False
    if not isinstance(content, list):
        raise _bad(f"has a {role} turn whose content is a {type(content).__name__}",
                   "content must be text or a list of parts")
    texts, calls, results, skipped = [], [], [], []
    for part in content:
        kind = part.get("type", "text") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "tool_use":
            calls.append({"id": part.get("id"), "type": "function",
                          "function": {"name": part.get("name"), "arguments": part.get("input")}})
        elif kind == "tool_result":
            results.append({"role": "tool", "content": _block_text(part.get("content")),
                            "tool_call_id": part.get("tool_use_id")})
        else:  # images, audio: not text; the stage decides whether the row is still usable
            skipped.append(str(kind or type(part).__name__))
    if skipped:
        msg["skipped_parts"] = skipped
    msg["content"] = "\n".join(texts)
    if calls:
        msg["tool_calls"] = msg.get("tool_calls", []) + calls
    keep = [msg] if texts or calls or not results else []
    return results + keep, bool(calls or results)


def _block_text(content: Any) -> str:
    """Text of a ``tool_result`` block's content: a string, or its ``text`` blocks joined by newlines."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False, default=str)
