"""Export/import on tiny targets: layer-id conventions, round trips, refusals, target quirks, serve commands."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from flashdraft.cli import app
from flashdraft.export.conventions import CONVENTIONS, hf_hidden_state_index
from flashdraft.export.formats import ExportError, export_drafter, formats_for
from flashdraft.export.importers import ImportError_, import_drafter
from flashdraft.export.quirks import measure_quirks
from flashdraft.export.serve import serve_commands
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.forward import capture_layer_outputs
from tests.tiny import MASK_ID, VOCAB, tiny_target

IDS = [1, 3]


def make_drafter(tmp_path, target, name="src", draft_vocab=None, layer_types=None, dtype=torch.bfloat16):
    d = DFlashDrafter.for_target(target, num_layers=2, block_size=4, target_layer_ids=IDS, mask_token_id=MASK_ID,
                                 seed=1, draft_vocab=draft_vocab)
    if layer_types:
        d.cfg.layer_types, d.cfg.sliding_window = layer_types, 4
    return d.to(dtype).save_pretrained(tmp_path / name)


def read(folder):
    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def qwen():
    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def gemma():
    return tiny_target("gemma3")


def test_layer_conventions_name_the_same_hidden_state(qwen, tmp_path):
    """Every format's ids, read with its own convention, denote the tensor flashdraft trains on."""
    x = torch.randint(0, VOCAB - 1, (1, 9))
    with capture_layer_outputs(qwen, IDS) as feats:
        hs = qwen.model(x, output_hidden_states=True).hidden_states  # (L + 1) x [1, 9, d]
    src = make_drafter(tmp_path, qwen)
    files = {}
    for fmt in formats_for("dflash"):
        cfg, _ = read(export_drafter(src, fmt, tmp_path / fmt, qwen).out)
        files[fmt] = cfg
    file_ids = {"zlab": files["zlab"]["dflash_config"]["target_layer_ids"],
                "sglang": files["sglang"]["dflash_config"]["target_layer_ids"],
                "vllm": files["vllm"]["eagle_aux_hidden_state_layer_ids"],
                "speculators": files["speculators"]["aux_hidden_state_layer_ids"]}
    assert file_ids["vllm"] == [i + 1 for i in IDS] and file_ids["speculators"] == [i + 1 for i in IDS]
    assert file_ids["zlab"] == IDS and file_ids["sglang"] == IDS
    assert files["vllm"]["dflash_config"]["target_layer_ids"] == IDS  # vLLM adds its own +1 to this field
    for fmt, ids in file_ids.items():
        for k, fid in enumerate(ids):
            assert torch.equal(hs[hf_hidden_state_index(fmt, fid)], feats[k]), (fmt, fid)
    assert CONVENTIONS["vllm"].from_file(file_ids["vllm"]) == IDS


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
@pytest.mark.parametrize("reduced", [False, True])
def test_round_trip_is_bit_identical_for_every_format(family, reduced, tmp_path, qwen, gemma):
    target = qwen if family == "qwen3" else gemma
    vocab = torch.arange(0, VOCAB, 3) if reduced else None
    src = make_drafter(tmp_path, target, draft_vocab=vocab)
    cfg0, w0 = read(src)
    fmts = ["vllm", "speculators"] if reduced else formats_for("dflash")
    for fmt in fmts:
        out = export_drafter(src, fmt, tmp_path / f"x-{fmt}", target).out
        back, got_fmt, _ = import_drafter(out, tmp_path / f"back-{fmt}", target=target)
        assert got_fmt == ("zlab" if fmt == "sglang" else fmt)
        cfg1, w1 = read(back)
        assert cfg1 == cfg0, fmt
        assert w1.keys() == w0.keys(), fmt
        for k in w0:
            assert w1[k].dtype == w0[k].dtype and torch.equal(w1[k], w0[k]), (fmt, k)
        if fmt != "speculators":
            DFlashDrafter.from_pretrained(out, target)  # flashdraft also loads the exported folder as it is


