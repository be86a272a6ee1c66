"""``bench serve`` against a real vLLM CPU server (one start) and against an unreachable endpoint.

The same server acts as both the baseline and the "speculative" endpoint: a speculative vLLM server
on CPU would cost a second engine start (and with a random drafter accepts nothing); what is tested
here is the client side (streaming TTFT/TPOT, concurrency, percentiles, speedup, tables, plots).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from typer.testing import CliRunner

from flashdraft.bench.cli import app
from flashdraft.bench.serve_bench import ServeBenchError, percentiles, run_serve_bench, vllm_commands


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    from flashdraft.models.target import embedded_target_dir

    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(embedded_target_dir()),
           "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "1024", "--port", str(port),
           "--host", "127.0.0.1"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 400
        while time.time() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            pytest.fail(f"vLLM server did not come up in 400 s:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_serve_sweep_on_vllm(vllm_url, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                               ["def add(a, b):", "The capital of France is", "import numpy as np\n", "Once upon a"]))
    out = tmp_path / "serve"
    res = CliRunner().invoke(app, ["serve", "--baseline-url", vllm_url, "--speculative-url", vllm_url,
                                   "--prompts", str(prompts), "--num-prompts", "4", "--max-tokens", "16",
                                   "--concurrency", "1,2", "--target", "gemma-3-270m", "--drafter", "DIR",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "--speculative-config" in res.output and '"num_speculative_tokens": 15' in res.output
    saved = json.loads((out / "serve_results.json").read_text())
    assert not saved["partial"] and len(saved["rows"]) == 4
    for r in saved["rows"]:
        assert r["output_tokens"] == 4 * 16  # ignore_eos + max_tokens: fixed output lengths
        assert r["ttft_ms"]["p50"] > 0 and r["tpot_ms"]["p50"] > 0 and r["output_tokens_per_s"] > 0
    assert set(saved["speedup"]) == {"1", "2"}  # JSON keys
    assert all(0.3 < s < 3 for s in saved["speedup"].values())  # the same server on both sides
    assert (out / "serve.png").read_bytes()[:4] == b"\x89PNG"
    assert "| speculative | 2 |" in (out / "serve_table.md").read_text()


def test_unreachable_endpoint_is_a_clear_error(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServeBenchError, match="unreachable.*start the server"):
        run_serve_bench({"baseline": url}, ["x"], 4, [1], tmp_path, log=lambda m: None)
    assert json.loads((tmp_path / "serve_results.json").read_text())["errors"]
    res = CliRunner().invoke(app, ["serve", "--baseline-url", url, "--prompts", "humaneval", "--num-prompts", "1",
                                   "-o", str(tmp_path / "cli")])
    assert res.exit_code == 2 and "unreachable" in res.output


def test_helpers():
    assert percentiles([1.0, 2.0, 3.0])["p50"] == 2.0
    base, spec = vllm_commands("google/gemma-3-270m", "runs/drafter", block_size=8)
    assert base.startswith("vllm serve google/gemma-3-270m") and '"num_speculative_tokens": 7' in spec


def test_spec_decode_counters_parsed_from_metrics():
    import asyncio

    from flashdraft.bench.serve_bench import spec_counters

    text = ('# TYPE vllm:spec_decode_num_drafts counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0\n'
            'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 150.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 45.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 9.0\n')

    async def go():
        transport = httpx.MockTransport(lambda req: httpx.Response(200, text=text))
        async with httpx.AsyncClient(transport=transport) as c:
            return await spec_counters(c, "http://x/v1")

    assert asyncio.run(go()) == {"num_drafts": 10.0, "num_draft_tokens": 150.0, "num_accepted_tokens": 45.0}
