"""Offline target features: exact round trip, resume, interrupted writes, refusals, the CLI."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
import typer
from safetensors import safe_open
from typer.testing import CliRunner

import flashdraft.models.target as target_mod
import flashdraft.train.features as features_mod
from flashdraft.models.forward import target_pass
from flashdraft.models.target import wrap_model
from flashdraft.train.data import Example, collate, load_examples
from flashdraft.train.features import FeatureStore, write_features
from flashdraft.train.features_cli import features
from flashdraft.train.objective import TrainError
from tests.tiny import VOCAB, tiny_target

from .test_loop import write_data

LAYERS = [1, 3]


def make_examples(n: int = 5, seed: int = 0) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 6 + 3 * i
        ids = torch.randint(0, VOCAB - 1, (length,), generator=g).tolist()
        out.append(Example(ids, [0] * 3 + [1] * (length - 3), index=i))
    return out


def reference(target, e: Example, want_final: bool = True):
    f, h = target_pass(target, collate([[e]], [0]), LAYERS, want_final)  # [1, n, K*H], [1, n, H]
    return f[0], h[0]


def shards(path):
    return sorted(path.glob("shard-*.safetensors"))


def contents(p) -> tuple[dict, dict]:
    """(tensors, metadata) of a shard; its header order is not stable, so bytes are not compared."""
    with safe_open(str(p), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def same_contents(a, b) -> bool:
    (ta, ma), (tb, mb) = contents(a), contents(b)
    return ma == mb and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_equals_target_pass(tmp_path, dtype):
    t, ex = tiny_target("qwen3"), make_examples()
    path = write_features(t, ex, LAYERS, tmp_path / "f", shard_size=2, dtype=dtype, with_final=True, progress=False)
    assert [p.name for p in shards(path)] == ["shard-00000.safetensors", "shard-00001.safetensors", "shard-00002.safetensors"]
    store = FeatureStore(path)
    store.check(t, LAYERS, ex, need_final=True)
    store.check(t, [3], ex)  # a subset of the cached layers is fine
    H, want = t.hidden_size, getattr(torch, dtype)
    for e in ex:
        f, h = reference(t, e)
        got_f, got_h = store.get(e.index)
        assert got_f.dtype == want and got_f.shape == (len(e.token_ids), 2 * H)
        # same forward, then one cast: exact in fp32, exactly the bf16 rounding of the fp32 numbers in bf16
        assert torch.equal(got_f, f.to(want)) and torch.equal(got_h, h.to(want))
        if dtype == "bfloat16":
            torch.testing.assert_close(got_f.float(), f, rtol=2**-8, atol=1e-6)
        assert torch.equal(store.get(e.index, [3])[0], got_f[:, H:])  # column slice
        assert torch.equal(store.get(e.index, [3, 1])[0], torch.cat([got_f[:, H:], got_f[:, :H]], 1))  # reordered
    assert store.layer_columns([3]) == slice(H, 2 * H)
    # shard contents: tokens, mask, offsets, example ids
    with safe_open(str(path / "shard-00001.safetensors"), "pt") as f:
        assert f.get_tensor("index").tolist() == [2, 3]
        assert f.get_tensor("offsets").tolist() == [0, 12, 27]
        assert f.get_tensor("token_ids").tolist() == ex[2].token_ids + ex[3].token_ids
        assert f.get_tensor("loss_mask").tolist() == [bool(m) for m in ex[2].loss_mask + ex[3].loss_mask]
    # batch layout like data.collate: packed rows, right padding with zeros
    feats, final = store.collate([[ex[0], ex[1]], [ex[4]]], device="cpu", want_final=True)
    T = len(ex[4].token_ids)
    assert feats.shape == (2, T, 2 * H) and final.shape == (2, T, H)
    n0, n1 = len(ex[0].token_ids), len(ex[1].token_ids)
    assert torch.equal(feats[0, :n0], store.get(0)[0]) and torch.equal(feats[0, n0 : n0 + n1], store.get(1)[0])
    assert not feats[0, n0 + n1 :].any() and torch.equal(final[1], store.get(4)[1])
    manifest = json.loads((path / "features.json").read_text())
    assert manifest["n_examples"] == 5 and manifest["layer_ids"] == LAYERS and manifest["dtype"] == dtype


def test_resume_rewrites_only_the_missing_shard(tmp_path):
    t, ex = tiny_target("qwen3"), make_examples()
    path = write_features(t, ex, LAYERS, tmp_path / "f", shard_size=2, dtype="float32", progress=False)
    saved = tmp_path / "saved"
    saved.mkdir()
    for p in [*shards(path), path / "features.json"]:
        (saved / p.name).write_bytes(p.read_bytes())
    for p in [*shards(path), path / "features.json"]:
        os.utime(p, ns=(10**18, 10**18))  # a fixed past time: any rewrite shows, whatever the clock granularity
    before = {p.name: p.stat().st_mtime_ns for p in [*shards(path), path / "features.json"]}
    write_features(t, ex, LAYERS, path, shard_size=2, dtype="float32", progress=False)  # complete: writes nothing
    assert {p.name: p.stat().st_mtime_ns for p in [*shards(path), path / "features.json"]} == before
    (path / "shard-00001.safetensors").unlink()
    with pytest.raises(TrainError, match=r"incomplete: 1 of 3 shards missing \(shard-00001.*rerun `flashdraft features`"):
        FeatureStore(path).check(t, LAYERS, ex)
    write_features(t, ex, LAYERS, path, shard_size=2, dtype="float32", progress=False)
    after = {p.name: p.stat().st_mtime_ns for p in [*shards(path), path / "features.json"]}
    assert after.keys() == before.keys()
    assert [n for n in after if after[n] != before[n]] == ["shard-00001.safetensors"]  # only that one rewritten
    assert (path / "features.json").read_bytes() == (saved / "features.json").read_bytes()
    assert all(same_contents(p, saved / p.name) for p in shards(path))  # identical result
    FeatureStore(path).check(t, LAYERS, ex)


def test_a_cache_grows_with_appended_data(tmp_path, monkeypatch):
    """Examples appended after the cached ones (a resumed generation with more prompts): the shards that hold
    the same examples are kept, only the rest are computed, and the result equals a cache built from scratch;
    a re-tag killed half-way is finished by the next call; other data is still refused."""
    t, ex5, ex8 = tiny_target("qwen3"), make_examples(5), make_examples(8)
    assert [e.token_ids for e in ex8[:5]] == [e.token_ids for e in ex5]
    path = write_features(t, ex5, LAYERS, tmp_path / "f", shard_size=2, dtype="float32", progress=False)  # [0,1] [2,3] [4]
    computed, real = [], features_mod._shard_tensors
    monkeypatch.setattr(features_mod, "_shard_tensors", lambda tg, exs, *a, **k: computed.extend(e.index for e in exs)
                        or real(tg, exs, *a, **k))
    real_replace = os.replace

    def dying_replace(src, dst):
        if os.path.basename(dst) == "shard-00001.safetensors":
            raise KeyboardInterrupt  # killed while re-tagging the second kept shard
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        write_features(t, ex8, LAYERS, path, shard_size=2, dtype="float32", progress=False)
    monkeypatch.setattr(os, "replace", real_replace)
    assert computed == [] and json.loads((path / "features.json").read_text())["n_examples"] == 5  # old manifest stays
    write_features(t, ex8, LAYERS, path, shard_size=2, dtype="float32", progress=False)
    assert computed == [4, 5, 6, 7]  # shards 0 and 1 kept; the old last shard [4] is now [4, 5]
    store = FeatureStore(path)
    store.check(t, LAYERS, ex8)
    monkeypatch.setattr(features_mod, "_shard_tensors", real)
    clean = write_features(t, ex8, LAYERS, tmp_path / "clean", shard_size=2, dtype="float32", progress=False)
    assert (path / "features.json").read_bytes() == (clean / "features.json").read_bytes()
    assert [p.name for p in shards(path)] == [p.name for p in shards(clean)]
    assert all(same_contents(p, clean / p.name) for p in shards(path))
    other = make_examples(9, seed=1)  # not an extension of the cached examples
    with pytest.raises(TrainError, match="data: cache 8 examples .* vs now 9 examples.*--overwrite"):
        write_features(t, other, LAYERS, path, shard_size=2, dtype="float32", progress=False)
    with pytest.raises(TrainError, match="shard_size: cache 2 vs now 3"):  # same data in other shards: no reuse
        write_features(t, ex8 + make_examples(9)[8:], LAYERS, path, shard_size=3, dtype="float32", progress=False)


def test_a_cache_with_final_states_serves_a_request_without_them(tmp_path):
    """A cache written with_final=True is reused as it is by a request without final states (loss 'ce' on a
    cache built for 'kl'); the reverse still needs a new cache."""
    t, ex = tiny_target("qwen3"), make_examples()
    path = write_features(t, ex, LAYERS, tmp_path / "f", shard_size=2, dtype="float32", with_final=True, progress=False)
    for p in [*shards(path), path / "features.json"]:
        os.utime(p, ns=(10**18, 10**18))
    before = {p.name: p.stat().st_mtime_ns for p in [*shards(path), path / "features.json"]}
    write_features(t, ex, LAYERS, path, shard_size=2, dtype="float32", with_final=False, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in [*shards(path), path / "features.json"]} == before  # nothing rewritten
    FeatureStore(path).check(t, LAYERS, ex)
    narrow = write_features(t, ex, LAYERS, tmp_path / "g", shard_size=2, dtype="float32", progress=False)
    with pytest.raises(TrainError, match="with_final: cache False vs now True"):
        write_features(t, ex, LAYERS, narrow, shard_size=2, dtype="float32", with_final=True, progress=False)


def test_interrupted_write_leaves_no_partial_shard(tmp_path, monkeypatch):
    t, ex = tiny_target("qwen3"), make_examples()
    path = tmp_path / "f"
    real_replace, seen = os.replace, []

    def dying_replace(src, dst):
        if os.path.basename(dst) == "shard-00001.safetensors":
            seen.append(os.path.getsize(src))  # the temp file was fully written, then the process "dies"
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)  # the shard write goes through io.atomic_path
    with pytest.raises(KeyboardInterrupt):
        write_features(t, ex, LAYERS, path, shard_size=2, dtype="float32", progress=False)
    monkeypatch.setattr(os, "replace", real_replace)
    assert seen and seen[0] > 0
    assert [p.name for p in shards(path)] == ["shard-00000.safetensors"]
    assert not list(path.glob(".*.tmp"))  # the temp file is removed too
    # what a SIGKILL could leave: a stale temp file; plus a foreign file under a shard name
    (path / ".shard-00001.safetensors.abc123.tmp").write_bytes(b"partial")
    (path / "shard-00002.safetensors").write_bytes(b"garbage")
    write_features(t, ex, LAYERS, path, shard_size=2, dtype="float32", progress=False)
    assert len(shards(path)) == 3 and not list(path.glob(".*.tmp"))
    clean = write_features(t, ex, LAYERS, tmp_path / "clean", shard_size=2, dtype="float32", progress=False)
    assert all(same_contents(p, clean / p.name) for p in shards(path))


def test_refusals_name_both_sides(tmp_path):
    t, ex = tiny_target("qwen3"), make_examples()
    path = write_features(t, ex, LAYERS, tmp_path / "f", shard_size=2, dtype="float32", progress=False)
    store = FeatureStore(path)
    mine = store.manifest["target"]["weights_hash"]
    other = tiny_target("qwen3", seed=1)
    theirs = features_mod.target_fingerprint(other)["weights_hash"]
    assert theirs != mine
    with pytest.raises(TrainError, match=f"made for target tiny-qwen3.*weights {mine}.*target now is.*weights {theirs}"):
        store.check(other, LAYERS)
    same_in_bf16 = wrap_model(copy.deepcopy(t.model).to(torch.bfloat16), name="gemma-elsewhere")
    store.check(same_in_bf16, LAYERS, ex)  # same weights, other dtype and spec name: the same target
    bigger = tiny_target("qwen3", hidden_size=48, head_dim=12)
    with pytest.raises(TrainError, match="hidden 32.*hidden 48"):
        store.check(bigger, LAYERS)
    with pytest.raises(TrainError, match=r"holds target layers \[1, 3\], but the drafter reads \[1, 2\] \(\[2\] not"):
        store.check(t, [1, 2])
    data = make_examples(seed=1)
    h_old, h_new = store.manifest["data_hash"], features_mod.examples_hash(data)
    with pytest.raises(TrainError, match=f"built from 5 examples .*hash {h_old}.*training data gives 5 examples .*hash {h_new}"):
        store.check(t, LAYERS, data)
    with pytest.raises(TrainError, match="no final hidden states.*--with-final"):
        store.check(t, LAYERS, ex, need_final=True)
    # the writer refuses to mix caches in one folder, names both sides and the fix
    with pytest.raises(TrainError, match=r"layer_ids: cache \[1, 3\] vs now \[2\].*--overwrite.*new --out"):
        write_features(t, ex, [2], path, shard_size=2, dtype="float32", progress=False)
    with pytest.raises(TrainError, match=f"target: cache .*weights {mine}.* vs now .*weights {theirs}"):
        write_features(other, ex, LAYERS, path, shard_size=2, dtype="float32", progress=False)
    with pytest.raises(TrainError, match=f"data: cache 5 examples .*hash {h_old}.* vs now 5 examples .*hash {h_new}"):
        write_features(t, data, LAYERS, path, shard_size=2, dtype="float32", progress=False)
    write_features(other, ex, LAYERS, path, shard_size=2, dtype="float32", progress=False, overwrite=True)
    FeatureStore(path).check(other, LAYERS, ex)


def test_cli_end_to_end(tmp_path, monkeypatch):
    data = write_data(tmp_path / "d.jsonl", n=3)
    monkeypatch.setattr(target_mod, "load_target", lambda spec, **kw: tiny_target("qwen3"))
    app = typer.Typer()
    app.command()(features)
    out = tmp_path / "feats"
    args = ["--data", str(data), "--out", str(out), "--max-len", "64", "--block-size", "4", "--shard-size", "2",
            "--dtype", "float32", "--device", "cpu", "--no-progress"]
    r = CliRunner().invoke(app, [*args, "--layer-ids", "1,3"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert (summary["examples"], summary["shards"], summary["shards_missing"], summary["layer_ids"]) == (3, 2, 0, LAYERS)
    assert summary["bytes"] == sum(p.stat().st_size for p in shards(out)) and summary["tokens"] == 3 * 24
    t = tiny_target("qwen3")
    ex, _ = load_examples([data], t, max_len=64, block_size=4)
    store = FeatureStore(out)
    store.check(t, LAYERS, ex)
    assert torch.equal(store.get(2)[0], reference(t, ex[2])[0])
    assert store.manifest["source"]["data"] == [str(data)] and store.manifest["source"]["max_len"] == 64
    # feature statistics: per layer, the channel RMS and the top channels' share, from the stored features
    stats = json.loads((out / "feature_stats.json").read_text())
    assert summary["feature_stats"] == str(out / "feature_stats.json") and [s["layer"] for s in stats] == LAYERS
    f = torch.cat([store.get(i)[0][1:] for i in range(3)]).double()
    rms1 = f[:, : t.hidden_size].pow(2).mean(0).sqrt()
    assert stats[0]["rms_max"] == pytest.approx(float(rms1.max()), rel=1e-4)
    assert stats[0]["top1_share"] == pytest.approx(float(rms1.max() ** 2 / rms1.pow(2).sum()), rel=1e-4)
    assert "top-1 channel" in r.output
    # another layer choice into the same folder: refused (exit 2) with the fix
    bad = CliRunner().invoke(app, [*args, "--layer-ids", "2"])
    assert bad.exit_code == 2 and "--overwrite" in bad.output and "[1, 3]" in bad.output
    bad2 = CliRunner().invoke(app, [*args, "--layer-ids", "5"])  # the target's last layer
    assert bad2.exit_code == 2 and "last layer" in bad2.output
    # --config: the train YAML's choices; default layer rule for 1 drafter layer -> middle layer 3; kl -> final states
    (tmp_path / "c.yaml").write_text(f"data: [{json.dumps(str(data))}]\nmax_len: 64\nblock_size: 4\nloss: kl\n")
    r2 = CliRunner().invoke(app, ["--config", str(tmp_path / "c.yaml"), "--out", str(out), "--overwrite",
                                  "--device", "cpu", "--no-progress"])
    assert r2.exit_code == 0, r2.output
    s2 = json.loads(r2.output.strip().splitlines()[-1])
    assert s2["layer_ids"] == [3] and s2["with_final"] and s2["dtype"] == "bfloat16" and s2["shards"] == 1
    FeatureStore(out).check(t, [3], ex, need_final=True)
