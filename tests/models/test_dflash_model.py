"""The DFlash drafter: z-lab file format, bit-identical reload, fit checks against the target."""

import json

import pytest
import torch
from safetensors import safe_open

from flashdraft.models.dflash import DFlashConfig, DFlashDrafter, DrafterError
from flashdraft.models.target import TargetError
from tests.tiny import MASK_ID, random_prompts, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


def test_save_reload_bit_identical(target, tmp_path):
    d = DFlashDrafter.for_target(target, num_layers=2, block_size=8, mask_token_id=MASK_ID, seed=1)
    d.save_pretrained(tmp_path / "drafter")
    e = DFlashDrafter.from_pretrained(tmp_path / "drafter", target)
    sd, se = d.state_dict(), e.state_dict()
    assert sd.keys() == se.keys() and all(torch.equal(sd[k], se[k]) for k in sd)
    toks = torch.tensor(random_prompts(1, 12)[0])
    feats = torch.randn(11, len(d.target_layer_ids) * target.hidden_size)
    d.reset(), e.reset()
    assert torch.equal(d.propose(toks, feats), e.propose(toks, feats))


def test_files_carry_zlab_fields_and_names(target, tmp_path):
    d = DFlashDrafter.for_target(target, num_layers=2, block_size=8, mask_token_id=MASK_ID)
    d.save_pretrained(tmp_path / "drafter")
    cfg = json.loads((tmp_path / "drafter" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 8
    assert cfg["dflash_config"] == {"mask_token_id": MASK_ID, "target_layer_ids": target.default_layer_ids(2)}
    assert cfg["num_target_layers"] == target.num_layers and cfg["num_hidden_layers"] == 2
    assert cfg["layer_types"] == ["full_attention"] * 2
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"):
        assert k in cfg
    with safe_open(str(tmp_path / "drafter" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.1.mlp.down_proj.weight", "layers.0.self_attn.k_norm.weight"} <= names
    assert not any("embed" in n or n.startswith("lm_head") for n in names)  # borrowed from the target, never saved
    assert d.fc.weight.shape == (target.hidden_size, 2 * target.hidden_size)


def test_drafter_for_another_target_is_refused(target, tmp_path):
    DFlashDrafter.for_target(target, num_layers=1, mask_token_id=MASK_ID).save_pretrained(tmp_path / "d")
    wider = tiny_target("qwen3", hidden_size=48)
    with pytest.raises(DrafterError, match=r"hidden_size 32 .* target tiny-qwen3 hidden_size 48"):
        DFlashDrafter.from_pretrained(tmp_path / "d", wider)
    other_vocab = tiny_target("qwen3", vocab_size=128)
    with pytest.raises(DrafterError, match=r"vocab_size 96 does not match .* 128"):
        DFlashDrafter.from_pretrained(tmp_path / "d", other_vocab)
    deeper = tiny_target("qwen3", num_hidden_layers=8)
    with pytest.raises(DrafterError, match=r"6 layers, target tiny-qwen3 has 8"):
        DFlashDrafter.from_pretrained(tmp_path / "d", deeper)


def test_last_layer_and_bad_ids_are_refused(target):
    with pytest.raises(TargetError, match="last layer 5"):
        DFlashDrafter.for_target(target, target_layer_ids=[1, 5], mask_token_id=MASK_ID)
    with pytest.raises(TargetError, match="outside"):
        DFlashDrafter.for_target(target, target_layer_ids=[1, 9], mask_token_id=MASK_ID)


def test_mask_token_must_exist(target):
    with pytest.raises(TargetError, match="no mask token"):
        DFlashDrafter.for_target(target)  # tiny target: no tokenizer, so no <mask> to find
    with pytest.raises(DrafterError, match="mask_token_id 500 is not a row"):
        DFlashDrafter.for_target(target, mask_token_id=500)


def test_unbound_drafter_refuses_to_run(target, tmp_path):
    DFlashDrafter.for_target(target, mask_token_id=MASK_ID).save_pretrained(tmp_path / "d")
    d = DFlashDrafter.from_pretrained(tmp_path / "d")
    with pytest.raises(DrafterError, match="not bound to a target"):
        d.propose(torch.tensor([1, 2, 3]), torch.randn(2, target.hidden_size))


def test_config_validation():
    base = dict(dflash_config={"mask_token_id": 1, "target_layer_ids": [1]}, num_target_layers=4, target_hidden_size=8,
                hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=4, vocab_size=10)
    assert DFlashConfig(**base).layer_types == ["full_attention"] * 2
    with pytest.raises(ValueError, match="layer_types has 1 entries for 2 layers"):
        DFlashConfig(**base, layer_types=["full_attention"])
    with pytest.raises(ValueError, match="sliding_window is not set"):
        DFlashConfig(**base, layer_types=["sliding_attention", "full_attention"])


def test_reduced_draft_vocabulary_maps_to_target_ids(target, tmp_path):
    cfg = DFlashDrafter.for_target(target, mask_token_id=MASK_ID).cfg.model_copy(update={"draft_vocab_size": 5})
    d = DFlashDrafter(cfg)
    d.d2t.copy_(torch.tensor([3, 3, 10, 20, 40]))  # draft id i -> target id i + d2t[i]: 3, 4, 12, 23, 44
    d.bind(target)
    logits = d.logits(torch.randn(2, target.hidden_size))
    finite = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert finite == [3, 4, 12, 23, 44]
    d.save_pretrained(tmp_path / "small")
    e = DFlashDrafter.from_pretrained(tmp_path / "small", target)
    assert torch.equal(e.d2t, d.d2t) and torch.equal(e.lm_head.weight, d.lm_head.weight)


def test_draft_vocabulary_scores_build_the_trees_the_full_logits_build(target):
    """Decoders read a draft-vocabulary drafter's logits over its own ids (propose_scores): the same numbers as
    propose's target-vocabulary logits, so DFlash's chain and DDTree's tree are the ones the full logits give,
    and decoding with them stays lossless."""
    from flashdraft.decode import build_decoder
    from flashdraft.decode.tree import argmax_chain, best_first_tree
    from flashdraft.models.drafter import propose_scores
    from tests.lossless import assert_same_tokens
    from tests.tiny import hf_greedy

    vocab_ids = torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(0))[:40].sort().values
    d = DFlashDrafter.for_target(target, block_size=6, mask_token_id=MASK_ID, seed=2, draft_vocab=vocab_ids)
    toks = torch.tensor(random_prompts(1, 12)[0])
    feats = torch.randn(11, len(d.target_layer_ids) * target.hidden_size)
    d.reset()
    full = d.propose(toks, feats)  # [5, vocab]
    d.reset()
    small, ids = propose_scores(d, toks, feats)  # [5, 40], [40]
    assert torch.equal(ids, vocab_ids) and small.shape == (5, 40)
    assert torch.equal(full[:, ids], small) and torch.isinf(full).sum() == 5 * (target.vocab_size - 40)
    assert argmax_chain(3, small, ids).tokens == argmax_chain(3, full).tokens
    a = best_first_tree(3, torch.log_softmax(small, -1), 12, ids)
    b = best_first_tree(3, torch.log_softmax(full, -1), 12)
    assert (a.tokens, a.parents) == (b.tokens, b.parents) and a.scores == pytest.approx(b.scores, abs=1e-5)
    assert set(a.tokens[1:]) <= set(vocab_ids.tolist())
    for method in ("dflash", "ddtree"):
        for p in random_prompts(2, 10, seed=4):
            got = build_decoder(method, target, d, budget=8).generate(p, 20).tokens
            assert_same_tokens(target, p, got, hf_greedy(target, p, 20), f"{method}/draft vocabulary")


def test_grow_layers_drafts_exactly_as_before_until_trained(target):
    d = DFlashDrafter.for_target(target, num_layers=1, block_size=8, mask_token_id=MASK_ID, seed=3)
    d.set_feature_scale(torch.rand(d.fc.in_features) + 0.5)  # the scale is not in the state dict: it must carry over
    g = d.grow_layers(3)
    assert len(g.layers) == 3 and g.cfg.num_hidden_layers == 3 and g.cfg.layer_types == ["full_attention"] * 3
    assert all(torch.equal(a, b) for a, b in zip(d.layers[0].parameters(), g.layers[0].parameters()))
    assert all(float(layer.self_attn.q_proj.weight.detach().abs().sum()) > 0 for layer in g.layers[1:])  # trainable, not dead
    toks = torch.tensor(random_prompts(1, 12)[0])
    feats = torch.randn(11, d.fc.in_features)
    d.reset(), g.reset()
    assert torch.equal(d.propose(toks, feats), g.propose(toks, feats))
    with torch.no_grad():
        g.layers[2].mlp.down_proj.weight.normal_()
    d.reset(), g.reset()
    assert not torch.equal(d.propose(toks, feats), g.propose(toks, feats))  # the added layer is in the path
    with pytest.raises(DrafterError, match="cannot grow a 3-layer drafter to 2 layers"):
        g.grow_layers(2)
