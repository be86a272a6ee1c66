"""The draft vocabulary per domain: drawn with a reserve per domain and a corpus, its coverage reported by train."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from flashdraft.models.draft_vocab import reserved_token_ids
from flashdraft.train.data import Example, corpus_counts, coverage_by_domain, draft_vocab_for, load_examples
from flashdraft.train.loop import Trainer
from tests.tiny import VOCAB, hf_greedy, random_prompts, tiny_target

from .test_loop import make_cfg


def test_coverage_per_domain_worked_out_by_hand():
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[[1, 2, 3]] = True
    ex = [Example([9, 1, 2, 5, 3], [0, 1, 1, 1, 1], 0, "math"),  # supervised 1 2 5 3: 3 of 4 inside
          Example([8, 3, 3, 8, 1, 1], [1, 1, 1, 0, 1, 1], 1, "coding"),  # spans [8 3 3] and [1 1]: 4 of 5 inside
          Example([2, 2], [1, 1], 2, None)]  # no domain: counted in "all" only
    cov = coverage_by_domain(t2d, ex, max_run=3)
    assert list(cov) == ["all", "coding", "math"]
    assert cov["math"]["tokens"] == 4 and cov["math"]["share"] == 3 / 4
    # math runs of 2: (1,2) (2,5) (5,3) -> 1 of 3; runs of 3: (1,2,5) (2,5,3) -> 0 of 2
    assert cov["math"]["runs"] == [3 / 4, 1 / 3, 0.0]
    # coding: runs of 2 inside a span: (8,3) (3,3) (1,1) -> 2 of 3; runs of 3: (8,3,3) -> 0 of 1 (none cross spans)
    assert cov["coding"]["share"] == 4 / 5 and cov["coding"]["runs"] == [4 / 5, 2 / 3, 0.0]
    assert cov["all"]["tokens"] == 11 and cov["all"]["share"] == 9 / 11


def test_a_reserve_keeps_a_minority_domain_in_the_vocabulary():
    big = torch.zeros(VOCAB, dtype=torch.long)
    big[10:20] = torch.arange(100, 90, -1)  # ten frequent ids
    small = torch.zeros(VOCAB, dtype=torch.long)
    small[[50, 51]] = 3  # a minority domain's own ids, rarer than all of the majority's
    counts = {"coding": big, "translation": small}
    assert reserved_token_ids(counts, 8).tolist() == list(range(10, 18))
    with_reserve = reserved_token_ids(counts, 8, reserve=0.5).tolist()  # 2 ids a domain reserved
    assert with_reserve == [10, 11, 12, 13, 14, 15, 50, 51]
    assert reserved_token_ids(counts, 8, reserve=0.5, always=torch.tensor([90])).tolist() == [10, 11, 12, 13, 14, 50, 51, 90]


def fake_tokenizer_target():
    """A target whose tokenizer maps each character to one id (enough to count a corpus by hand)."""
    tok = lambda text, add_special_tokens=False: {"input_ids": [ord(c) % VOCAB for c in text]}  # noqa: E731
    return SimpleNamespace(vocab_size=VOCAB, eos_token_ids=[], tokenizer=tok)


def test_a_corpus_counts_per_domain_and_joins_the_draw(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"prompt": "ab", "response": "bb", "domain": "translation"}) + "\n")
    (tmp_path / "t.txt").write_text("ccc")
    target = fake_tokenizer_target()
    counts = corpus_counts([tmp_path / "c.jsonl", tmp_path / "t.txt"], target)
    a, b, c = (ord(x) % VOCAB for x in "abc")
    assert counts["translation"][b] == 3 and counts["translation"][a] == 1 and counts["corpus"][c] == 3
    ex = [Example([5, 6, 6], [0, 1, 1], 0, "coding")]
    assert draft_vocab_for(ex, target, 2).tolist() == [5, 6]  # no corpus: the data's tokens
    assert draft_vocab_for(ex, target, 3, reserve=1.0, corpus=[tmp_path / "c.jsonl", tmp_path / "t.txt"]).tolist() \
        == sorted([6, b, c])  # one id reserved for each of coding, corpus and translation


def domain_data(path):
    """Token records of two domains named in the ``domain`` field (as `flashdraft mix rebalance` writes it)."""
    target = tiny_target("qwen3")
    with open(path, "w") as f:
        for i, p in enumerate(random_prompts(8, 6, seed=4)):
            resp = hf_greedy(target, p, 18)
            f.write(json.dumps({"token_ids": p + resp, "loss_mask": [0] * len(p) + [1] * len(resp),
                                "domain": "coding" if i % 2 else "math"}) + "\n")
    return path


def test_train_prints_and_saves_the_coverage_per_domain(tmp_path):
    data = domain_data(tmp_path / "d.jsonl")
    cfg = make_cfg(tmp_path, data, draft_vocab_size=24, max_steps=2, holdout=0.25, holdout_walk=0)
    trainer = Trainer(cfg, target=tiny_target("qwen3"))
    trainer.run()
    saved = json.loads((tmp_path / "run" / "vocab_coverage.json").read_text())
    assert saved == json.loads((tmp_path / "run" / "drafter" / "vocab_coverage.json").read_text())
    assert set(saved) == {"train", "heldout"} and set(saved["train"]) == {"all", "coding", "math"}
    inside = set(trainer.drafter.draft_token_ids().tolist())
    for domain in ("coding", "math"):  # the share, counted here token by token
        toks = [t for e in trainer.examples if e.domain == domain for t, m in zip(e.token_ids, e.loss_mask) if m]
        assert saved["train"][domain]["tokens"] == len(toks)
        assert saved["train"][domain]["share"] == sum(t in inside for t in toks) / len(toks)
    logged = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "vocab_coverage" for r in logged)


def test_records_without_a_domain_field_are_labelled_by_the_classifier(tmp_path):
    rows = [{"prompt": "Write a Python function that reverses a list.",
             "response": "```python\ndef rev(xs):\n    return xs[::-1]\n```"},
            {"prompt": "What is 12 * 7 + 3?", "response": "12 * 7 = 84, and 84 + 3 = 87. The answer is 87.",
             "domain": "math"}]
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    target = fake_tokenizer_target()
    from flashdraft.train.data import domain_classifier

    ex, _ = load_examples([tmp_path / "r.jsonl"], target, 512, 4, classify=domain_classifier())
    assert [e.domain for e in ex] == ["coding", "math"]


def sized_target(vocab: int, hidden: int, body: int):
    """A target with ``body`` decoder parameters besides its embedding (as head_share counts them)."""
    decoder = torch.nn.Module()
    decoder.embed_tokens = torch.nn.Embedding(1, 1)
    decoder.body = torch.nn.Parameter(torch.empty(body, device="meta"))  # counted, never allocated
    return SimpleNamespace(vocab_size=vocab, hidden_size=hidden, model=SimpleNamespace(get_decoder=lambda: decoder))


def test_auto_draft_vocab_size_follows_the_heads_share_of_a_verify_round():
    from flashdraft.models.draft_vocab import AUTO_HEAD_SHARE, auto_draft_vocab_size, head_share

    big = sized_target(128_256, 8192, 69_000_000_000)  # a 70B-class target: its whole head is cheap next to the body
    # (B-1) * V * d / (B * (body + V * d)) worked out by hand for B = 16
    assert abs(head_share(big, 128_256, 16) - 15 * 128_256 * 8192 / (16 * (69e9 + 128_256 * 8192))) < 1e-12
    assert head_share(big, 128_256, 16) < AUTO_HEAD_SHARE and auto_draft_vocab_size(big, 16) is None
    small = sized_target(262_144, 640, 100_000_000)  # a 270M target whose 262k head is most of its compute
    size = auto_draft_vocab_size(small, 16)
    assert size < 262_144 and head_share(small, size, 16) <= AUTO_HEAD_SHARE
    assert size == 8192 or head_share(small, 2 * size, 16) > AUTO_HEAD_SHARE  # the largest that fits
    tiny_body = sized_target(262_144, 640, 1)  # nothing fits: the smallest size
    assert auto_draft_vocab_size(tiny_body, 16) == 8192


def test_train_resolves_auto_for_its_target(tmp_path):
    from flashdraft.train.config import TrainConfig

    target = tiny_target("qwen3")  # 96 ids: fewer than the smallest reduced size, so its own head over all
    assert TrainConfig(draft_vocab_size="auto").resolved_draft_vocab_size(target) is None
    assert TrainConfig(draft_vocab_size=40).resolved_draft_vocab_size(target) == 40