def test_own_head_over_the_whole_vocabulary_exports_for_vllm_without_maps(tmp_path, qwen):
    """draft_vocab_size = the target's vocabulary (an own head over every id): vLLM builds no draft-id map then and
    refuses a d2t, so the head goes in target-id order without maps; speculators would swap in the verifier's head."""
    src = make_drafter(tmp_path, qwen, draft_vocab=torch.arange(VOCAB), dtype=torch.float32)
    cfg, w = read(export_drafter(src, "vllm", tmp_path / "v", qwen).out)
    mine = load_file(str(src / "model.safetensors"))
    assert cfg["draft_vocab_size"] == VOCAB and "d2t" not in w and "t2d" not in w
    assert torch.equal(w["lm_head.weight"], mine["lm_head.weight"])  # d2t all zero: draft id = target id
    import_drafter(tmp_path / "v", tmp_path / "back")
    back, orig = DFlashDrafter.from_pretrained(tmp_path / "back", qwen), DFlashDrafter.from_pretrained(src, qwen)
    assert back.cfg.draft_vocab_size == VOCAB and torch.equal(back.lm_head.weight, orig.lm_head.weight)
    assert torch.equal(back.d2t, orig.d2t) and bool(back.t2d.all())
    with pytest.raises(ExportError, match="verifier's on load"):
        export_drafter(src, "speculators", tmp_path / "s", qwen)
    cfg, w = read(export_drafter(make_drafter(tmp_path, qwen, "r", torch.arange(0, VOCAB, 3)), "vllm", tmp_path / "r2",
                                 qwen).out)
    assert cfg["draft_vocab_size"] == len(range(0, VOCAB, 3)) and "d2t" in w  # a reduced one keeps its map


@pytest.mark.parametrize("fmt", ["zlab", "sglang"])
def test_reduced_vocab_is_refused_where_it_cannot_be_expressed(fmt, tmp_path, qwen):
    src = make_drafter(tmp_path, qwen, draft_vocab=torch.arange(0, VOCAB, 3))
    with pytest.raises(ExportError, match="draft_vocab_size 32.*--to vllm"):
        export_drafter(src, fmt, tmp_path / "out", qwen)
    assert not (tmp_path / "out").exists()


def test_mixed_sliding_layers_are_refused_by_speculators(tmp_path, qwen):
    src = make_drafter(tmp_path, qwen, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ExportError, match="sliding_window_non_causal"):
        export_drafter(src, "speculators", tmp_path / "out", qwen)
    assert not (tmp_path / "out").exists()
    cfg, _ = read(export_drafter(src, "vllm", tmp_path / "v", qwen).out)
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
    assert serve_commands(tmp_path / "v", "T")["vllm"].startswith("VLLM_USE_V2_MODEL_RUNNER=1 ")


@pytest.mark.parametrize("fmt", ["zlab", "vllm", "speculators"])
def test_block_hints_reach_vllm_only(fmt, tmp_path, qwen):
    """vLLM with flashdraft's plugin fills the draft slots with the hints, so the vLLM export keeps block_hints;
    every other engine fills MASK: those exports drop it and say what that costs."""
    d = DFlashDrafter.for_target(qwen, num_layers=1, block_size=4, target_layer_ids=IDS, mask_token_id=MASK_ID, seed=1)
    d.cfg.block_hints = "lookup"
    src = d.save_pretrained(tmp_path / "src")
    assert read(src)[0]["block_hints"] == "lookup"
    rep = export_drafter(src, fmt, tmp_path / fmt, qwen)
    if fmt == "vllm":
        assert read(rep.out)[0]["block_hints"] == "lookup"
        assert any("block_hints 'lookup' kept" in n and "plugin" in n for n in rep.notes)
    else:
        assert "block_hints" not in json.dumps(read(rep.out)[0])
        assert any("block_hints 'lookup' dropped" in n and "--hints none" in n for n in rep.notes)


def test_unknown_format_and_wrong_target_are_refused(tmp_path, qwen, gemma):
    src = make_drafter(tmp_path, qwen)
    with pytest.raises(ExportError, match="choose one of"):
        export_drafter(src, "onnx", tmp_path / "o", qwen)
    other = tiny_target("qwen3", num_hidden_layers=4)
    with pytest.raises(ExportError, match="does not fit target"):
        export_drafter(src, "vllm", tmp_path / "o", other)


