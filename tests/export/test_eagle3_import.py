"""``flashdraft import`` of EAGLE-3 checkpoints on tiny targets: export -> import round trips in both layouts
and both vocabularies (same files, same drafter logits, lossless decoding), a checkpoint as vLLM / SpecForge
publish it (no layer ids, ``layers.0.`` names, no t2d), and malformed checkpoints refused by field."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from flashdraft.cli import app
from flashdraft.decode import build_decoder
from flashdraft.export.formats import export_drafter
from flashdraft.export.importers import ImportError_, import_drafter
from flashdraft.models.drafter import load_drafter
from flashdraft.models.eagle3 import Eagle3Drafter
from flashdraft.models.forward import capture_layer_outputs
from tests.lossless import assert_same_tokens
from tests.tiny import VOCAB, random_prompts, tiny_target

IDS = [0, 1, 3]
DEPTH = 3
NEW = 30
VOCABS = {"draft": torch.arange(0, VOCAB, 3), "full": torch.arange(VOCAB)}


@pytest.fixture(scope="module")
def gemma():
    return tiny_target("gemma3")  # transforms its embeddings: the export ships a table the import must drop


def read(folder):
    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


def write(folder, cfg, tensors):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def make(tmp_path, target, vocab, ids=IDS, depth=DEPTH):
    d = Eagle3Drafter.for_target(target, target_layer_ids=ids, draft_vocab=vocab, max_depth=depth, seed=1)
    return d.save_pretrained(tmp_path / "src"), d


@torch.no_grad()
def drafter_logits(target, drafter, depth=DEPTH):
    """The drafter's logits [n_prompts, depth, V] after three prompts, each from a fresh context."""
    rows = []
    for p in random_prompts(3, 12, seed=5):
        prompt = torch.tensor(p)
        with capture_layer_outputs(target, drafter.target_layer_ids) as feats:
            target.model(prompt[None])
        drafter.reset()
        rows.append(drafter.propose(prompt, torch.cat(feats, dim=-1)[0, :-1], depth))  # [depth, V]
    return torch.stack(rows)


@pytest.mark.parametrize("vocab", sorted(VOCABS))
@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_export_then_import_gives_back_the_same_drafter(fmt, vocab, gemma, tmp_path):
    src, original = make(tmp_path, gemma, VOCABS[vocab])
    cfg0, w0 = read(src)
    out = export_drafter(src, fmt, tmp_path / "x", gemma).out
    back, got_fmt, notes = import_drafter(out, tmp_path / "back", target=gemma)
    assert got_fmt == fmt
    assert any("dropped embed_tokens.weight" in n for n in notes)
    assert (vocab == "full") == any("full vocabulary" in n for n in notes)
    cfg1, w1 = read(back)
    assert cfg1 == cfg0
    assert w1.keys() == w0.keys() and all(w1[k].dtype == w0[k].dtype and torch.equal(w1[k], w0[k]) for k in w0)

    imported = load_drafter(back, gemma)
    assert imported.target_layer_ids == IDS and imported.max_depth == DEPTH
    assert torch.equal(drafter_logits(gemma, imported), drafter_logits(gemma, original))
    ar = build_decoder("ar", gemma)
    for method in ("eagle3", "eagle3_tree"):
        mine, theirs = build_decoder(method, gemma, imported), build_decoder(method, gemma, original)
        for p in random_prompts(2, 16, seed=7):
            got = mine.generate(p, NEW)
            assert_same_tokens(gemma, p, got.tokens, ar.generate(p, NEW).tokens, f"imported {fmt}/{vocab}/{method}")
            assert got.stats.taus == theirs.generate(p, NEW).stats.taus


def published(tmp_path, target, vocab, ids):
    """A flat EAGLE-3 checkpoint as vLLM / SpecForge publish it: no layer ids (vLLM's default aux layers), no
    num_target_layers, ``layers.0.`` names, d2t without t2d (reduced) or no maps at all (full)."""
    src, original = make(tmp_path, target, vocab, ids=ids, depth=7)
    cfg, w = read(export_drafter(src, "vllm", tmp_path / "x", target).out)
    for k in ("eagle_aux_hidden_state_layer_ids", "eagle_config", "eagle3_config", "num_target_layers",
              "norm_before_residual", "head_dim"):
        cfg.pop(k)
    w = {k.replace("midlayer.", "layers.0.", 1): v for k, v in w.items() if k != "t2d"}
    return write(tmp_path / "pub", cfg, w), original


