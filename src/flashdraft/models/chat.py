"""Prompts as a served user sends them: through the target's chat template, or as plain text.

One rendering for ``generate`` (:class:`flashdraft.generate.convo.Renderer`), ``decode``/``run`` and ``bench
decode``: the template's text with the generation prompt (``enable_thinking`` passed only when asked), tokenised
without adding special tokens (what ``apply_chat_template(tokenize=True)`` gives). ``--chat-template auto`` applies the target's template when its tokenizer has one;
``never`` (and every base model, which has none) continues the raw prompt text after BOS.

A drafter remembers how its training sequences were prompted (``prompting`` in its config.json, found from the
sequences' own tokens by :func:`prompting_of`); decoding another way is warned about (:func:`prompting_mismatch`),
since acceptance drops when a drafter meets a prompt format it never saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flashdraft.errors import FlashdraftError

ChatTemplateMode = Literal["auto", "never"]
THINK_TOKENS = ("<think>", "</think>")  # the reasoning markers of Qwen3-style templates


class ChatError(FlashdraftError, ValueError):
    """A prompt that cannot be rendered as asked; the message names the fix."""


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt: its raw text (base models, ``--chat-template never``) and/or its chat messages."""

    text: str | None = None
    messages: tuple[dict, ...] | None = None

    def as_messages(self) -> list[dict]:
        return [dict(m) for m in self.messages] if self.messages else [{"role": "user", "content": self.text or ""}]

    def as_text(self) -> str:
        if self.text is not None:
            return self.text
        return "\n\n".join(m["content"] for m in self.messages or () if m.get("role") != "assistant")


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def knows_thinking(tokenizer) -> bool:
    """Whether the tokenizer's chat template reads an ``enable_thinking`` switch."""
    return "enable_thinking" in str(getattr(tokenizer, "chat_template", "") or "")


def template_text(tokenizer, messages: list[dict], thinking: bool | None = None) -> str:
    """The template's rendering of ``messages`` with the assistant's generation prompt (``enable_thinking`` passed
    only when ``thinking`` is not None)."""
    kw = {} if thinking is None else {"enable_thinking": thinking}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)


@dataclass(frozen=True)
class ChatSettings:
    """How a prompt becomes token ids: ``mode`` auto (the target's template when it has one) or never (raw text);
    ``thinking`` the template's switch (None: its default); ``system`` a system message put first."""

    mode: ChatTemplateMode = "auto"
    thinking: bool | None = None
    system: str | None = None

    def __post_init__(self):
        if self.mode not in ("auto", "never"):
            raise ChatError(f"chat template mode {self.mode!r} is unknown; use auto (the target's template when it has "
                            "one) or never (the raw prompt text)")

    def uses_template(self, tokenizer) -> bool:
        return self.mode == "auto" and has_template(tokenizer)

    def describe(self, tokenizer) -> str:
        """One line for logs and reports: which rendering the prompts got."""
        if self.mode == "never":
            return "raw prompt text (--chat-template never)"
        if not has_template(tokenizer):
            return "raw prompt text (the target has no chat template)"
        think = ""
        if knows_thinking(tokenizer):
            think = ", thinking " + {None: "as the template defaults", True: "on", False: "off"}[self.thinking]
        return "the target's chat template" + think + (", with a system prompt" if self.system else "")

    def notes(self, tokenizer, drafters=()) -> list[str]:
        """What to warn about once: options that have no effect with this target, and each of ``drafters`` trained
        on another prompt format (:func:`prompting_mismatch`)."""
        out = [m for d in drafters if (m := prompting_mismatch(d.cfg, self, tokenizer))]
        if self.thinking is not None and not (self.uses_template(tokenizer) and knows_thinking(tokenizer)):
            out.append("--thinking/--no-thinking has no effect: " + (
                "the prompts are raw text" if not self.uses_template(tokenizer) else
                "the target's chat template has no enable_thinking switch"))
        if self.system and not self.uses_template(tokenizer):
            out.append("--system has no effect: the prompts are raw text (no chat template)")
        return out

    def encode(self, target, prompt: "str | Prompt | list[dict]") -> list[int]:
        """Token ids of ``prompt`` (raw text, a :class:`Prompt` or a list of chat messages) for ``target``."""
        if isinstance(prompt, str):
            prompt = Prompt(text=prompt)
        elif isinstance(prompt, list):
            prompt = Prompt(messages=tuple(prompt))
        tok = target.tokenizer
        if not self.uses_template(tok):
            return target.encode(prompt.as_text())
        messages = prompt.as_messages()
        if self.system and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": self.system}, *messages]
        try:
            text = template_text(tok, messages, self.thinking)
        except Exception as e:  # jinja errors (a template that refuses a role order) have no common base class
            raise ChatError(f"{target.name}'s chat template refused the prompt ({str(e).splitlines()[0]}); pass "
                            "--chat-template never for raw text, or messages in an order the template accepts") from None
        return list(tok(text, add_special_tokens=False)["input_ids"])  # the template writes any BOS itself


