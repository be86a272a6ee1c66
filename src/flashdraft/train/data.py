"""Training data: records in, tokenised examples with a loss mask, seeded micro-batches with a resumable position.

Records are read by :mod:`flashdraft.records` (any file or folder it reads, any layout):

* rows with ``token_ids`` (+ ``loss_mask``): already tokenised (what ``flashdraft generate`` writes);
* prompt/answer layouts (``{prompt, response}``, ``{instruction, input, output}``, ``{question, answer}``):
  with a chat template the conversation goes through it; without one (base models such as Gemma-3-270M)
  the ids are tokenize(prompt) + tokenize(answer, no special tokens) [+ eos];
* chat layouts (``messages``, ShareGPT ``conversations``, Anthropic content blocks): need a chat template;
  every assistant turn is supervised.

The loss mask covers response tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from flashdraft.models.draft_vocab import reserved_token_ids, vocab_coverage
from flashdraft.models.drafter import DrafterError
from flashdraft import records
from flashdraft.train.objective import Batch, TrainError, anchor_candidates


@dataclass
class Example:
    token_ids: list[int]
    loss_mask: list[int]
    index: int  # position in the loaded dataset (stable across runs: seeds anchors)
    domain: str | None = None  # the record's domain field (as `flashdraft mix rebalance` writes it), else None


@dataclass
class DataStats:
    records: int = 0
    kept: int = 0
    skipped_short: int = 0  # shorter than one block
    skipped_unsupervised: int = 0  # no position can anchor a block (loss mask too sparse)
    truncated: int = 0
    tokens: int = 0
    supervised_tokens: int = 0
    sources: list[str] = field(default_factory=list)


def read_samples(path: str | Path) -> Iterator[tuple[records.Where, records.Sample]]:
    """``(where, sample)`` for every record behind ``path`` (a file, a folder of record files or a
    `flashdraft generate` output folder); an unreadable file or row raises :class:`~flashdraft.records.RecordError`."""
    return records.read_samples(path)


def _template_ids(tokenizer, messages, add_generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if hasattr(out, "keys"):  # BatchEncoding / dict
        out = out["input_ids"]
    return list(out)


def _chat_ids(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Whole conversation through the template; assistant turns supervised (prefix-checked)."""
    ids: list[int] = []
    mask: list[int] = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        prefix = _template_ids(tokenizer, messages[:i], add_generation_prompt=True)
        full = _template_ids(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if full[: len(prefix)] != prefix or prefix[: len(ids)] != ids:
            raise TrainError(
                "the chat template does not render conversations as growing prefixes, so assistant turns cannot be "
                "located; give token-level records (token_ids + loss_mask) instead"
            )
        mask += [0] * (len(prefix) - len(ids)) + [1] * (len(full) - len(prefix))
        ids = full
    return ids, mask


def tokenize_record(rec: dict[str, Any], tokenizer, eos_id: int | None, append_eos: bool = True) -> tuple[list[int], list[int]]:
    """One raw record -> (token ids, loss mask), the mask on response tokens only."""
    return tokenize_sample(records.parse_row(rec), tokenizer, eos_id, append_eos)


def tokenize_sample(s: records.Sample, tokenizer, eos_id: int | None, append_eos: bool = True,
                    where: records.Where | str = "record") -> tuple[list[int], list[int]]:
    """One :class:`~flashdraft.records.Sample` -> (token ids, loss mask), the mask on response tokens only."""
    if "token_ids" in s.meta:
        ids = [int(t) for t in s.meta["token_ids"]]
        mask = [int(bool(m)) for m in s.meta.get("loss_mask", [1] * len(ids))]
        if len(mask) != len(ids):
            raise TrainError(f"{where} has {len(ids)} token_ids but {len(mask)} loss_mask entries; they must match")
        return ids, mask
    if tokenizer is None:
        raise TrainError("text records need the target's tokenizer; this target has none, give token_ids + loss_mask records")
    template = getattr(tokenizer, "chat_template", None)
    if s.layout in records.CHAT_LAYOUTS:
        if not template:
            raise TrainError(
                "chat 'messages' records need a chat template and this target's tokenizer has none (a base model); "
                f"give {{prompt, response}} records instead ({where})"
            )
        return _chat_ids(tokenizer, s.messages)
    if s.prompt_only:
        raise TrainError(f"{where} has no answer to learn from (layout {s.layout}); give records with a response, "
                         "output, answer or assistant turn")
    if template:
        return _chat_ids(tokenizer, s.messages)
    answer = next(m["content"] for m in s.messages if m["role"] == "assistant")
    p = list(tokenizer(records.prompt_text(s), add_special_tokens=True)["input_ids"])
    r = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    if append_eos and eos_id is not None:
        r.append(eos_id)
    return p + r, [0] * len(p) + [1] * len(r)


def load_examples(
    paths: list[str | Path], target, max_len: int, block_size: int, append_eos: bool = True,
    domain_field: str = "domain", classify=None,
) -> tuple[list[Example], DataStats]:
    """Tokenise every record; truncate to ``max_len``; skip (and count) sequences shorter than a block
    or without any position that can anchor a block. An example's domain is its record's ``domain_field``;
    where that is missing, ``classify(sample)`` (e.g. :func:`domain_classifier`) names it, when given."""
    tok = getattr(target, "tokenizer", None)
    eos = target.eos_token_ids[0] if getattr(target, "eos_token_ids", None) else None
    vocab = target.vocab_size
    stats = DataStats(sources=[str(p) for p in paths])
    out: list[Example] = []
    for path in paths:
        for where, sample in read_samples(path):
            stats.records += 1
            ids, mask = tokenize_sample(sample, tok, eos, append_eos, where)
            if ids and not 0 <= min(ids) <= max(ids) < vocab:
                raise TrainError(f"{path}: record {stats.records} has token ids outside the target vocabulary 0..{vocab - 1}")
            if len(ids) > max_len:
                ids, mask = ids[:max_len], mask[:max_len]
                stats.truncated += 1
            if len(ids) < block_size:
                stats.skipped_short += 1
                continue
            m = torch.tensor(mask, dtype=torch.bool)
            if not anchor_candidates(m, torch.zeros(len(ids), dtype=torch.long)).any():
                stats.skipped_unsupervised += 1
                continue
            domain = sample.meta.get(domain_field)
            if domain is None and classify is not None:
                domain = classify(sample)
            out.append(Example(ids, mask, index=len(out), domain=None if domain is None else str(domain)))
            stats.kept += 1
            stats.tokens += len(ids)
            stats.supervised_tokens += int(m.sum())
    if not out:
        raise TrainError(
            f"no usable training sequences in {stats.sources} ({stats.records} records: {stats.skipped_short} shorter "
            f"than a block of {block_size}, {stats.skipped_unsupervised} without two consecutive supervised tokens)"
        )
    return out, stats


def domain_classifier():
    """``sample -> domain``: `flashdraft mix`'s default classifier over a record's prompt and response text."""
    from flashdraft.mix.methods import make_classifier
    from flashdraft.mix.records import text_view

    clf = make_classifier()

    def classify(s) -> str | None:
        if not any(m["content"].strip() for m in s.messages):
            return None  # token-only records: no text to judge
        return clf.classify_batch([text_view(s, s.source, s.id)])[0].domain

    return classify


def supervised_spans(e: Example) -> list[list[int]]:
    """The runs of consecutive supervised tokens of ``e`` (what the target says), as lists of ids."""
    spans, cur = [], []
    for t, m in zip(e.token_ids, e.loss_mask):
        if m:
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    return spans + ([cur] if cur else [])


def domain_counts(examples: list[Example], vocab_size: int) -> dict[str, torch.Tensor]:
    """Supervised token counts per example domain (``"all"`` where examples have none) -> domain -> [V]."""
    out: dict[str, torch.Tensor] = {}
    for e in examples:
        ids = torch.tensor([t for t, m in zip(e.token_ids, e.loss_mask) if m], dtype=torch.long)
        c = out.setdefault(e.domain or "all", torch.zeros(vocab_size, dtype=torch.long))
        c += torch.bincount(ids, minlength=vocab_size)
    return out


def corpus_counts(paths: list[str | Path], target, domain_field: str = "domain") -> dict[str, torch.Tensor]:
    """Token counts of every text of a corpus (records of any layout :mod:`flashdraft.records` reads, every
    turn's text, or a plain ``.txt`` file as one text), per the records' ``domain_field`` (else ``corpus``)
    -> domain -> [V]."""
    V = target.vocab_size
    out: dict[str, torch.Tensor] = {}

    def add(domain: str, text: str) -> None:
        ids = torch.tensor(target.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        c = out.setdefault(domain, torch.zeros(V, dtype=torch.long))
        c += torch.bincount(ids, minlength=V)

    if target.tokenizer is None:
        raise TrainError("draft_vocab_corpus needs the target's tokenizer; this target has none")
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise TrainError(f"draft_vocab_corpus {path} does not exist; give JSONL/Parquet records or .txt files")
        if path.suffix == ".txt":
            add("corpus", path.read_text(encoding="utf-8", errors="replace"))
            continue
        for _, s in read_samples(path):
            add(str(s.meta.get(domain_field) or "corpus"), "\n".join(m["content"] for m in s.messages))
    return out


def draft_vocab_for(examples: list[Example], target, size: int, reserve: float = 0.0,
                    corpus: list[str | Path] = (), domain_field: str = "domain") -> torch.Tensor:
    """The draft vocabulary of ``size`` ids: the supervised tokens of the training data per domain (and a
    ``corpus``'s tokens per its domains), a ``reserve`` share split over the domains
    (:func:`~flashdraft.models.draft_vocab.reserved_token_ids`), the target's end-of-turn ids always in
    -> sorted ids [size]."""
    V = target.vocab_size
    counts = domain_counts(examples, V)
    for d, c in (corpus_counts(list(corpus), target, domain_field) if corpus else {}).items():
        counts[d] = counts[d] + c if d in counts else c
    everywhere = torch.bincount(torch.tensor([t for e in examples for t in e.token_ids], dtype=torch.long), minlength=V)
    stops = torch.tensor([t for t in (getattr(target, "eos_token_ids", None) or []) if 0 <= t < V][:size], dtype=torch.long)
    try:
        return reserved_token_ids(counts, size, reserve, always=stops, tie=everywhere)
    except DrafterError as e:
        raise TrainError(str(e)) from None


def coverage_by_domain(t2d: torch.Tensor, examples: list[Example], max_run: int) -> dict[str, dict]:
    """:func:`~flashdraft.models.draft_vocab.vocab_coverage` of ``t2d`` [V] over the supervised spans of
    ``examples``, per domain and over all (``"all"``) -> domain -> {tokens, share, runs}."""
    groups: dict[str, list[list[int]]] = {}
    for e in examples:
        spans = supervised_spans(e)
        groups.setdefault("all", []).extend(spans)
        if e.domain:
            groups.setdefault(e.domain, []).extend(spans)
    return {d: vocab_coverage(t2d, spans, max_run) for d, spans in sorted(groups.items(), key=lambda x: (x[0] != "all", x[0]))}


def collate(rows: list[list[Example]], seeds: list[int], device: torch.device | str = "cpu") -> Batch:
    """Rows of one or more (packed) examples -> a right-padded :class:`Batch`."""
    T = max(sum(len(e.token_ids) for e in row) for row in rows)
    b = len(rows)
    ids = torch.zeros(b, T, dtype=torch.long)
    mask = torch.zeros(b, T, dtype=torch.bool)
    doc = torch.full((b, T), -1, dtype=torch.long)
    pos = torch.zeros(b, T, dtype=torch.long)
    for r, row in enumerate(rows):
        s = 0
        for j, e in enumerate(row):
            n = len(e.token_ids)
            ids[r, s : s + n] = torch.tensor(e.token_ids)
            mask[r, s : s + n] = torch.tensor(e.loss_mask, dtype=torch.bool)
            doc[r, s : s + n] = j
            pos[r, s : s + n] = torch.arange(n)
            s += n
    return Batch(ids.to(device), mask.to(device), doc.to(device), pos.to(device), seeds)


class DataStream:
    """Endless seeded micro-batches over epochs; the position (epoch, cursor) is saved and restored.

    The order is a permutation per epoch drawn from (seed, epoch); the anchor seed of a row comes
    from (seed, epoch, example index), so anchors are re-drawn every epoch and do not depend on how
    examples are grouped into micro-batches, steps or ranks.
    """

    def __init__(self, examples: list[Example], batch_size: int, seed: int, pack: bool = False, max_len: int = 0):
        if pack and max_len <= 0:
            raise TrainError("packing needs max_len > 0")
        self.examples, self.batch_size, self.seed = examples, batch_size, seed
        self.pack, self.max_len = pack, max_len
        self.epoch, self.cursor = 0, 0
        self.last_rows: list[list[Example]] = []

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(len(self.examples))

    def _take(self) -> Example:
        if self.cursor >= len(self.examples):
            self.epoch, self.cursor = self.epoch + 1, 0
        e = self.examples[int(self._order()[self.cursor])]
        self.cursor += 1
        return e

    def _seed(self, e: Example) -> int:
        return int(np.random.SeedSequence([self.seed, self.epoch, e.index]).generate_state(1)[0])

    def next_batch(self, device: torch.device | str = "cpu") -> Batch:
        rows, seeds = [], []
        for _ in range(self.batch_size):
            e = self._take()
            row, seed = [e], self._seed(e)
            if self.pack:  # greedily add the next examples while they fit (order unchanged)
                while True:
                    if self.cursor >= len(self.examples):
                        break
                    nxt = self.examples[int(self._order()[self.cursor])]
                    if sum(len(x.token_ids) for x in row) + len(nxt.token_ids) > self.max_len:
                        break
                    row.append(self._take())
            rows.append(row)
            seeds.append(seed)
        self.last_rows = rows  # the examples of this batch, row by row (offline features are looked up by them)
        return collate(rows, seeds, device)

    @property
    def epoch_float(self) -> float:
        return self.epoch + self.cursor / len(self.examples)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "n_examples": len(self.examples), "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["n_examples"] != len(self.examples):
            raise TrainError(
                f"checkpoint was taken on {state['n_examples']} training sequences, the data now gives "
                f"{len(self.examples)}; resume with the same data files and max_len/block_size"
            )
        self.epoch, self.cursor = state["epoch"], state["cursor"]
