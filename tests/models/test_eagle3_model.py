"""The EAGLE-3 drafter: the training-time test sees exactly what inference feeds each draft step;
vLLM's file format; bit-identical reload through the drafter registry; fit checks."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

from flashdraft.models.drafter import DrafterError, load_drafter
from flashdraft.models.eagle3 import Eagle3Config, Eagle3Drafter, eagle_layer_ids
from flashdraft.models.forward import target_pass
from tests.tiny import random_prompts, tiny_target

STEPS = 4


class Recorder:
    """Records every call of the layer's qkv and finish (inputs and outputs)."""

    def __init__(self, layer):
        self.qkv, self.finish = [], []
        q0, f0 = layer.qkv, layer.finish

        def qkv(emb, hidden, cos, sin):
            out = q0(emb, hidden, cos, sin)
            self.qkv.append(dict(emb=emb, hidden=hidden, cos=cos, sin=sin, q=out[0], k=out[1], v=out[2]))
            return out

        def finish(attn, hidden):
            out = f0(attn, hidden)
            self.finish.append(dict(attn=attn, out=out))
            return out

        layer.qkv, layer.finish = qkv, finish


def close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "llama"])
def test_training_time_test_equals_inference_step_by_step(family):
    target = tiny_target(family)
    d = Eagle3Drafter.for_target(target, draft_vocab=torch.arange(0, target.vocab_size, 3), seed=5)
    g = torch.Generator().manual_seed(0)
    d.set_feature_scale(torch.rand(d.fc.in_features, generator=g) + 0.5, keep_function=False)
    d.eval()
    tokens = torch.tensor(random_prompts(1, 14, seed=7)[0])  # committed ids, the bonus last
    start = tokens.shape[0] - 1
    one = lambda ids: SimpleNamespace(input_ids=ids[None], doc_ids=torch.zeros_like(ids)[None],
                                      positions=torch.arange(ids.shape[0])[None])
    feats = target_pass(target, one(tokens), d.target_layer_ids, False)[0][0]  # [start + 1, K * H]

    rec_i = Recorder(d.midlayer)
    logits = d.propose(tokens, feats[:start], depth=STEPS)  # [STEPS, V]
    drafts = logits.argmax(-1)[: STEPS - 1]
    inf_q, inf_f = list(rec_i.qkv), list(rec_i.finish)  # ingest, then one call per chain step
    assert len(inf_q) == len(inf_f) == STEPS

    # training rows: another packed document first, then ours teacher-forced with the chain's own argmax tokens
    other = torch.tensor(random_prompts(1, 6, seed=8)[0])
    ours = torch.cat([tokens, drafts])  # [start + STEPS]
    ids = torch.cat([other, ours])[None]
    doc = torch.cat([torch.zeros(6, dtype=torch.long), torch.ones(ours.shape[0], dtype=torch.long)])[None]
    pos = torch.cat([torch.arange(6), torch.arange(ours.shape[0])])[None]
    batch = SimpleNamespace(input_ids=ids, doc_ids=doc, positions=pos)
    tfeats = target_pass(target, batch, d.target_layer_ids, False)[0]  # [1, T, K * H]
    rec_t = Recorder(d.midlayer)  # records the training calls
    with torch.no_grad():
        out = d.ttt_hidden(tfeats, ids, doc, pos, STEPS)  # [STEPS, 1, T, d]
    i = 6 + start - 1  # the row whose context ends where inference's does
    ctx = slice(6, i + 1)  # our document's step-0 entries up to i

    # the context entries: inference's cache == training step-0 keys/values of positions <= i (same document)
    close(inf_q[0]["k"][0], rec_t.qkv[0]["k"][0][:, ctx], "context keys")
    close(inf_q[0]["v"][0], rec_t.qkv[0]["v"][0][:, ctx], "context values")
    for k in range(STEPS):
        a, b = inf_q[k], rec_t.qkv[k]
        r = -1 if k == 0 else 0  # inference: the last ingested row (step 0) or the one chain node
        close(a["emb"][0, r], b["emb"][0, i], f"step {k} token embedding")
        close(a["hidden"][0, r], b["hidden"][0, i], f"step {k} hidden input")
        close(a["cos"][0, r], b["cos"][0, i], f"step {k} position (cos)")
        close(a["sin"][0, r], b["sin"][0, i], f"step {k} position (sin)")
        close(a["k"][0, :, r], b["k"][0, :, i], f"step {k} key")
        close(a["v"][0, :, r], b["v"][0, :, i], f"step {k} value")
        close(inf_f[k]["attn"][0, :, r], rec_t.finish[k]["attn"][0, :, i], f"step {k} attention output")
        close(inf_f[k]["out"][0, r], out[k, 0, i], f"step {k} output")
        full = d.logits(out[k, 0, i][None])[0]
        m = d.vocab.t2d
        close(logits[k][m], full[m], f"step {k} logits")
    # the token fed at step k is the chain's argmax of step k - 1
    assert torch.equal(ids[0, i + 2 : i + 1 + STEPS], drafts) and int(ids[0, i + 1]) == int(tokens[-1])


