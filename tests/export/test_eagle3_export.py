"""EAGLE-3 export to vLLM's ``eagle3`` layout on tiny targets: names, shapes, config fields, layer ids,
the embedding table, the vocabulary maps, refusals and the serve command."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from flashdraft.export.conventions import hf_hidden_state_index
from flashdraft.export.formats import MANIFEST, ExportError, export_drafter, formats_for
from flashdraft.export.serve import serve_commands
from flashdraft.models.eagle3 import Eagle3Drafter
from flashdraft.models.drafter import load_drafter
from flashdraft.models.forward import capture_layer_outputs
from tests.tiny import VOCAB, random_prompts, tiny_target

IDS = [0, 1, 3]
DEPTH = 3


@pytest.fixture(scope="module")
def gemma():
    return tiny_target("gemma3")


@pytest.fixture(scope="module")
def qwen():
    return tiny_target("qwen3")


def make(tmp_path, target, draft_vocab=None, name="src"):
    d = Eagle3Drafter.for_target(target, target_layer_ids=IDS, draft_vocab=draft_vocab, max_depth=DEPTH, seed=1)
    return d.save_pretrained(tmp_path / name), d


def read(folder):
    return (json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors")),
            json.loads((folder / MANIFEST).read_text()))


def test_vllm_files_names_shapes_and_fields(gemma, tmp_path):
    vocab = torch.arange(0, VOCAB, 3)  # [Vd] a reduced draft vocabulary
    src, d = make(tmp_path, gemma, vocab)
    cfg, w, manifest = read(export_drafter(src, "vllm", tmp_path / "out", gemma).out)
    H, c = gemma.hidden_size, d.cfg
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in IDS]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in IDS]
    assert cfg["eagle3_config"]["target_layer_ids"] == IDS  # flashdraft's own field kept
    assert cfg["draft_vocab_size"] == vocab.numel() and cfg["vocab_size"] == VOCAB
    assert cfg["norm_before_residual"] is False and cfg["tie_word_embeddings"] is False
    assert cfg["target_hidden_size"] == H and cfg["num_hidden_layers"] == 1
    hd, nh, nkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
    shapes = {"fc.weight": (H, 3 * H), "midlayer.self_attn.q_proj.weight": (nh * hd, 2 * H),
              "midlayer.self_attn.k_proj.weight": (nkv * hd, 2 * H), "midlayer.self_attn.o_proj.weight": (H, nh * hd),
              "midlayer.hidden_norm.weight": (H,), "midlayer.input_layernorm.weight": (H,), "norm.weight": (H,),
              "lm_head.weight": (vocab.numel(), H), "d2t": (vocab.numel(),), "t2d": (VOCAB,),
              "embed_tokens.weight": (VOCAB, H)}
    for k, s in shapes.items():
        assert tuple(w[k].shape) == s, k
    assert w["d2t"].dtype == torch.long and torch.equal(w["d2t"] + torch.arange(vocab.numel()), vocab)
    assert torch.equal(w["fc.weight"], d.folded_fc_weight())  # features scale folded, as vLLM reads raw features
    emb = gemma.model.get_input_embeddings()
    ids = torch.arange(VOCAB)
    assert torch.equal(w["embed_tokens.weight"], emb(ids[None])[0].to(w["embed_tokens.weight"].dtype))  # scaled rows
    assert not torch.allclose(w["embed_tokens.weight"].float(), emb.weight.float())
    assert manifest["speculative_config"] == {"method": "eagle3", "num_speculative_tokens": DEPTH}
    assert manifest["architecture"] == "eagle3" and any("embed_tokens" in n for n in manifest["notes"])


def test_aux_ids_name_the_features_the_drafter_trains_on(qwen, tmp_path):
    src, _ = make(tmp_path, qwen)
    cfg, w, _ = read(export_drafter(src, "vllm", tmp_path / "out", qwen).out)
    assert "embed_tokens.weight" not in w  # no embedding transform: vLLM shares the target's table
    x = torch.randint(0, VOCAB - 1, (1, 9))
    with capture_layer_outputs(qwen, IDS) as feats:
        hs = qwen.model(x, output_hidden_states=True).hidden_states  # (L + 1) x [1, 9, d]
    for k, fid in enumerate(cfg["eagle_aux_hidden_state_layer_ids"]):
        assert torch.equal(hs[hf_hidden_state_index("vllm", fid)], feats[k])


def _same_drafts(target, a, b):
    prompt = torch.tensor(random_prompts(1, 8, seed=2)[0])
    with capture_layer_outputs(target, IDS) as feats:
        target.model(prompt[None])
    f = torch.cat(feats, dim=-1)[0, :-1]  # [7, 3d] features of the positions before the bonus
    a.reset()
    b.reset()
    return torch.equal(a.propose(prompt, f), b.propose(prompt, f))


def test_the_export_loads_back_as_the_same_drafter(gemma, tmp_path):
    src, d = make(tmp_path, gemma, torch.arange(0, VOCAB, 2))
    out = export_drafter(src, "vllm", tmp_path / "out", gemma).out
    back = load_drafter(out, gemma)  # the shipped embedding table is dropped: the target's module is borrowed
    assert type(back) is Eagle3Drafter and back.target_layer_ids == IDS
    assert _same_drafts(gemma, d, back)


def test_full_vocabulary_ships_no_maps(qwen, tmp_path):
    src, _ = make(tmp_path, qwen, torch.arange(VOCAB))
    out = export_drafter(src, "vllm", tmp_path / "out", qwen).out
    _, w, _ = read(out)
    assert "d2t" not in w and "t2d" not in w and tuple(w["lm_head.weight"].shape) == (VOCAB, qwen.hidden_size)
    assert torch.equal(w["lm_head.weight"], Eagle3Drafter.from_pretrained(src, qwen).lm_head.weight.detach())


def test_a_format_the_family_lacks_is_refused_with_the_formats_that_exist(qwen, tmp_path):
    src, _ = make(tmp_path, qwen)
    assert formats_for("eagle3") == ["speculators", "vllm"]
    for fmt in ("zlab", "sglang", "nope"):
        with pytest.raises(ExportError, match=r"eagle3 drafter to format .*\['speculators', 'vllm'\]"):
            export_drafter(src, fmt, tmp_path / fmt, qwen)
    assert not (tmp_path / "zlab").exists()


def test_speculators_layout(gemma, tmp_path):
    src, _ = make(tmp_path, gemma, torch.arange(0, VOCAB, 3))
    flat, wv, _ = read(export_drafter(src, "vllm", tmp_path / "v", gemma).out)
    cfg, w, manifest = read(export_drafter(src, "speculators", tmp_path / "s", gemma, "org/target").out)
    assert cfg["speculators_model_type"] == "eagle3" and cfg["norm_before_residual"] is False
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in IDS]
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == DEPTH
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/target"
    layer = cfg["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["head_dim"] == flat["head_dim"] and "architectures" not in layer
    # the vllm layout's tensors, the decoder layer named layers.0 (speculators' class reads no midlayer.*), and
    # always an embedding table (speculators 0.9 keeps uninitialised memory where a file ships none)
    as_vllm = {("midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k): v for k, v in w.items()}
    assert not any(k.startswith("midlayer.") for k in w) and "embed_tokens.weight" in w
    assert set(as_vllm) == set(wv) | {"embed_tokens.weight"} and all(torch.equal(as_vllm[k], wv[k]) for k in wv)
    assert manifest["speculative_config"]["method"] == "eagle3"


def test_a_drafter_for_another_target_is_refused(qwen, gemma, tmp_path):
    src, _ = make(tmp_path, qwen)
    other = tiny_target("qwen3", hidden_size=2 * qwen.hidden_size)
    with pytest.raises(ExportError, match="does not fit target"):
        export_drafter(src, "vllm", tmp_path / "x", other)


def test_serve_command_uses_the_eagle3_method(gemma, tmp_path):
    src, _ = make(tmp_path, gemma)
    out = export_drafter(src, "vllm", tmp_path / "out", gemma).out
    cmds = serve_commands(out, "/models/gemma")
    spec = json.loads(cmds["vllm"].split("--speculative-config ")[1].strip("'"))
    assert spec == {"method": "eagle3", "model": str(out.resolve()), "num_speculative_tokens": DEPTH}
    assert "--model-impl transformers" in cmds["vllm"] and "sglang" not in cmds
