"""Turn-by-turn regeneration state: prompt token ids, the assistant loss mask and the output record.

A conversation is split into *generation points*: each user turn that the source answered (or the last
one). The target answers them in order, each time conditioned on its own earlier answers. The token
sequence is built incrementally from the exact ids the target saw and produced, so a record's
``token_ids``/``loss_mask`` need no re-tokenisation: the mask is 1 exactly on generated tokens.

With a chat template each turn is rendered by the tokenizer; when the new rendering does not extend the
previous text (templates that rewrite history, e.g. drop earlier reasoning), the prompt is tokenised
afresh and the earlier turns lose their mask (counted as ``rerendered``). Without a template (base
models) the turns are joined as plain text separated by a blank line: plain continuation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flashdraft.generate.sources import Sample
from flashdraft.models.chat import has_template, template_text
from flashdraft.models.target import with_bos

PLAIN_SEPARATOR = "\n\n"


def generation_points(messages: list[dict], max_turns: int | None = None) -> list[list[dict]]:
    """Split source messages (assistant turns dropped) into the segments that precede each answer."""
    segments, cur = [], []
    for m in messages:
        if m["role"] == "assistant":
            if any(c["role"] == "user" for c in cur):
                segments.append(cur)
                cur = []
            continue
        cur.append(m)
    if any(c["role"] == "user" for c in cur):
        segments.append(cur)
    return segments[:max_turns] if max_turns else segments


@dataclass
class Conversation:
    """One sample being regenerated; ``ids``/``mask`` grow with every prompt and answer."""

    sample: Sample
    segments: list[list[dict]]
    messages: list[dict] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    prev_text: str = ""
    turn: int = 0
    responses: list[str] = field(default_factory=list)
    finish_reason: str = ""
    rerendered: bool = False
    error: str | None = None

    @property
    def pending(self) -> bool:
        return self.error is None and self.turn < len(self.segments)

    def record(self) -> dict:
        return {
            "source": self.sample.source,
            "id": self.sample.id,
            "messages": self.messages,
            "response": self.responses[-1] if self.responses else "",
            "token_ids": self.ids,
            "loss_mask": self.mask,
            "num_turns": len(self.responses),
            "finish_reason": self.finish_reason,
        }


class Renderer:
    """Renders the next prompt of a conversation and folds in the target's answer."""

    def __init__(self, tokenizer, use_template: bool = True, thinking: bool | None = None,
                 eos_ids: list[int] | tuple[int, ...] = ()):
        self.tok = tokenizer
        self.template = use_template and has_template(tokenizer)
        self.thinking = thinking
        self.eos_ids = set(eos_ids)

    def start(self, sample: Sample, max_turns: int | None = None) -> Conversation:
        return Conversation(sample, generation_points(sample.messages, max_turns))

    def _encode(self, text: str, special: bool) -> list[int]:
        return list(self.tok(text, add_special_tokens=special)["input_ids"])

    def next_prompt(self, conv: Conversation) -> list[int]:
        """Prompt ids for ``conv``'s next answer (conv.ids/mask become exactly that prompt)."""
        seg = conv.segments[conv.turn]
        if self.template:
            text = template_text(self.tok, conv.messages + seg, self.thinking)
            if conv.prev_text and text.startswith(conv.prev_text):
                new = self._encode(text[len(conv.prev_text):], special=False)
            else:
                if conv.turn:
                    conv.rerendered = True
                conv.ids, conv.mask = [], []
                new = self._encode(text, special=False)
        else:
            text = PLAIN_SEPARATOR.join(m["content"] for m in seg)
            if conv.turn:
                text = PLAIN_SEPARATOR + text
            new = self._encode(text, special=conv.turn == 0)
            if conv.turn == 0:
                new = with_bos(self.tok, new)
            text = conv.prev_text + text
        conv.ids = conv.ids + new
        conv.mask = conv.mask + [0] * len(new)
        conv.prev_text = text
        return conv.ids

    def add_answer(self, conv: Conversation, token_ids: list[int], finish_reason: str) -> None:
        """Append the target's answer: its ids get mask 1, its text (stop/EOS token removed) a message."""
        seg = conv.segments[conv.turn]
        body = token_ids[:-1] if token_ids and token_ids[-1] in self.eos_ids else token_ids
        content = self.tok.decode(body, skip_special_tokens=True)
        conv.ids = conv.ids + list(token_ids)
        conv.mask = conv.mask + [1] * len(token_ids)
        conv.prev_text += self.tok.decode(token_ids, skip_special_tokens=False)
        conv.messages = conv.messages + seg + [{"role": "assistant", "content": content}]
        conv.responses.append(content)
        conv.finish_reason = finish_reason
        conv.turn += 1
