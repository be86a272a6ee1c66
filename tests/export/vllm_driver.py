"""Runs vLLM (CPU build) on token prompts: plain greedy, then with an exported drafter.

vLLM spawns workers, so this is a real file with a ``__main__`` guard, run as a subprocess (:func:`launch`)
by ``test_vllm_serve.py``, ``test_vllm_eagle3_serve.py`` and ``experiments/export_vllm_check.py``. The
engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so a small hook on vLLM's
drafter model records every drafter pass: the query it is given (ids, positions), the embeddings it
computes for them, the target features it receives, and its drafts. Writes one JSON file (and the
recorded tensors next to it, ``OUT_JSON.embeds.pt`` and ``OUT_JSON.tensors.pt``).

usage: vllm_driver.py TARGET_DIR DRAFTER_DIR PROMPTS_JSON MAX_TOKENS OUT_JSON [MODEL_IMPL [METHOD [K [DTYPE [SEQS]]]]]

METHOD is vLLM's speculative method (``dflash``, the default, or ``eagle3``); K is
num_speculative_tokens (default: block_size - 1 from the drafter's config.json); DTYPE the engine's dtype
(``bfloat16``, the default, or ``float32``); SEQS the engine's max_num_seqs (default 1: one request at a time).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

RECORD: dict = {"on": False, "rounds": [], "embeds": [], "features": []}


def _record_passes(cls) -> None:
    """Wrap ``cls.forward`` / ``compute_logits``: one round per forward call, with its drafts."""
    fwd, logits = cls.forward, cls.compute_logits

    def forward(self, input_ids, positions, *args, **kwargs):
        if RECORD["on"]:
            emb = self.model.embed_input_ids(input_ids)  # [q, d] what the drafter's layers receive
            RECORD["rounds"].append({"ids": input_ids.tolist(), "pos": positions.tolist(), "drafts": None})
            RECORD["embeds"].append(emb.float().cpu())
        return fwd(self, input_ids, positions, *args, **kwargs)

    def compute_logits(self, hidden_states):
        out = logits(self, hidden_states)
        if RECORD["on"] and RECORD["rounds"] and out is not None:
            RECORD["rounds"][-1]["drafts"] = out.argmax(-1).tolist()
        return out

    cls.forward, cls.compute_logits = forward, compute_logits


def _record_features(cls) -> None:
    """Wrap ``cls.combine_hidden_states``: the concatenated target features [n, n_aux * d] it fuses."""
    combine = cls.combine_hidden_states

    def combine_hidden_states(self, hidden_states):
        if RECORD["on"]:
            RECORD["features"].append(hidden_states.float().cpu())
        return combine(self, hidden_states)

    cls.combine_hidden_states = combine_hidden_states


def _dflash_hooks() -> None:
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    _record_passes(DFlashQwen3ForCausalLM)


def _eagle3_hooks() -> None:
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

    _record_passes(Eagle3LlamaForCausalLM)
    _record_features(Eagle3LlamaForCausalLM)


HOOKS = {"dflash": _dflash_hooks, "eagle3": _eagle3_hooks}


def spec_metrics(llm) -> dict:
    out: dict = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            key = m.name.removeprefix("vllm:spec_decode_")
            out[key] = list(m.values) if hasattr(m, "values") else m.value
    return out


def run(target: str, drafter: str | None, prompts: list[list[int]], max_tokens: int, method: str, k: int,
        impl: str, dtype: str = "bfloat16", max_num_seqs: int = 1) -> dict:
    from vllm import LLM, SamplingParams

    kw = dict(model=target, dtype=dtype, enforce_eager=True, max_model_len=512, max_num_seqs=max_num_seqs, seed=0,
              model_impl=impl, disable_log_stats=False)
    if drafter:
        kw["speculative_config"] = {"method": method, "model": drafter, "num_speculative_tokens": k}
    llm = LLM(**kw)
    RECORD.update(on=True, rounds=[], embeds=[], features=[])
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    RECORD["on"] = False
    res = {"outputs": [list(o.outputs[0].token_ids) for o in outs], "metrics": spec_metrics(llm)}
    del llm
    gc.collect()
    return res


def main() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vLLM is imported (the hooks, run)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    target, drafter, prompts_json, max_tokens, out_json = sys.argv[1:6]
    impl = sys.argv[6] if len(sys.argv) > 6 else "transformers"
    method = sys.argv[7] if len(sys.argv) > 7 else "dflash"
    if len(sys.argv) > 8:
        k = int(sys.argv[8])
    else:
        k = json.loads(open(os.path.join(drafter, "config.json")).read()).get("block_size", 16) - 1
    dtype = sys.argv[9] if len(sys.argv) > 9 else "bfloat16"
    seqs = int(sys.argv[10]) if len(sys.argv) > 10 else 1
    prompts = json.loads(open(prompts_json).read())
    HOOKS[method]()
    plain = run(target, None, prompts, int(max_tokens), method, k, impl, dtype, seqs)
    spec = run(target, drafter, prompts, int(max_tokens), method, k, impl, dtype, seqs)
    import torch

    torch.save(RECORD["embeds"], out_json + ".embeds.pt")
    torch.save({"embeds": RECORD["embeds"], "features": RECORD["features"]}, out_json + ".tensors.pt")
    with open(out_json, "w") as f:
        json.dump({"plain": plain, "spec": spec, "rounds": RECORD["rounds"], "model_impl": impl, "method": method, "dtype": dtype,
                   "num_speculative_tokens": k}, f)


def launch(drafter: str, prompts: list[list[int]], max_tokens: int, workdir, *args: str, threads: int = 1,
           timeout: float | None = 900, target_dir: str | Path | None = None) -> dict:
    """Run this driver in a subprocess on ``target_dir`` (default: the embedded target; what the tests and the
    export check do): ``args`` are the optional MODEL_IMPL, METHOD, K, DTYPE, SEQS. Returns the result JSON; the
    recorded tensors lie next to ``workdir/result.json``. A failed run raises RuntimeError with the driver's
    output tail."""
    from flashdraft.models.target import embedded_target_dir

    work = Path(workdir)
    (work / "prompts.json").write_text(json.dumps(prompts))
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS=str(threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
    cmd = [sys.executable, __file__, str(target_dir or embedded_target_dir()), str(drafter), str(work / "prompts.json"),
           str(max_tokens), str(work / "result.json"), *map(str, args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM driver failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return json.loads((work / "result.json").read_text())


if __name__ == "__main__":
    main()