def template_marker_ids(tokenizer) -> set[int]:
    """The special-token ids the chat template writes around a turn (``<|im_start|>``, ``<start_of_turn>``...);
    empty without a template."""
    if not has_template(tokenizer):
        return set()
    try:
        text = template_text(tokenizer, [{"role": "user", "content": "x"}])
    except Exception:  # a template that needs other roles: no markers to look for
        return set()
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= {int(i) for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()
                if getattr(t, "special", False)}
    bos = getattr(tokenizer, "bos_token_id", None)
    return {i for i in tokenizer(text, add_special_tokens=False)["input_ids"] if i in special and i != bos}


def user_turn_signature(tokenizer) -> list[int]:
    """The two tokens the chat template writes just before a user turn's text (``<|im_start|>``, ``user``;
    ``<start_of_turn>``, ``user``), the last token before the text left out (it may merge with the text);
    [] without a template."""
    if not has_template(tokenizer):
        return []
    sentinel = "QZXJ sentinel"
    try:
        text = template_text(tokenizer, [{"role": "user", "content": sentinel}])
    except Exception:  # a template that needs other roles
        return []
    ids = list(tokenizer(text[: text.index(sentinel)], add_special_tokens=False)["input_ids"])
    return ids[-3:-1] if len(ids) >= 3 else []


def _contains(seq: list[int], sub: list[int]) -> bool:
    n = len(sub)
    return any(seq[i : i + n] == sub for i in range(len(seq) - n + 1))


def prompting_of(sequences: list[list[int]], tokenizer) -> dict:
    """How training ``sequences`` (token ids) were prompted: ``chat_template`` (True when most hold the template's
    user-turn signature, :func:`user_turn_signature`), ``template_share`` and ``thinking_share`` (the share holding
    ``<think>``; None when the vocabulary has no such token) -> the ``prompting`` entry of a drafter's config.json."""
    sig = user_turn_signature(tokenizer) if tokenizer is not None else []
    n = max(len(sequences), 1)
    share = sum(1 for s in sequences if sig and _contains(s, sig)) / n
    think = (tokenizer.get_vocab() if tokenizer is not None else {}).get(THINK_TOKENS[0])
    thinking = None if think is None else round(sum(1 for s in sequences if think in s) / n, 3)
    return {"chat_template": share >= 0.5, "template_share": round(share, 3), "thinking_share": thinking}


def prompting_mismatch(drafter_cfg, settings: ChatSettings, tokenizer) -> str | None:
    """A warning when a drafter trained on one prompt format is decoded with another, else None."""
    p = getattr(drafter_cfg, "prompting", None) or (getattr(drafter_cfg, "model_extra", None) or {}).get("prompting")
    if not isinstance(p, dict) or "chat_template" not in p:
        return None
    trained, now = bool(p["chat_template"]), settings.uses_template(tokenizer)
    if trained == now:
        return None
    say = {True: "with the chat template", False: "on raw text"}
    return (f"the drafter was trained {say[trained]} but the prompts are rendered {say[now]}: acceptance is lower "
            f"than it measured; pass --chat-template {'auto' if trained else 'never'} to decode as it was trained")
