"""Speedup vs concurrency of an exported drafter served by vLLM (CPU build), next to `bench model`.

Steps (one run, everything measured on this machine):
1. ``flashdraft export DRAFTER --to vllm`` for the embedded Gemma-3-270M target;
2. two vLLM OpenAI servers at once: the target plain, and the target with the exported drafter
   (same settings: bf16, eager, Transformers model implementation, which Gemma needs for DFlash);
3. ``flashdraft bench serve`` logic against both at concurrency 1, 2, 4, 8, reading vLLM's real
   spec-decode counters from ``/metrics``;
4. ``flashdraft bench decode`` (acceptance) + ``flashdraft bench model --profile`` (HF costs on this
   CPU) for the same drafter, chain of B - 1 drafts, concurrency 1, 2, 4, 8;
5. ``summary.md``: measured speedup per concurrency next to the predicted one.

usage: python experiments/export_serve_concurrency.py [--drafter assets/gemma-3-270m-dflash] [--out runs/export_serve]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(target: str, port: int, log: Path, spec: dict | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--dtype", "bfloat16",
           "--enforce-eager", "--model-impl", "transformers", "--max-model-len", "1024", "--port", str(port),
           "--host", "127.0.0.1"]
    if spec:
        cmd += ["--speculative-config", json.dumps(spec)]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    with open(log, "w") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)


def wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout: float = 900) -> str:
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"vLLM server on port {port} not up after {timeout} s; see {log}")


def fd(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "flashdraft.cli", *args], check=True, env=env)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", default=str(ROOT / "assets" / "gemma-3-270m-dflash"))
    ap.add_argument("--out", default="runs/export_serve")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--skip-model", action="store_true", help="skip bench decode/model (prediction)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from flashdraft.bench.decode_bench import load_prompt_set
    from flashdraft.bench.serve_bench import run_serve_bench, serve_table
    from flashdraft.models.target import embedded_target_dir

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    target = str(embedded_target_dir())
    levels = [int(x) for x in a.levels.split(",")]
    exported = out / "drafter-vllm"
    fd("export", a.drafter, "--to", "vllm", "-o", str(exported), "--target-ref", target, "--dtype", "bfloat16")
    block = json.loads((exported / "config.json").read_text())["block_size"]
    spec = {"method": "dflash", "model": str(exported.resolve()), "num_speculative_tokens": block - 1}
    ports = free_port(), free_port()
    t0 = time.time()
    procs = [start_server(target, ports[0], out / "baseline.log", None),
             start_server(target, ports[1], out / "speculative.log", spec)]
    try:
        urls = [wait_ready(p, port, out / name) for p, port, name in zip(procs, ports, ("baseline.log", "speculative.log"))]
        print(f"servers up after {time.time() - t0:.0f} s", flush=True)
        _, texts = load_prompt_set("humaneval", a.num_prompts)
        res = run_serve_bench({"baseline": urls[0], "speculative": urls[1]}, texts, a.max_tokens, levels, out)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    md = ["# Exported drafter in vLLM (CPU): speedup vs concurrency", "",
          f"target {target}, drafter {a.drafter} exported --to vllm, B={block}, {a.num_prompts} humaneval prompts x "
          f"{a.max_tokens} tokens per level, eager, model_impl=transformers, bf16", "", serve_table(res)]
    pred = None
    if not a.skip_model:
        fd("bench", "decode", "--drafter", a.drafter, "--limit", "2", "--max-new-tokens", str(a.max_tokens),
           "--repeats", "1", "--budgets", str(block - 1), "-o", str(out / "decode"))
        fd("bench", "model", "--profile", "--drafter", a.drafter, "--decode-results", str(out / "decode" / "results.json"),
           "--concurrency", a.levels, "--budgets", str(block - 1), "--profile-repeats", "3", "-o", str(out / "model"))
        pred = json.loads((out / "model" / "model_prediction.json").read_text())
    md += ["| concurrency | measured speedup (vLLM) | vLLM tau | predicted chain speedup (bench model) |", "|---|---|---|---|"]
    for c in levels:
        row = next((r for r in res["rows"] if r["endpoint"] == "speculative" and r["concurrency"] == c), {})
        tau = (row.get("spec_decode") or {}).get("mean_acceptance_length")
        p = None
        if pred:
            p = next((r["speedup"] for r in pred["rows"] if r["concurrency"] == c and r["method"] == "dflash"), None)
        sp = res["speedup"].get(c)
        md.append(f"| {c} | {'n/a' if sp is None else f'{sp:.2f}'} | {'n/a' if tau is None else f'{tau:.2f}'} | "
                  f"{'n/a' if p is None else f'{p:.2f}'} |")
    (out / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