def test_quirks_are_measured_for_every_family(qwen, gemma):
    qg, qq = measure_quirks(gemma), measure_quirks(qwen)
    assert qg.embed_transform and qg.embed_scale == pytest.approx(32 ** 0.5, rel=1e-3) and qg.tied_lm_head
    assert not qq.embed_transform and qq.embed_scale is None and not qq.tied_lm_head
    capped = tiny_target("qwen3")
    capped.model.config.final_logit_softcapping = 30.0
    assert measure_quirks(capped).logit_softcap == 30.0


@torch.no_grad()
def _drafts(drafter, target, seq, starts):
    from flashdraft.models.forward import new_cache, target_forward

    out = []
    for s in starts:
        drafter.reset()
        n = torch.arange(s)
        _, feats = target_forward(target, new_cache(), seq[:s], n, n[:, None] >= n[None, :], drafter.target_layer_ids)
        out.append(drafter.propose(seq[: s + 1], feats).argmax(-1).tolist())
    return out


def test_shipped_table_gives_the_drafts_of_training_and_unscaled_rows_do_not(tmp_path, gemma):
    """A drafter whose drafts depend on its block embeddings: served with the table vLLM-format
    export ships it drafts exactly as under HF; fed the raw (unscaled) rows, as vLLM's native
    Gemma class would, its drafts change."""
    src = make_drafter(tmp_path, gemma, dtype=torch.float32)
    drafter = DFlashDrafter.from_pretrained(src, gemma)
    with torch.no_grad():
        for layer in drafter.layers:  # make the block's own embeddings matter against the context
            layer.self_attn.o_proj.weight.mul_(40)
    drafter.save_pretrained(src)
    out = export_drafter(src, "vllm", tmp_path / "v", gemma).out
    table = load_file(str(out / "model.safetensors"))["embed_tokens.weight"]
    emb = gemma.model.get_input_embeddings()
    ids = torch.arange(VOCAB)
    assert torch.equal(table, emb(ids[None])[0])  # exactly what HF's module feeds
    assert not torch.allclose(table, emb.weight)

    drafter = DFlashDrafter.from_pretrained(out, gemma)
    seq = torch.randint(0, VOCAB - 1, (40,), generator=torch.Generator().manual_seed(3))
    starts = list(range(8, 38, 2))
    ref = _drafts(drafter, gemma, seq, starts)
    orig = emb.forward
    try:
        emb.forward = lambda x: torch.nn.functional.embedding(x, table)  # the shipped table, plain lookup
        served = _drafts(drafter, gemma, seq, starts)
        emb.forward = lambda x: torch.nn.functional.embedding(x, emb.weight)  # raw rows: the trap
        unscaled = _drafts(drafter, gemma, seq, starts)
    finally:
        emb.forward = orig
    assert served == ref
    assert sum(a != b for a, b in zip(unscaled, ref)) >= len(starts) // 2


def test_import_published_zlab_layout(tmp_path, qwen):
    """Older/newer z-lab layouts: block_size inside dflash_config, rope_parameters, no
    target_hidden_size, no target_layer_ids (default rule); a missing mask id names the flag."""
    src = make_drafter(tmp_path, qwen)
    cfg, w = read(src)
    cfg.pop("target_hidden_size")
    cfg["dflash_config"]["block_size"] = cfg.pop("block_size")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.pop("rope_theta")}
    ids = cfg["dflash_config"].pop("target_layer_ids")
    pub = tmp_path / "pub"
    pub.mkdir()
    (pub / "config.json").write_text(json.dumps(cfg))
    save_file(w, str(pub / "model.safetensors"))
    back, fmt, _ = import_drafter(pub, tmp_path / "imp", target=qwen)
    got, _ = read(back)
    assert fmt == "zlab" and got["block_size"] == 4 and got["target_hidden_size"] == 32
    assert got["dflash_config"]["target_layer_ids"] == [1, 3] != [] and ids == IDS
    cfg["dflash_config"].pop("mask_token_id")
    (pub / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ImportError_, match="--mask-token-id"):
        import_drafter(pub, tmp_path / "imp2", target=qwen)


def test_import_refuses_inconsistent_vllm_ids(tmp_path, qwen):
    out = export_drafter(make_drafter(tmp_path, qwen), "vllm", tmp_path / "v", qwen).out
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = IDS  # forgot the +1
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ImportError_, match="differ by exactly 1"):
        import_drafter(out, tmp_path / "back")


