"""The feature scale fix: on a tiny target whose features carry an injected massive-activation
channel, a drafter learns a copy task (which only the context can solve) with feature_norm
'channel' and fails to without it; the held-out diagnostics say so."""

from __future__ import annotations

import pytest
import torch

from flashdraft.models.dflash import DFlashDrafter
from flashdraft.train.config import TrainConfig
from flashdraft.train.data import Example
from flashdraft.train.loop import Trainer
from tests.tiny import MASK_ID, VOCAB, tiny_target

PAIRS, LAYER, CHANNEL, MASSIVE = 12, 1, 5, 20.0


def massive_target():
    """Tiny Qwen3 whose layer-1 output (a drafter feature) gets channel 5 raised by ~20 (150x the other channels RMS) at every position."""
    target = tiny_target("qwen3", seed=1, hidden_size=64, tie_word_embeddings=True, initializer_range=0.05)

    def hook(_m, _inp, out):
        h = out[0] if isinstance(out, tuple) else out
        h = h.clone()
        h[..., CHANNEL] += MASSIVE * (1 + 0.05 * torch.sin(torch.arange(h.shape[-2], dtype=h.dtype)))
        return (h, *out[1:]) if isinstance(out, tuple) else h

    target.model.get_decoder().layers[LAYER].register_forward_hook(hook)
    return target


def copy_examples(n: int, seed: int = 0) -> list[Example]:
    """[c, r1, c, r2, c, ...]: a key token c (random per sequence) after every random token r_i.

    After an r_i the next token is c, which only the context tells (r_i is fresh, and c differs
    from sequence to sequence, so no bigram knows it): half the slot-1 labels need the context."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        c = int(torch.randint(0, VOCAB - 1, (1,), generator=g))
        rs = torch.randint(0, VOCAB - 1, (PAIRS,), generator=g).tolist()
        ids = [c] + [t for r in rs for t in (r, c)]
        out.append(Example(token_ids=ids, loss_mask=[0, 0] + [1] * (len(ids) - 2), index=i))
    return out


def train(tmp_path, feature_norm: str):
    cfg = TrainConfig(
        target="tiny", out_dir=str(tmp_path / feature_norm), num_layers=1, block_size=4, target_layer_ids=[LAYER],
        mask_token_id=MASK_ID, max_len=64, max_anchors=8, batch_size=8, max_steps=200, lr=3e-3, warmup_ratio=0.05,
        save_every=1000, progress=False, tensorboard=False, feature_norm=feature_norm, holdout=0.2, seed=0,
    )
    trainer = Trainer(cfg, target=massive_target(), examples=copy_examples(200))
    return trainer, trainer.run()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("massive")
    return {mode: train(tmp, mode) for mode in ("channel", "none")}


def report(runs, mode: str) -> dict:
    return runs[mode][1].heldout["drafter"]  # the one unnamed variant


def test_the_features_carry_a_massive_channel(runs):
    trainer, _ = runs["channel"]
    (stats,) = trainer.feature_stats
    assert stats["top_channels"][0] == CHANNEL and stats["top1_share"] > 0.99


def test_channel_scale_learns_the_copy_task_and_none_does_not(runs):
    fixed = report(runs, "channel")["drafter"]
    broken = report(runs, "none")["drafter"]
    # half the slot-1 labels are predictable (c after r_i); a drafter without the massive channel reaches
    # ~0.27 in these steps, with it and the channel scale ~0.25, with it and no scale ~0.09
    assert fixed["acc_per_slot"][0] > 0.18, fixed
    assert broken["acc_per_slot"][0] < 0.13, broken
    assert fixed["acc_per_slot"][0] > 2 * broken["acc_per_slot"][0]


def test_the_fixed_drafter_reads_the_target_and_the_diagnostics_say_so(runs):
    rep = report(runs, "channel")
    assert rep["context_shuffled"]["acc_per_slot"][0] < 0.5 * rep["drafter"]["acc_per_slot"][0]
    assert rep["context_zeroed"]["acc_per_slot"][0] < 0.5 * rep["drafter"]["acc_per_slot"][0]
    assert not rep["ignores_context"]
    assert rep["bigram"]["acc_per_slot"][0] < 0.15  # c differs per sequence: no bigram knows it


def test_the_saved_drafter_folds_the_scale_into_fc(runs, tmp_path):
    trainer, res = runs["channel"]
    d = trainer.drafter
    loaded = DFlashDrafter.from_pretrained(res.final_drafter, trainer.target)
    assert bool((loaded.feature_scale == 1).all())  # z-lab format: nothing but fc.weight carries the scale
    torch.manual_seed(0)
    f = torch.randn(5, d.fc.in_features) * 10
    torch.testing.assert_close(loaded.fuse(f), d.fuse(f), rtol=1e-4, atol=1e-4)
