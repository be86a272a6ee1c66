"""``bench serve``: a concurrency sweep against OpenAI-compatible endpoints (baseline vs speculative).

Each level sends the same fixed prompts (``max_tokens`` each, ``ignore_eos`` so lengths are fixed on
servers that support it) with at most ``c`` requests in flight, streaming, and records per request
TTFT (first streamed text) and TPOT ((end - first token) / (tokens - 1)). One warm-up request per
endpoint is excluded. Acceptance comes from vLLM's ``/metrics`` spec-decode counters when present
(difference before/after the level). Results are written after every (endpoint, level).
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from pathlib import Path

import httpx

from flashdraft.errors import FlashdraftError
from flashdraft.io import atomic_write_text, make_output_dir

SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


class ServeBenchError(FlashdraftError, ValueError):
    """An endpoint or input that cannot be benchmarked; the message names it and the fix."""


def vllm_commands(target: str, drafter: str | None, block_size: int = 16, port: int = 8000) -> list[str]:
    """The command lines a user would run for the baseline and the speculative (DFlash) servers
    (for a folder written by ``flashdraft export``: the commands ``flashdraft serve-cmd`` prints)."""
    if drafter and (Path(drafter) / "config.json").is_file():
        from flashdraft.export.serve import serve_commands

        cmds = serve_commands(drafter, target, port=port)
        if "vllm" in cmds:
            return [cmds["vllm_baseline"], cmds["vllm"]]
    spec = json.dumps({"method": "dflash", "model": drafter or "DRAFTER_DIR", "num_speculative_tokens": block_size - 1})
    return [f"vllm serve {target} --port {port}",
            f"vllm serve {target} --port {port + 1} --speculative-config '{spec}'"]


def percentiles(xs: list[float]) -> dict:
    if not xs:
        return dict(p50=float("nan"), p90=float("nan"), p99=float("nan"), mean=float("nan"))
    q = statistics.quantiles(xs, n=100, method="inclusive") if len(xs) > 1 else [xs[0]] * 99
    return dict(p50=q[49], p90=q[89], p99=q[98], mean=statistics.fmean(xs))


def _root(url: str) -> str:
    return re.sub(r"/v1/?$", "", url.rstrip("/"))


async def model_id(client: httpx.AsyncClient, url: str) -> str:
    """The first model the endpoint serves (also the reachability check)."""
    try:
        r = await client.get(f"{url.rstrip('/')}/models")
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ServeBenchError(
            f"endpoint {url} is unreachable or not OpenAI-compatible ({type(e).__name__}: {e}); start the server "
            "(e.g. `vllm serve TARGET`) or fix the URL (it must end in /v1)") from None


async def spec_counters(client: httpx.AsyncClient, url: str) -> dict | None:
    """vLLM spec-decode counters from /metrics (summed over label sets), or None when absent."""
    try:
        r = await client.get(f"{_root(url)}/metrics")
        if r.status_code != 200:
            return None
    except httpx.HTTPError:
        return None
    out = {}
    for line in r.text.splitlines():
        for name in SPEC_COUNTERS:
            m = re.match(rf"vllm:spec_decode_{name}(?:_total)?(?:{{[^}}]*}})?\s+([0-9.eE+-]+)$", line)
            if m:
                out[name] = out.get(name, 0.0) + float(m.group(1))
    return out or None


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
                      ignore_eos: bool) -> dict:
    """One streamed completion -> {ttft, tpot, tokens, latency} (seconds)."""
    body = dict(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
                stream_options={"include_usage": True})
    if ignore_eos:
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    first, chunks, usage = None, 0, None
    async with client.stream("POST", f"{url.rstrip('/')}/completions", json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")[:300]
            raise ServeBenchError(f"{url}/completions answered HTTP {r.status_code}: {text}")
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            if ev.get("usage"):
                usage = ev["usage"]
            if ev.get("choices") and ev["choices"][0].get("text"):
                chunks += 1
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    tokens = int(usage["completion_tokens"]) if usage else chunks
    first = first or end
    return dict(ttft=first - t0, latency=end - t0, tokens=tokens,
                tpot=(end - first) / (tokens - 1) if tokens > 1 else float("nan"))


async def run_level(client, url, model, prompts, max_tokens, concurrency, ignore_eos) -> dict:
    """All prompts with at most ``concurrency`` in flight -> aggregated metrics."""
    sem = asyncio.Semaphore(concurrency)

    async def go(p):
        async with sem:
            return await one_request(client, url, model, p, max_tokens, ignore_eos)

    before = await spec_counters(client, url)
    t0 = time.perf_counter()
    reqs = await asyncio.gather(*(go(p) for p in prompts))
    wall = time.perf_counter() - t0
    after = await spec_counters(client, url)
    row = dict(concurrency=concurrency, requests=len(reqs), wall_s=wall,
               output_tokens=sum(r["tokens"] for r in reqs),
               output_tokens_per_s=sum(r["tokens"] for r in reqs) / wall,
               ttft_ms=percentiles([1e3 * r["ttft"] for r in reqs]),
               tpot_ms=percentiles([1e3 * r["tpot"] for r in reqs if r["tpot"] == r["tpot"]]),
               latency_ms=percentiles([1e3 * r["latency"] for r in reqs]))
    if before is not None and after is not None:
        d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTERS}
        row["spec_decode"] = dict(d, acceptance_rate=d["num_accepted_tokens"] / d["num_draft_tokens"]
                                  if d["num_draft_tokens"] else None,
                                  mean_acceptance_length=1 + d["num_accepted_tokens"] / d["num_drafts"]
                                  if d["num_drafts"] else None)
    return row


async def _sweep(endpoints: dict[str, str], prompts: list[str], max_tokens: int, levels: list[int],
                 ignore_eos: bool, out_dir: Path, timeout_s: float, log) -> dict:
    results = dict(endpoints=endpoints, prompts=len(prompts), max_tokens=max_tokens, levels=levels,
                   ignore_eos=ignore_eos, partial=True, rows=[], speedup={}, errors=[])
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0)) as client:
        models = {}
        for name, url in endpoints.items():
            try:
                models[name] = await model_id(client, url)
                await one_request(client, url, models[name], prompts[0], min(4, max_tokens), ignore_eos)  # warm-up
            except ServeBenchError as e:
                results["errors"].append(str(e))
                log(f"error: {e}")
        for c in levels:
            for name, url in endpoints.items():
                if name not in models:
                    continue
                try:
                    row = await run_level(client, url, models[name], prompts, max_tokens, c, ignore_eos)
                except (ServeBenchError, httpx.HTTPError) as e:
                    results["errors"].append(f"{name} c={c}: {e}")
                    log(f"error: {name} c={c}: {e}")
                    continue
                results["rows"].append(dict(row, endpoint=name))
                log(f"{name} c={c}: {row['output_tokens_per_s']:.1f} tok/s, TTFT p50 {row['ttft_ms']['p50']:.0f} ms, "
                    f"TPOT p50 {row['tpot_ms']['p50']:.1f} ms")
                _speedups(results)
                atomic_write_text(out_dir / "serve_results.json", json.dumps(results, indent=1))
    results["partial"] = False
    atomic_write_text(out_dir / "serve_results.json", json.dumps(results, indent=1))
    return results


def _speedups(results: dict) -> None:
    by = {(r["endpoint"], r["concurrency"]): r for r in results["rows"]}
    results["speedup"] = {c: by[("speculative", c)]["output_tokens_per_s"] / by[("baseline", c)]["output_tokens_per_s"]
                          for (e, c) in by if e == "baseline" and ("speculative", c) in by}


def run_serve_bench(endpoints: dict[str, str], prompts: list[str], max_tokens: int, levels: list[int],
                    out_dir: Path, ignore_eos: bool = True, timeout_s: float = 300.0, log=print) -> dict:
    """Sweep ``levels`` on every endpoint ({"baseline": url, "speculative": url}); write serve_results.json."""
    if not prompts:
        raise ServeBenchError("no prompts: give --prompts humaneval or a JSONL file with a 'prompt' field")
    out_dir = Path(out_dir)
    make_output_dir(out_dir)
    res = asyncio.run(_sweep(endpoints, prompts, max_tokens, levels, ignore_eos, out_dir, timeout_s, log))
    if not res["rows"]:
        raise ServeBenchError("no endpoint answered: " + "; ".join(res["errors"]))
    return res


def serve_table(results: dict) -> str:
    lines = ["| endpoint | c | tok/s | TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms | speedup | acceptance |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(results["rows"], key=lambda r: (r["concurrency"], r["endpoint"])):
        t, p = r["ttft_ms"], r["tpot_ms"]
        sp = results["speedup"].get(r["concurrency"]) if r["endpoint"] == "speculative" else None
        acc = (r.get("spec_decode") or {}).get("mean_acceptance_length")
        lines.append(f"| {r['endpoint']} | {r['concurrency']} | {r['output_tokens_per_s']:.1f} | "
                     f"{t['p50']:.0f}/{t['p90']:.0f}/{t['p99']:.0f} | {p['p50']:.1f}/{p['p90']:.1f}/{p['p99']:.1f} | "
                     f"{'' if sp is None else f'{sp:.2f}'} | {'n/a' if acc is None else f'tau {acc:.2f}'} |")
    return "\n".join(lines) + "\n"
