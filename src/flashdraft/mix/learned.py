"""The default domain classifier: a linear softmax head over cheap features (rule signals, per-turn
evidence, token counts), trained on the family-labelled pool; every label comes with its evidence.

Decision order:

1. custom keyword labels from the config (as in the rules),
2. **other** when the rules find too little text to read (no words, no code, no numbers),
3. per-turn precedence (:func:`structural_label`): an action/observation loop across turns is **agent**
   (a multi-turn agent that writes code is agent, not coding); otherwise
4. the head's most probable domain among the configured labels that have evidence
   (:func:`evidence_gates`: translation needs two languages or a request, math notation, math words
   or numbers in the question, agent an action or an observation, tool_calling a schema or a call); with ``abstain_below`` > 0, a top
   probability under it gives **other** (calibrated abstention).

The shipped head (``data/head.npz``) is trained by ``experiments/mix_lofo.py`` on ``data/pool.jsonl`` and
``data/dev_set.jsonl``; its metadata holds the leave-one-family-out confusion matrix that
`mix report` uses to correct domain shares.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from flashdraft.io import atomic_write_bytes
from flashdraft.mix import features as F
from flashdraft.mix.classify import RESPONSE_HEAD, RuleClassifier
from flashdraft.mix.domains import DEFAULT_DOMAINS, Label, MixError, check_labels
from flashdraft.mix.records import Sample

DEFAULT_HEAD = Path(__file__).resolve().parent / "data" / "head.npz"
# What the learned classifier reads (shorter than the rules alone, for speed): prompt head + tail, response head.
PROMPT_HEAD, PROMPT_TAIL, RESPONSE_CHARS = 300, 1200, 1200


def structural_label(sig: Mapping) -> tuple[str, str] | None:
    """Per-turn precedence: (domain, rule) decided by what the assistant does across turns, or None.

    1. an action/observation loop -> **agent**: two or more observations (tool turns, environment output
       in user turns, user turns answering an action) with no real user turn between them, or one
       observation followed by an answer that acts again (a chat where the user speaks between single
       tool calls is not a loop); a transcript inside one text counts too (ReAct
       ``Thought/Action/Observation`` steps, numbered or not, text-game and shell transcripts);
    2. otherwise an answer that is a tool call in a known syntax -> **tool_calling** (one call, or
       parallel calls, with no loop);
    3. otherwise None: the content decides (a single answer that is code is coding).
    """
    loop, now, asst = sig.get("loop_observations", 0), sig.get("current_loop", 0), sig.get("assistant_turns", 0)
    if loop >= 2 and asst >= 2 or now >= 1 and asst >= 2 and sig.get("response_acts", 0):
        return "agent", "turns_action_observation_loop"
    if sig.get("observation_lines", 0) >= 1 and (sig.get("react_kinds", 0) >= 2 or sig.get("numbered_steps", 0) >= 2) \
            or sig.get("game_shell", 0) >= 3:
        return "agent", "transcript_in_text"
    if sig.get("response_tool_call", 0):
        return "tool_calling", "answer_is_tool_call"
    return None


def evidence_gates(sig: Mapping) -> dict[str, bool]:
    """Domains that need positive evidence before the head may choose them (coding and general need
    none): translation needs a request or two languages/scripts (with code: in the prose around the code); math
    needs notation, arithmetic, math words or at least two numbers in the question (a bare number answering a
    trivia question is not math); agent needs an action or an observation; tool_calling needs a schema or a call
    in some syntax."""
    g = sig.get
    codeish = g("code_fences", 0) > 0 or g("code_line_ratio", 0) >= 0.3 or g("latex_cmds", 0) >= 2 \
        or g("arith_exprs", 0) >= 2
    return {
        "translation": bool(g("translate_request") or g("into_language") or g("prose_script_switch"))
                       or not codeish and bool(
                            g("language_switch") or g("two_scripts") or g("accent_switch")
                            or g("bilingual_response") or g("language_labels", 0) >= 2
                            or (g("prompt_lang") and g("response_lang") and g("prompt_lang") != g("response_lang"))
                            or g("prompt_script") != g("response_script") and "none" not in (
                                g("prompt_script"), g("response_script"))),
        "math": bool(g("latex_cmds") or g("arith_exprs") or g("math_words") or g("math_cjk")
                     or g("ask_numbers", 0) >= 2),
        "agent": bool(g("observations") or g("actions") or g("observation_turns") or g("react_kinds")
                      or g("game_shell") or g("numbered_steps") or g("call_turns")),
        "tool_calling": bool(g("schema_hits") or g("call_hits") or g("tool_format") or g("response_tool_call")
                             or g("call_turns")),
    }


class Analyzer:
    """Computes the merged signal dict (rules + formats + turns) and the tokens of samples."""

    def __init__(self):
        self.rules = RuleClassifier(DEFAULT_DOMAINS)

    def __call__(self, s: Sample) -> tuple[Label, dict, list[str]]:
        prompt, response = s.prompt or "", (s.response or "")[:RESPONSE_CHARS]
        if len(prompt) > PROMPT_HEAD + PROMPT_TAIL:
            prompt = prompt[:PROMPT_HEAD] + "\n" + prompt[-PROMPT_TAIL:]
        label, sig = self.rules.analyze(prompt, response)
        langs = {k: sig.get(k, "") for k in ("prompt_lang", "response_lang", "prompt_script", "response_script")}
        sig = {k: v for k, v in sig.items() if isinstance(v, (int, float))}
        sig.update(langs)
        sig.update(F.format_signals(prompt, response))
        sig.update(F.turn_evidence(s.prompt or "", response))
        sig["prompt_script"] = F.script_of(sig.get("prompt_script"))
        sig["response_script"] = F.script_of(sig.get("response_script"))
        sig["rule_domain"] = label.domain
        return label, sig, F.tokens(prompt, response)


def build_vocab(token_lists: Iterable[list[str]], numeric: Iterable[dict], max_tokens: int = 4000,
                min_df: int = 3) -> list[str]:
    """Feature names: every numeric feature seen, then the ``max_tokens`` tokens with the highest document
    frequency (at least ``min_df``)."""
    df: Counter = Counter()
    names: set[str] = set()
    for toks in token_lists:
        df.update(set(toks))
    for num in numeric:
        names.update(num)
    top = [t for t, n in df.most_common(max_tokens) if n >= min_df]
    return sorted(names) + top


def vectorize(items: Sequence[tuple[dict, list[str]]], index: Mapping[str, int]):
    """Sparse CSR matrix (n, len(index)) of numeric features and log1p token counts."""
    from scipy.sparse import csr_matrix

    get = index.get
    n_rows, dim = len(items), len(index)
    nr, nc, nv, tr, tc = [], [], [], [], []
    for r, (num, toks) in enumerate(items):
        for k, v in num.items():
            j = get(k)
            if j is not None:
                nr.append(r)
                nc.append(j)
                nv.append(v)
        js = [j for j in map(get, toks) if j is not None]
        tc.extend(js)
        tr.extend([r] * len(js))
    tok = csr_matrix((np.ones(len(tc)), (np.asarray(tr, dtype=np.int64), np.asarray(tc, dtype=np.int64))),
                     shape=(n_rows, dim))  # duplicates summed: token counts
    tok.sum_duplicates()
    tok.data = np.log1p(tok.data)
    num = csr_matrix((np.asarray(nv, dtype=np.float64), (np.asarray(nr, dtype=np.int64),
                                                         np.asarray(nc, dtype=np.int64))), shape=(n_rows, dim))
    return (tok + num).tocsr()


class LearnedClassifier:
    """Linear head over :mod:`flashdraft.mix.features`; ``classify_batch`` returns labels with evidence."""

    method = "learned"

    def __init__(self, classes: Sequence[str], names: Sequence[str], w: np.ndarray, b: np.ndarray,
                 scale: np.ndarray, labels: Iterable[str] = DEFAULT_DOMAINS,
                 keyword_labels: Mapping[str, Sequence[str]] | None = None, abstain_below: float = 0.0,
                 meta: dict | None = None, structural: bool = True):
        self.classes = tuple(classes)
        self.names = list(names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.w, self.b, self.scale = w, b, scale  # w: (features, classes), b: (classes,), scale: (features,)
        self.labels = check_labels(labels)
        self.keywords = RuleClassifier(self.labels, keyword_labels)
        self.abstain_below = abstain_below
        self.meta = meta or {}
        self.structural = structural
        self.analyzer = Analyzer()
        self._allowed = np.array([c in self.labels for c in self.classes])
        self._col = {c: j for j, c in enumerate(self.classes)}
        self._wmean = self.w.mean(1) if self.w.size else self.w.sum(1)
        if not self._allowed.any():
            raise MixError(f"none of the head's domains {list(self.classes)} is in the label set {list(self.labels)}; "
                           "add one of them to --labels or use --method rules")

    # -- training -------------------------------------------------------------------------------
    @classmethod
    def fit(cls, analyzed: Sequence[tuple[dict, list[str]]], gold: Sequence[str], weights: np.ndarray | None = None,
            l2: float = 3e-3, max_tokens: int = 4000, **kw) -> "LearnedClassifier":
        """Train on pre-analysed samples (numeric features, tokens) with labels ``gold``."""
        from flashdraft.mix.embed import fit_head

        if len(set(gold)) < 2:
            raise MixError("training the learned head needs labelled samples of at least two domains")
        classes = tuple(sorted(set(gold)))
        names = build_vocab((t for _, t in analyzed), (n for n, _ in analyzed), max_tokens)
        x = vectorize(analyzed, {n: i for i, n in enumerate(names)})
        scale = np.asarray(np.sqrt(x.multiply(x).mean(0))).ravel() + 1e-3  # per-feature RMS
        from scipy.sparse import diags

        x = x @ diags(1.0 / scale)
        y = np.array([classes.index(g) for g in gold])
        w, b = fit_head(x, y, len(classes), l2=l2, weights=weights)
        return cls(classes, names, (w / scale[:, None]).astype(np.float32), b.astype(np.float32),
                   scale.astype(np.float32), **kw)

    def features(self, samples: Sequence[Sample]) -> list[tuple[Label, dict, list[str]]]:
        return [self.analyzer(s) for s in samples]

    # -- inference ------------------------------------------------------------------------------
    def classify_batch(self, samples: Sequence[Sample]) -> list[Label]:
        """Labels for a batch of samples (same order)."""
        out: list[Label | None] = [None] * len(samples)
        todo, items, sigs = [], [], []
        for i, s in enumerate(samples):
            kw = self.keywords.keyword_label((s.prompt or "")[:4000] + "\n" + (s.response or "")[:RESPONSE_HEAD]) \
                if self.keywords.keyword_rules else None
            if kw is not None:
                out[i] = kw
                continue
            rule_label, sig, toks = self.analyzer(s)
            if rule_label.rule == "too_little_text" and "other" in self.labels:
                out[i] = Label("other", "too_little_text", {"words": sig.get("words", 0)})
                continue
            st = structural_label(sig) if self.structural else None
            if st and st[0] in self.labels:
                out[i] = Label(st[0], st[1], {k: sig[k] for k in (
                    "assistant_turns", "observation_turns", "call_turns", "observations", "react_kinds",
                    "numbered_steps", "game_shell", "response_tool_call") if sig.get(k)})
                continue
            todo.append(i)
            items.append((F.numeric_features(sig), toks))
            sigs.append(sig)
        if todo:
            x = vectorize(items, self.index)
            logits = x @ self.w + self.b  # (n, classes)
            logits[:, ~self._allowed] = -np.inf
            for r, sig in enumerate(sigs):
                for dom, ok in evidence_gates(sig).items():
                    if not ok and dom in self._col:
                        logits[r, self._col[dom]] = -np.inf
            logits[np.isinf(logits).all(1)] = 0.0  # nothing allowed: keep the head's own order
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            for r, i in enumerate(todo):
                a, z = x.indptr[r], x.indptr[r + 1]
                out[i] = self._label(p[r], x.indices[a:z], x.data[a:z], sigs[r])
        return out  # type: ignore[return-value]

    def _label(self, p: np.ndarray, cols: np.ndarray, vals: np.ndarray, sig: dict) -> Label:
        order = np.argsort(-p)
        c = int(order[0])
        ev: dict = {f"p_{self.classes[j]}": round(float(p[j]), 3) for j in order[:2]}
        if len(cols):
            contrib = vals * (self.w[cols, c] - self._wmean[cols])
            top = np.argsort(-contrib)[:4]
            ev["evidence"] = ", ".join(f"{self.names[cols[k]]} {contrib[k]:+.2f}" for k in top if contrib[k] > 0)
        ev["rule_domain"] = sig.get("rule_domain", "")
        if self.abstain_below and p[c] < self.abstain_below and "other" in self.labels:
            return Label("other", "abstain", ev)
        return Label(self.classes[c], "learned_head", ev)

    def classify(self, prompt: str, response: str) -> Label:
        return self.classify_batch([Sample("", "", prompt, response)])[0]

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        buf = io.BytesIO()
        np.savez_compressed(buf, w=self.w, b=self.b, scale=self.scale,
                            header=json.dumps({"classes": list(self.classes), "names": self.names, "meta": self.meta},
                                              ensure_ascii=False))
        atomic_write_bytes(Path(path), buf.getvalue())

    @classmethod
    def load(cls, path: str | Path | None = None, **kw) -> "LearnedClassifier":
        p = Path(path) if path else DEFAULT_HEAD
        if not p.is_file():
            raise MixError(f"learned head {p} does not exist; build it with `python experiments/mix_lofo.py --save {p}` "
                           "or use --method rules")
        try:
            with np.load(p) as z:
                head = json.loads(str(z["header"]))
                parts = head["classes"], head["names"], z["w"], z["b"], z["scale"], head.get("meta")
        except (KeyError, ValueError, OSError) as e:
            raise MixError(f"{p} is not a learned head saved by flashdraft ({e}); rebuild it with "
                           "experiments/mix_lofo.py --save") from None
        classes, names, w, b, scale, meta = parts
        return cls(classes, names, w, b, scale, meta=meta, **kw)  # a label set that misses the head: its own MixError
