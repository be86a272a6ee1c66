"""A second drafter family plugs in through the public registries alone.

``ToyLinearDrafter`` (architecture ``ToyLinearDraft``) reads the target feature of the last
committed position and maps it with one linear layer to ``depth`` rows of logits over a reduced
draft vocabulary (:class:`~flashdraft.models.draft_vocab.DraftVocab`). It is registered with
``register_drafter``, saved and loaded through config.json + safetensors and ``load_drafter``,
decodes losslessly with the chain and tree decoders and trains through the objective registry and
the :class:`~flashdraft.train.loop.Trainer`, without a line of decode/, train/loop.py or bench/ naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from flashdraft.decode import build_decoder
from flashdraft.models.draft_vocab import DraftVocab, top_token_ids
from flashdraft.models.drafter import Drafter, DrafterError, drafter_families, load_drafter, register_drafter
from flashdraft.train.config import TrainConfig
from flashdraft.train.loop import Trainer
from flashdraft.train.objectives import OBJECTIVES, pair, register_objective
from tests.lossless import assert_same_tokens
from tests.tiny import MASK_ID, random_prompts, tiny_target
from tests.train.test_loop import write_data

LAYERS = [1, 3]
DEPTH = 3


@register_drafter("ToyLinearDraft")
class ToyLinearDrafter(nn.Module):
    """feature of the last committed position [K * H] -> logits [depth, vocab] through a draft vocabulary."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(len(cfg["target_layer_ids"]) * cfg["target_hidden_size"], cfg["depth"] * cfg["draft_vocab_size"])
        self.vocab = DraftVocab(self, cfg["vocab_size"], cfg["draft_vocab_size"])
        self._last: torch.Tensor | None = None

    @classmethod
    def for_target(cls, target, layer_ids: list[int], depth: int, token_ids: torch.Tensor) -> "ToyLinearDrafter":
        cfg = {"architectures": ["ToyLinearDraft"], "target_layer_ids": list(layer_ids), "depth": depth,
               "target_hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
               "draft_vocab_size": int(token_ids.numel())}
        torch.manual_seed(0)
        d = cls(cfg)
        d.vocab.set(token_ids)
        return d

    @property
    def target_layer_ids(self) -> list[int]:
        return self.cfg["target_layer_ids"]

    @property
    def max_depth(self) -> int:
        return self.cfg["depth"]

    def reset(self) -> None:
        self._last = None

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., K * H] -> draft-vocabulary logits [..., depth, draft_vocab]."""
        return self.proj(features.to(self.proj.weight.dtype)).unflatten(-1, (self.max_depth, -1))

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, new_features: torch.Tensor | None) -> torch.Tensor:
        if new_features is not None and new_features.shape[0]:
            self._last = new_features[-1]
        return self.vocab.to_target_logits(self.draft_logits(self._last).float())  # [depth, vocab]

    def save_pretrained(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.cfg))
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(path / "model.safetensors"))
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, target=None) -> "ToyLinearDrafter":
        d = cls(json.loads((Path(path) / "config.json").read_text()))
        d.load_state_dict(load_file(str(Path(path) / "model.safetensors")))
        if target is not None:
            if d.cfg["vocab_size"] != target.vocab_size:
                raise DrafterError(f"toy drafter vocab_size {d.cfg['vocab_size']} does not match target {target.vocab_size}")
            d.to(device=target.device, dtype=target.dtype)
        return d


@dataclass
class ToyBlocks:
    labels: torch.Tensor  # [b, T, depth]: token at t + 1 + k
    weights: torch.Tensor  # [b, T, depth]: 1 where supervised, same document and in the draft vocabulary
    norm: float


@dataclass
class ToyOutput:
    loss: torch.Tensor
    loss_sum: float


@register_objective("toy_linear")
class ToyLinearObjective:
    """CE of the draft rows read from position t against the tokens t + 1 .. t + depth."""

    eval_method = "dflash"  # its rows are a block of marginals: the chain decoder takes their argmax

    def __init__(self, drafter: ToyLinearDrafter):
        self.drafter = drafter

    @classmethod
    def wants_final(cls, cfg: TrainConfig) -> bool:
        return False  # CE on the data tokens: no teacher

    @classmethod
    def feature_layer_ids(cls, target, cfg: TrainConfig) -> list[int]:
        return list(cfg.target_layer_ids)

    @classmethod
    def new_drafter(cls, target, cfg: TrainConfig, examples):
        ids = torch.tensor([t for e in examples for t in e.token_ids])
        counts = torch.bincount(ids, minlength=target.vocab_size)  # [V]
        vocab = top_token_ids(counts, counts, cfg.draft_vocab_size or target.vocab_size)
        return ToyLinearDrafter.for_target(target, cfg.target_layer_ids, cfg.block_size - 1, vocab)

    @classmethod
    def from_config(cls, drafter, cfg: TrainConfig, attention: str = "sdpa"):
        return cls(drafter)

    def blocks(self, batch) -> ToyBlocks:
        T, depth = batch.input_ids.shape[1], self.drafter.max_depth
        src = torch.arange(T)[:, None] + 1 + torch.arange(depth)  # [T, depth]
        ok = src < T
        src = src.clamp(max=T - 1)
        labels = batch.input_ids[:, src]  # [b, T, depth]
        same = batch.doc_ids[:, src] == batch.doc_ids[:, :, None]
        w = (ok & same & batch.loss_mask[:, src] & (batch.doc_ids[:, :, None] >= 0) & self.drafter.t2d[labels]).float()
        return ToyBlocks(labels, w, float(w.sum()))

    def __call__(self, batch, blocks: ToyBlocks, normaliser: float, features=None, final_h=None, seed=None) -> ToyOutput:
        if features is None:
            raise ValueError("the toy objective reads the features the trainer passes; it runs no target itself")
        logits = self.drafter.draft_logits(features).float()  # [b, T, depth, Vd]
        draft_labels = self.drafter.vocab.index()[blocks.labels].clamp(min=0)  # [b, T, depth]
        ce = F.cross_entropy(logits.flatten(0, 2), draft_labels.flatten(), reduction="none").view_as(blocks.weights)
        total = (ce * blocks.weights).sum()
        return ToyOutput(total / max(normaliser, 1e-12), float(total.detach()))

    def metrics(self, out: ToyOutput, batch, blocks: ToyBlocks) -> dict[str, torch.Tensor]:
        return {"loss": pair(out.loss_sum, blocks.norm), "tokens": pair(batch.num_tokens, 1)}

    def summary(self, sums: dict[str, torch.Tensor], normaliser: float) -> dict:
        return {"loss": float(sums["loss"][0]) / max(normaliser, 1e-12), "tokens": int(sums["tokens"][0])}


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


def test_registered_family_satisfies_the_protocol_and_round_trips(tmp_path, target):
    assert "ToyLinearDraft" in drafter_families() and "DFlashDraftModel" in drafter_families()
    assert "toy_linear" in OBJECTIVES and "dflash" in OBJECTIVES
    d = ToyLinearDrafter.for_target(target, LAYERS, DEPTH, torch.arange(0, 96, 2))
    assert isinstance(d, Drafter)
    back = load_drafter(d.save_pretrained(tmp_path / "toy"), target)
    assert type(back) is ToyLinearDrafter
    for (k, a), b in zip(d.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), k
    assert set(load_file(str(tmp_path / "toy" / "model.safetensors"))) == {"proj.weight", "proj.bias", "d2t", "t2d"}


def test_unknown_architecture_names_the_known_ones(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text(json.dumps({"architectures": ["NoSuchDraft"]}))
    with pytest.raises(DrafterError, match="NoSuchDraft.*DFlashDraftModel"):
        load_drafter(tmp_path / "x")


@pytest.mark.parametrize("method,budget", [("dflash", None), ("ddtree", 6)])
def test_toy_family_decodes_losslessly(tmp_path, target, method, budget):
    d = ToyLinearDrafter.for_target(target, LAYERS, DEPTH, torch.arange(MASK_ID))
    d = load_drafter(d.save_pretrained(tmp_path / "toy"), target)
    dec, ar = build_decoder(method, target, d, budget=budget), build_decoder("ar", target)
    for p in random_prompts(3, 12, seed=5):
        res = dec.generate(p, 24)
        assert_same_tokens(target, p, res.tokens, ar.generate(p, 24).tokens, f"toy/{method}")
        assert res.stats.max_depth == DEPTH and res.stats.rounds >= 1


def test_toy_family_trains_through_the_trainer(tmp_path, target):
    data = write_data(tmp_path / "train.jsonl", n=4)
    cfg = TrainConfig(target="tiny", data=[str(data)], out_dir=str(tmp_path / "run"), objective="toy_linear",
                      block_size=DEPTH + 1, target_layer_ids=LAYERS, draft_vocab_size=48, feature_norm="none",
                      max_len=64, batch_size=2, max_steps=2, lr=1e-2, warmup_ratio=0.0, progress=False,
                      tensorboard=False)
    trainer = Trainer(cfg, target=target)
    before = trainer.drafter.proj.weight.detach().clone()
    res = trainer.run()
    assert res.stopped == "done" and sorted(res.losses) == [1, 2]
    assert all(torch.isfinite(torch.tensor(v)) for v in res.losses.values())
    assert not torch.equal(before, trainer.drafter.proj.weight)  # one optimiser step moved the weights
    saved = load_drafter(res.final_drafter, target)
    assert type(saved) is ToyLinearDrafter and int(saved.t2d.sum()) == 48
    rec = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in rec if r.get("kind") == "train"] == [res.losses[1], res.losses[2]]


def test_unknown_objective_is_refused():
    with pytest.raises(ValueError, match="unknown objective 'nope'.*dflash"):
        TrainConfig(objective="nope")
