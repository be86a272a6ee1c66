"""Runs vLLM (CPU build) on token prompts: plain greedy, then with an exported DFlash drafter.

vLLM spawns workers, so this is a real file with a ``__main__`` guard, run as a subprocess by
``test_vllm_serve.py`` and ``experiments/export_vllm_check.py``. The engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so a small hook on vLLM's DFlash model records, every
round, the query block it is given (ids, positions), the embeddings it computes for them and the
drafts it proposes. Writes one JSON file.

usage: vllm_driver.py TARGET_DIR DRAFTER_DIR PROMPTS_JSON MAX_TOKENS OUT_JSON [MODEL_IMPL]
"""

from __future__ import annotations

import gc
import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

RECORD: dict = {"on": False, "rounds": [], "embeds": []}


def install_hooks() -> None:
    import torch
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    fwd, logits = DFlashQwen3ForCausalLM.forward, DFlashQwen3ForCausalLM.compute_logits

    def forward(self, input_ids, positions, inputs_embeds=None):
        if RECORD["on"]:
            emb = self.model.embed_input_ids(input_ids)  # [q, d] what the drafter's layers receive
            RECORD["rounds"].append({"ids": input_ids.tolist(), "pos": positions.tolist(), "drafts": None})
            RECORD["embeds"].append(emb.float().cpu())
        return fwd(self, input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states):
        out = logits(self, hidden_states)
        if RECORD["on"] and RECORD["rounds"] and out is not None:
            RECORD["rounds"][-1]["drafts"] = out.argmax(-1).tolist()
        return out

    DFlashQwen3ForCausalLM.forward, DFlashQwen3ForCausalLM.compute_logits = forward, compute_logits
    _ = torch


def spec_metrics(llm) -> dict:
    out: dict = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            key = m.name.removeprefix("vllm:spec_decode_")
            out[key] = list(m.values) if hasattr(m, "values") else m.value
    return out


def run(target: str, drafter: str | None, prompts: list[list[int]], max_tokens: int, block: int, impl: str) -> dict:
    from vllm import LLM, SamplingParams

    kw = dict(model=target, dtype="bfloat16", enforce_eager=True, max_model_len=512, max_num_seqs=1, seed=0,
              model_impl=impl, disable_log_stats=False)
    if drafter:
        kw["speculative_config"] = {"method": "dflash", "model": drafter, "num_speculative_tokens": block - 1}
    llm = LLM(**kw)
    RECORD.update(on=True, rounds=[], embeds=[])
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    RECORD["on"] = False
    res = {"outputs": [list(o.outputs[0].token_ids) for o in outs], "metrics": spec_metrics(llm)}
    del llm
    gc.collect()
    return res


def main() -> None:
    target, drafter, prompts_json, max_tokens, out_json = sys.argv[1:6]
    impl = sys.argv[6] if len(sys.argv) > 6 else "transformers"
    prompts = json.loads(open(prompts_json).read())
    block = json.loads(open(os.path.join(drafter, "config.json")).read()).get("block_size", 16)
    install_hooks()
    plain = run(target, None, prompts, int(max_tokens), block, impl)
    spec = run(target, drafter, prompts, int(max_tokens), block, impl)
    import torch

    torch.save(RECORD["embeds"], out_json + ".embeds.pt")
    with open(out_json, "w") as f:
        json.dump({"plain": plain, "spec": spec, "rounds": RECORD["rounds"], "model_impl": impl}, f)


if __name__ == "__main__":
    main()
