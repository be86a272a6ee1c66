"""Throughput of ``flashdraft generate``: the vllm backend vs raw ``vllm.LLM.generate``, and the hf backend.

Not a test. The same prompts (stdlib-code prompts, rendered the way the pipeline renders them) go
through (1) ``vllm.LLM.generate`` called directly, (2) the full pipeline with the ``vllm`` backend on
the same engine (selection, rendering, records, Parquet writes included), (3) the ``hf`` backend
batched and (4) unbatched. Prints generated tokens/s for each and the pipeline overhead vs raw vLLM
(goal: <= 10%).

    python experiments/generate_throughput.py --prompts 64 --max-tokens 64 [--dtype bfloat16] [--eager]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--eager", action="store_true", help="vllm enforce_eager (faster start, slower decode)")
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--hf-unbatched-prompts", type=int, default=8, help="prompts for the slow unbatched hf run")
    ap.add_argument("--hf-dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=2, help="alternating raw/pipeline runs; the best of each counts")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()

    from flashdraft.generate.backends import GenParams
    from flashdraft.generate.backends.vllm_engine import VLLMBackend
    from flashdraft.generate.config import GenerateConfig
    from flashdraft.generate.runner import Runner, select
    from flashdraft.models.target import resolve_target_path

    out = tempfile.mkdtemp(prefix="gen-bench-")
    cfg = GenerateConfig(sources=["stdlib-code"], limit=a.prompts, target=a.target, backend="vllm", dtype=a.dtype,
                         max_tokens=a.max_tokens, enforce_eager=a.eager, max_model_len=2048, progress=False,
                         output=f"{out}/vllm", chunk_size=max(a.prompts, 1))
    runner = Runner(cfg)
    path = resolve_target_path(a.target)
    t = time.perf_counter()
    backend = VLLMBackend(path, GenParams(stop_token_ids=runner.eos), cfg)
    start_s = time.perf_counter() - t
    runner._backend = backend
    prompts = [runner.renderer.next_prompt(runner.renderer.start(s)) for s in select(cfg)]
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, stop_token_ids=runner.eos, detokenize=False)
    tp = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    backend.llm.generate(tp[:4], sp, use_tqdm=False)  # warm-up
    res = {"prompts": len(prompts), "max_tokens": a.max_tokens, "dtype": a.dtype, "eager": a.eager,
           "engine_start_s": round(start_s, 1)}
    inner = {"s": 0.0}
    gen = backend.generate

    def timed_generate(reqs):  # time spent inside the engine during the pipeline run
        t0 = time.perf_counter()
        try:
            return gen(reqs)
        finally:
            inner["s"] += time.perf_counter() - t0

    backend.generate = timed_generate
    raws, pipes = [], []
    for rep in range(a.repeats):  # alternate, keep the best of each: the machine may be shared
        t = time.perf_counter()
        outs = backend.llm.generate(tp, sp, use_tqdm=False)
        raws.append(time.perf_counter() - t)
        raw_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        inner["s"] = 0.0
        runner.cfg = cfg.model_copy(update={"output": f"{out}/vllm{rep}"})
        t = time.perf_counter()
        m = runner.run()
        pipes.append((time.perf_counter() - t, inner["s"]))
    raw_s = min(raws)
    pipe_s, engine_s = min(pipes)
    res["raw_vllm"] = {"tokens": raw_tokens, "s": round(raw_s, 2), "tok_s": round(raw_tokens / raw_s, 1)}
    res["vllm_backend"] = {"tokens": m["tokens"]["response"], "s": round(pipe_s, 2),
                           "tok_s": round(m["tokens"]["response"] / pipe_s, 1), "inside_engine_s": round(engine_s, 2)}
    res["overhead_pct_vs_raw"] = round(100 * (1 - res["vllm_backend"]["tok_s"] / res["raw_vllm"]["tok_s"]), 1)
    res["overhead_pct_outside_engine"] = round(100 * (pipe_s - engine_s) / pipe_s, 1)
    backend.close()
    if not a.skip_hf:
        for name, bs, n in (("hf_batched", a.hf_batch, a.prompts), ("hf_unbatched", 1, a.hf_unbatched_prompts)):
            c = cfg.model_copy(update={"backend": "hf", "dtype": a.hf_dtype, "batch_size": bs, "limit": n, "output": f"{out}/{name}"})
            t = time.perf_counter()
            m = Runner(c).run()
            s = time.perf_counter() - t
            res[name] = {"prompts": n, "batch_size": bs, "tokens": m["tokens"]["response"], "s": round(s, 2),
                         "tok_s": round(m["tokens"]["response"] / s, 1)}
    print(json.dumps(res, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
