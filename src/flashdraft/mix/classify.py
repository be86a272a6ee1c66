"""Rule-based domain classifier: transparent signals first, each label returned with what decided it.

Decision order (first rule that fires wins, among the configured labels):

1. custom keyword labels from the config (``keyword_labels``),
2. **agent**: a loop of actions and observations (ReAct ``Thought/Action/Observation`` lines, or two
   or more tool/observation turns in a conversation),
3. **tool_calling**: function schemas or tool-call JSON,
4. **translation**: a translate request (many languages), or the prompt and response in two
   scripts/languages, or parallel ``English: ... / French: ...`` lines; a request about code
   ("translate this Python to Rust") goes to coding instead,
5. **coding** vs **math**: code fences + code-like lines against LaTeX, arithmetic and math words,
6. **general** for remaining prose, **other** for text with too few letters.

A rule whose domain is not in the label set is skipped, so a smaller label set just falls through.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import re

from flashdraft.mix import signals as S
from flashdraft.mix.domains import DEFAULT_DOMAINS, Label, MixError, check_labels
from flashdraft.mix.records import Sample

# Characters read: the head and tail of the prompt and the head of the response (a bound on time per sample).
PROMPT_HEAD, PROMPT_TAIL, RESPONSE_HEAD = 1500, 2500, 3000


def _clip(text: str) -> str:
    return text if len(text) <= PROMPT_HEAD + PROMPT_TAIL else text[:PROMPT_HEAD] + "\n" + text[-PROMPT_TAIL:]


class RuleClassifier:
    """Classify samples into ``labels`` with the transparent rules described in this module."""

    method = "rules"

    def __init__(self, labels: Iterable[str] = DEFAULT_DOMAINS, keyword_labels: Mapping[str, Sequence[str]] | None = None):
        self.labels = check_labels(labels)
        self.keyword_rules: list[tuple[str, re.Pattern[str]]] = []
        for name, words in (keyword_labels or {}).items():
            if name not in self.labels:
                raise MixError(f"keyword label {name!r} is not in the label set {list(self.labels)}; add it to labels")
            try:
                self.keyword_rules.append((name, re.compile("|".join(f"(?:{w})" for w in words), re.I)))
            except re.error as e:
                raise MixError(f"keyword pattern for {name!r} is not a valid regex ({e}); fix or escape it") from None

    def classify_batch(self, samples: Sequence[Sample]) -> list[Label]:
        """Labels for a batch of samples (same order)."""
        return [self.classify(s.prompt, s.response) for s in samples]

    def classify(self, prompt: str, response: str) -> Label:
        """Label one sample from its prompt and response text."""
        return self.analyze(prompt, response)[0]

    def keyword_label(self, text: str) -> Label | None:
        """The first configured keyword label whose pattern occurs in ``text`` (None if none)."""
        for name, rx in self.keyword_rules:
            m = rx.search(text)
            if m:
                return Label(name, "keyword", {"keyword": m.group(0)[:40]})
        return None

    def analyze(self, prompt: str, response: str) -> tuple[Label, dict]:
        """The rules' label and every signal they computed (zeros included), for the learned head."""
        prompt, response = prompt or "", response or ""
        turns = {"assistant_turns": prompt.count("<|assistant|>"), "tool_turns": prompt.count("<|tool|>")}
        prompt, response = _clip(prompt), response[:RESPONSE_HEAD]
        text = prompt + "\n" + response
        kw = self.keyword_label(text)
        if kw is not None:
            return kw, {}
        sig = self._signals(prompt, response, text)
        sig.update(turns)
        shown = {k: v for k, v in sig.items() if v not in (0, 0.0, None, "")}
        for domain, rule in self._decide(sig):
            if domain in self.labels:
                return Label(domain, rule, shown), sig
        fallback = "general" if "general" in self.labels else "other" if "other" in self.labels else self.labels[0]
        return Label(fallback, "fallback", shown), sig

    @staticmethod
    def _signals(prompt: str, response: str, text: str) -> dict:
        """Every signal of one (clipped) sample, by name; see :mod:`flashdraft.mix.signals` for the patterns."""
        fences = S.FENCE.findall(text)
        fence_langs = sorted({n for n in (S.lexer_name(t) for t in fences[::2] if t) if n})
        lines = max(1, len(S.LINE.findall(response or prompt)))
        code_lines = len(S.CODE_LINE.findall(response or prompt)) + len(S.SHELL_LINE.findall((response or prompt)[:1500]))
        react = S.REACT.findall(text) + [k for k in S.JSON_REACT_KEYS if k in text]
        digits = len(S.DIGIT.findall(text))
        ask = prompt[-3000:] or response[:1500]
        ask_words = S.WORD.findall(ask.lower())
        resp_words = S.WORD.findall(response.lower()) if prompt else []
        p_script, _ = S.dominant_script(prompt)
        r_script, _ = S.dominant_script(response)
        p_lang, p_en, p_other, p_words = S.latin_language(ask_words[-200:]) if p_script == "latin" else (
            p_script, 0, 1, 99) if p_script else (None, 0, 0, 0)
        r_lang, r_en, r_other, r_words = S.latin_language(resp_words[:200]) if r_script == "latin" else (
            r_script, 0, 1, 99) if r_script else (None, 0, 0, 0)
        # prompt clearly English and response clearly not (or the reverse): a language switch
        # (the other side must show function words of its own language: code or numbers are no language)
        switch = ((p_words >= 4 and r_words >= 3 and p_en >= 0.12 and r_other >= 0.08 and r_other >= 2 * r_en)
                  or (p_words >= 8 and r_words >= 8 and r_en >= 0.12 and p_other >= 0.1 and p_other >= 2 * p_en))
        resp_scripts = S.NON_LATIN.findall(response)
        non_latin_share = len(resp_scripts) / max(1, len(response.replace(" ", "")))
        p_math, p_prog, tr_req, into = S.word_signals(ask_words)
        r_math = S.word_signals(resp_words)[0]
        if resp_scripts or S.NON_LATIN.search(ask):
            tr_req += sum(ask.count(w) for w in S.TRANSLATE_CJK)
        letters = len(ask_words) + len(resp_words) + len(S.NON_LATIN.findall(ask[:600])) // 2  # CJK: ~2 chars a word
        return {
            "code_fences": len(fences) // 2 + len(fences) % 2,
            "fence_langs": ",".join(fence_langs),
            "code_line_ratio": round(code_lines / lines, 3),
            "code_lines": code_lines,
            "prog_lang_words": p_prog + ask.count("c++") + ask.count("C++") + ask.count("C#"),
            # (each pattern is skipped where a character every one of its matches needs is absent)
            "latex_cmds": (len(S.TEX_COMMAND.findall(text)) if "\\" in text else 0)
                          + (len(S.INLINE_MATH.findall(text)) if "$" in text or "\\" in text or ":math:" in text else 0),
            "arith_exprs": len(S.ARITH.findall(text)) if digits or "<<" in text else 0,
            "math_words": p_math + r_math + len(S.MATH_PHRASES.findall(text)),
            "digit_ratio": round(digits / max(1, len(text)), 3),
            "schema_hits": len(S.SCHEMA.findall(text)),
            "call_hits": len(S.CALL.findall(text)),
            "react_kinds": len(set(react)),
            "react_lines": len(react),
            "observations": len(S.OBSERVATION.findall(text)),
            "actions": len(S.ACTION.findall(text)),
            "translate_request": tr_req,
            "into_language": into,
            "language_labels": len(S.LANG_LABEL.findall(text)),
            "language_switch": int(switch),
            "two_scripts": int(bool(p_script and r_script and p_script != r_script and p_words >= 2)),
            "prompt_script": p_script or "",
            "response_script": r_script or "",
            "prompt_lang": p_lang or "",
            "response_lang": r_lang or "",
            "bilingual_response": int(len(resp_scripts) >= 4 and 0.15 < non_latin_share < 0.85),
            "words": letters,
            # a question with two or more numbers answered by a bare number is arithmetic, in any language
            "number_answer": int(bool(S.BARE_NUMBER.match(response[:60])) and len(S.NUMBER.findall(ask)) >= 2),
            # a short answer written in a notation (a regular expression, a spreadsheet formula) is code
            "notation_answer": int(0 < len(response.strip()) <= 300 and response.count("\n") <= 2 and (
                len(S.REGEX_TOKEN.findall(response)) >= 2 and not S.LATEX_COMMON.search(response)
                or len(S.FORMULA.findall(response)) >= 1)),
        }

    @staticmethod
    def _decide(s: dict) -> list[tuple[str, str]]:
        """Ordered (domain, rule) candidates for the signals ``s``; the caller takes the first allowed."""
        out: list[tuple[str, str]] = []
        # agent: an action/observation loop
        if s["react_kinds"] >= 2 and s["observations"] >= 1:
            out.append(("agent", "react_trace"))
        elif s["observations"] >= 2 and (s["actions"] >= 1 or s["assistant_turns"] >= 1):
            out.append(("agent", "action_observation_turns"))
        elif s["react_kinds"] >= 3:
            out.append(("agent", "react_format"))
        # tool calling: schemas or calls
        if s["schema_hits"] >= 1 and s["call_hits"] >= 1:
            out.append(("tool_calling", "schema_and_call"))
        elif s["call_hits"] >= 1 and s["code_fences"] == 0:
            out.append(("tool_calling", "tool_call_json"))
        elif s["schema_hits"] >= 2:
            out.append(("tool_calling", "function_schema"))
        # translation
        codeish = s["code_fences"] > 0 or s["code_line_ratio"] >= 0.3
        two_langs = bool(s["prompt_lang"] and s["response_lang"] and s["prompt_lang"] != s["response_lang"]) \
            or bool(s["language_switch"])
        latin = ("latin", "en", "fr", "de", "es", "it", "pt", "nl", "pl", "sv", "da", "no", "fi", "cs", "tr", "ro",
                 "hu", "id", "vi")
        two_scripts = bool(s["two_scripts"]) or bool(s["prompt_lang"] and s["response_lang"]
                                                     and (s["prompt_lang"] in latin) != (s["response_lang"] in latin))
        if s["translate_request"] and (s["prog_lang_words"] >= 2 or codeish):
            out.append(("coding", "code_translation_request"))
        elif s["translate_request"] or (s["into_language"] and (two_langs or not s["prompt_lang"])):
            out.append(("translation", "translate_request"))
        elif not codeish and s["latex_cmds"] < 2 and s["arith_exprs"] < 2 and (
                s["language_labels"] >= 2 or two_scripts or s["bilingual_response"] or two_langs):
            out.append(("translation", "two_scripts" if two_scripts else "two_languages"))
        if s["notation_answer"]:
            out.append(("coding", "notation_answer"))
        if s["number_answer"] and not codeish:
            out.append(("math", "number_answer"))
        # coding vs math
        code = 3 * min(s["code_fences"], 3) + 6 * s["code_line_ratio"] + min(s["code_lines"], 10) / 5
        math = (0.75 * min(s["latex_cmds"], 20) + 0.75 * min(s["arith_exprs"], 10) + min(s["math_words"], 8) / 2
                + (1.5 if s["digit_ratio"] > 0.05 else 0))
        if s["code_line_ratio"] >= 0.6 and s["latex_cmds"] < 3:  # the answer itself is code
            code += 4
        if s["code_fences"] and s["latex_cmds"] < 3 or code >= 3.5 and code > math:
            out.append(("coding", "code_fences" if s["code_fences"] else "code_lines"))
        if math >= 2.5 and math >= code:
            out.append(("math", "latex_numbers_math_words"))
        if code >= 2.5:
            out.append(("coding", "weak_code_lines"))
        if s["words"] >= 5:
            out.append(("general", "prose"))
        out.append(("other", "too_little_text"))
        return out


def classify_stream(batches: Iterable[Sequence[Sample]], classifier, workers: int = 1):
    """Yield ``(batch, labels)`` for each batch, in order; with ``workers > 1`` the batches are classified
    in that many processes, at most ``2 * workers`` batches in flight (so memory stays bounded). Only the
    rules and learned classifiers are spread over processes; the embedding model already uses every core
    through torch."""
    if workers <= 1 or getattr(classifier, "method", "") not in ("rules", "learned"):
        for batch in batches:
            yield batch, classifier.classify_batch(batch)
        return
    import multiprocessing as mp
    from collections import deque

    with mp.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(classifier,)) as pool:
        pending: deque = deque()
        for batch in batches:
            pending.append((batch, pool.apply_async(_classify_in_worker, (batch,))))
            if len(pending) >= 2 * workers:
                b, fut = pending.popleft()
                yield b, fut.get()
        while pending:
            b, fut = pending.popleft()
            yield b, fut.get()


_WORKER_CLASSIFIER = None


def _init_worker(classifier) -> None:
    global _WORKER_CLASSIFIER
    _WORKER_CLASSIFIER = classifier


def _classify_in_worker(batch):
    return _WORKER_CLASSIFIER.classify_batch(batch)