def test_files_carry_vllm_names_and_fields(tmp_path):
    target = tiny_target("qwen3", num_hidden_layers=12)
    d = Eagle3Drafter.for_target(target, draft_vocab=torch.arange(10, 90))
    assert d.target_layer_ids == eagle_layer_ids(12) == [1, 5, 8]
    d.save_pretrained(tmp_path / "e")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["eagle3_config"]["target_layer_ids"] == [1, 5, 8]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]  # vLLM: the input of layer i + 1
    assert cfg["draft_vocab_size"] == 80 and cfg["target_hidden_size"] == 32 and cfg["num_hidden_layers"] == 1
    with safe_open(str(tmp_path / "e" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight",
            "midlayer.input_layernorm.weight", "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight"} <= names
    assert not any("embed" in n for n in names)  # the target's embedding module is borrowed
    assert torch.equal(torch.arange(80) + d2t, torch.arange(10, 90)) and int(t2d.sum()) == 80 and t2d.dtype == torch.bool
    with safe_open(str(tmp_path / "e" / "model.safetensors"), "pt") as f:
        assert f.get_slice("midlayer.self_attn.q_proj.weight").get_shape() == [32, 64]  # q reads [embedding; hidden]


def test_reload_through_the_registry_gives_identical_proposals(tmp_path):
    target = tiny_target("gemma3")
    d = Eagle3Drafter.for_target(target, seed=2)
    d.set_feature_scale(torch.rand(d.fc.in_features) + 0.5, keep_function=True)  # folded into fc.weight on save
    d.save_pretrained(tmp_path / "e")
    e = load_drafter(tmp_path / "e", target)
    assert type(e) is Eagle3Drafter
    toks = torch.tensor(random_prompts(1, 12)[0])
    feats = torch.randn(11, d.fc.in_features)
    d.reset(), e.reset()
    m = d.vocab.t2d
    close(d.propose(toks, feats)[:, m], e.propose(toks, feats)[:, m], "proposals after reload")
    d.reset(), e.reset()
    ta, tb = d.propose_tree(toks, feats, 4, 3, 20), e.propose_tree(toks, feats, 4, 3, 20)
    assert ta.tokens == tb.tokens and ta.parents == tb.parents


def test_incremental_context_equals_one_pass():
    target = tiny_target("llama")
    d = Eagle3Drafter.for_target(target, seed=4)
    toks = torch.tensor(random_prompts(1, 16)[0])
    feats = torch.randn(15, d.fc.in_features)
    d.reset()
    once = d.propose(toks, feats)
    d.reset()
    d.propose(toks[:6], feats[:5])
    d.propose(toks[:11], feats[5:10])
    close(d.propose(toks, feats[10:])[:, d.vocab.t2d], once[:, d.vocab.t2d], "incremental context")
    with pytest.raises(DrafterError, match="positions"):
        d.propose(toks, feats[:3])


def test_mismatched_layer_fields_and_targets_are_refused(tmp_path):
    target = tiny_target("qwen3")
    d = Eagle3Drafter.for_target(target)
    d.save_pretrained(tmp_path / "e")
    cfg = json.loads((tmp_path / "e" / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    with pytest.raises(ValueError, match="do not match"):
        Eagle3Config.model_validate(cfg)
    with pytest.raises(DrafterError, match="layers"):
        load_drafter(tmp_path / "e", tiny_target("qwen3", num_hidden_layers=8))
    with pytest.raises(DrafterError, match="hidden_size"):
        load_drafter(tmp_path / "e", tiny_target("qwen3", hidden_size=64, num_attention_heads=8))


def test_vllm_layer_names_load_and_an_unbound_drafter_says_how_to_bind(tmp_path):
    """A folder whose decoder layer is stored under vLLM's own name (``layers.0.``) loads as the same drafter;
    an unbound drafter refuses to embed, naming its own from_pretrained."""
    from safetensors.torch import load_file, save_file

    target = tiny_target("qwen3")
    d = Eagle3Drafter.for_target(target, seed=3)
    folder = d.save_pretrained(tmp_path / "e")
    w = load_file(str(folder / "model.safetensors"))
    save_file({k.replace("midlayer.", "layers.0.", 1): v for k, v in w.items()}, str(folder / "model.safetensors"))
    e = load_drafter(folder, target)
    assert not any(k.startswith("layers.") for k in e.state_dict())
    assert all(torch.equal(e.state_dict()[k], v) for k, v in w.items())
    with pytest.raises(DrafterError, match=r"token embedding is the target's .* Eagle3Drafter\.from_pretrained"):
        Eagle3Drafter.from_pretrained(folder).embed(torch.tensor([1]))
    with pytest.raises(DrafterError, match="an EAGLE-3 drafter folder holds config.json"):
        Eagle3Drafter.from_pretrained(tmp_path / "nowhere")