def test_serve_commands_and_cli(tmp_path, gemma, qwen):
    src = make_drafter(tmp_path, gemma)
    v = export_drafter(src, "vllm", tmp_path / "v", gemma, "org/gemma").out
    s = export_drafter(src, "sglang", tmp_path / "s", gemma, "org/gemma").out
    cmds = serve_commands(v, "org/gemma")
    assert "--model-impl transformers" in cmds["vllm"] and '"num_speculative_tokens": 3' in cmds["vllm"]
    assert "--model-impl transformers" in cmds["vllm_baseline"] and "sglang" not in cmds
    sg = serve_commands(s, "org/gemma")["sglang"]
    assert "--speculative-algorithm DFLASH" in sg and "--speculative-num-draft-tokens 4" in sg
    runner = CliRunner()
    r = runner.invoke(app, ["serve-cmd", str(v), "--target", "org/gemma"])
    assert r.exit_code == 0 and "speculative-config" in r.output
    r = runner.invoke(app, ["import", str(v), "-o", str(tmp_path / "imp")])
    assert r.exit_code == 0, r.output
    assert "(vllm)" in r.output and (tmp_path / "imp" / "model.safetensors").is_file()
    r = runner.invoke(app, ["import", str(tmp_path / "nowhere"), "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "config.json not found" in " ".join(r.output.split())


def test_table_is_made_in_the_serving_dtype(tmp_path, gemma):
    import copy

    src = make_drafter(tmp_path, gemma, dtype=torch.float32)
    out = export_drafter(src, "vllm", tmp_path / "v", gemma, serve_dtype="bfloat16").out
    table = load_file(str(out / "model.safetensors"))["embed_tokens.weight"]
    bf16 = copy.deepcopy(gemma.model.get_input_embeddings()).to(torch.bfloat16)
    assert table.dtype == torch.bfloat16 and torch.equal(table, bf16(torch.arange(VOCAB)[None])[0])
    assert read(out)[0]["torch_dtype"] == "float32"  # the drafter's own weights keep their dtype
    with pytest.raises(ExportError, match="--dtype 'int8'"):
        export_drafter(src, "vllm", tmp_path / "w", gemma, serve_dtype="int8")


def test_serve_bench_reads_real_vllm_metrics(tmp_path):
    """/metrics text captured from a vLLM 0.32 CPU server serving an exported drafter
    (experiments/export_serve_concurrency.py): counters end in _total, carry labels, and have _created twins."""
    import asyncio
    from pathlib import Path

    import httpx

    from flashdraft.bench.serve_bench import spec_counters

    text = (Path(__file__).with_name("data") / "vllm032_spec_metrics.txt").read_text()

    def handler(request):
        return httpx.Response(200, text=text)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            return await spec_counters(c, "http://x/v1")

    got = asyncio.run(go())
    want = {}
    for line in text.splitlines():
        for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            if line.startswith(f"vllm:spec_decode_{k}_total{{"):
                want[k] = float(line.rsplit(" ", 1)[1])
    assert got == want and set(want) == {"num_drafts", "num_draft_tokens", "num_accepted_tokens"}


def test_exported_files_name_no_folder_of_this_machines_cache(tmp_path, qwen, monkeypatch):
    """A target given as a folder of flashdraft's cache (where .gguf and embedded targets are converted) is named
    by its folder's name in the files, with a note; a name as the user gave it (an HF id) is kept."""
    from flashdraft.models.target import cache_root, portable_target_name

    monkeypatch.setenv("FLASHDRAFT_CACHE", str(tmp_path / "cache"))
    local = cache_root() / "targets" / "my-model-0123456789abcdef"
    local.mkdir(parents=True)
    assert portable_target_name("org/model") == ("org/model", None)
    name, note = portable_target_name(str(local))
    assert name == "my-model-0123456789abcdef" and "flashdraft cache" in note
    src = make_drafter(tmp_path, qwen)
    rep = export_drafter(src, "speculators", tmp_path / "spec", qwen, str(local))
    text = "".join(p.read_text() for p in (rep.out / "config.json", rep.out / "flashdraft_export.json"))
    assert str(cache_root()) not in text and "my-model-0123456789abcdef" in text
    assert any("flashdraft cache" in n for n in rep.notes)
    rep = export_drafter(src, "speculators", tmp_path / "spec2", qwen, "org/model")
    assert json.loads((rep.out / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == "org/model"