def test_a_published_flat_checkpoint_imports_with_the_targets_default_layers(tmp_path):
    target = tiny_target("qwen3", num_hidden_layers=8)  # vLLM's default aux layers (2, 4, 5) = flashdraft [1, 3, 4]
    pub, original = published(tmp_path, target, VOCABS["draft"], [1, 3, 4])
    with pytest.raises(ImportError_, match="no num_target_layers; pass --target"):
        import_drafter(pub, tmp_path / "nope")
    back, fmt, notes = import_drafter(pub, tmp_path / "back", target=target)
    assert fmt == "vllm" and any("vLLM's default aux layers [2, 4, 5]" in n for n in notes)
    imported = load_drafter(back, target)
    assert imported.target_layer_ids == [1, 3, 4] and imported.max_depth == 7
    assert torch.equal(imported.t2d, original.t2d)  # rebuilt from d2t
    assert torch.equal(drafter_logits(target, imported), drafter_logits(target, original))


def _flat(tmp_path, gemma, vocab="draft"):
    src, _ = make(tmp_path, gemma, VOCABS[vocab])
    return read(export_drafter(src, "vllm", tmp_path / "x", gemma).out)


def _drop_maps(cfg, w):
    del w["d2t"], w["t2d"]


def _duplicate_draft_id(cfg, w):
    w["d2t"][1] = w["d2t"][0] - 1  # draft id 1 -> the target id of draft id 0


def _stray_t2d(cfg, w):
    w["t2d"][1] = ~w["t2d"][1]


def _other_table(cfg, w):
    w["embed_tokens.weight"] = torch.randn_like(w["embed_tokens.weight"])


def _head_rows(cfg, w):
    w["lm_head.weight"] = w["lm_head.weight"][:-1]


MALFORMED = {
    "norm_before_residual": (lambda c, w: c.update(norm_before_residual=True), "norm_before_residual is true"),
    "norm_before_fc": (lambda c, w: c["eagle_config"].update(norm_before_fc=True), "norm_before_fc is true"),
    "ids_off_by_one": (lambda c, w: c.update(eagle_aux_hidden_state_layer_ids=[i + 2 for i in IDS]),
                       r"layer ids disagree: eagle_aux_hidden_state_layer_ids \[2, 3, 5\] = flashdraft ids \[1, 2, 4\]"),
    "negative_ids": (lambda c, w: c.update(eagle_aux_hidden_state_layer_ids=[0, 2, 4]), "negative decoder-layer id"),
    "qwen3_layer": (lambda c, w: c.update(model_type="qwen3"), "model_type 'qwen3'"),
    "no_maps": (_drop_maps, r"draft_vocab_size 32 < vocab_size 96 but no d2t"),
    "duplicate_draft_id": (_duplicate_draft_id, "two draft ids to one target id"),
    "stray_t2d": (_stray_t2d, "t2d does not mark exactly"),
    "other_table": (_other_table, "embed_tokens.weight .* is not the output of target tiny-gemma3"),
    "head_rows": (_head_rows, "lm_head.weight has 31 rows but draft_vocab_size is 32"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_checkpoint_is_refused_naming_the_field(case, gemma, tmp_path):
    cfg, w = _flat(tmp_path, gemma)
    edit, message = MALFORMED[case]
    edit(cfg, w)
    bad = write(tmp_path / "bad", cfg, w)
    with pytest.raises(ImportError_, match=message):
        import_drafter(bad, tmp_path / "back", target=gemma)
    assert not (tmp_path / "back").exists()


def test_speculators_without_norm_before_residual_is_read_as_vllm_reads_it(gemma, tmp_path):
    src, _ = make(tmp_path, gemma, VOCABS["full"])
    out = export_drafter(src, "speculators", tmp_path / "s", gemma).out
    cfg, w = read(out)
    cfg.pop("norm_before_residual")
    with pytest.raises(ImportError_, match="norm_before_residual is absent, which vLLM reads as true"):
        import_drafter(write(tmp_path / "bad", cfg, w), tmp_path / "back", target=gemma)
    with pytest.raises(ImportError_, match=r"unknown format 'zlab' for a eagle3 checkpoint.*\['speculators', 'vllm'\]"):
        import_drafter(out, tmp_path / "back", fmt="zlab")


def test_cli_imports_an_eagle3_export(gemma, tmp_path):
    src, _ = make(tmp_path, gemma, VOCABS["draft"])
    out = export_drafter(src, "speculators", tmp_path / "s", gemma).out
    r = CliRunner().invoke(app, ["import", str(out), "-o", str(tmp_path / "imp")])
    assert r.exit_code == 0, r.output
    assert "(speculators)" in r.output and "dropped embed_tokens.weight unchecked" in " ".join(r.output.split())
    assert read(tmp_path / "imp")[0] == read(src)[0]
