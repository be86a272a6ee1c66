"""Generation backends behind one interface: ``generate(requests) -> completions`` (same order).

``vllm``: vLLM's offline engine (one engine per GPU; data parallelism is done by the runner's workers).
``hf``: in-process transformers, batched with left padding (the fallback without vLLM).
``openai``: one or more OpenAI-compatible servers, round-robin, bounded concurrency, retries.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from flashdraft.errors import FlashdraftError


class BackendError(FlashdraftError, RuntimeError):
    """A backend that cannot start (missing package, bad server); the message names the fix."""


@dataclass
class GenParams:
    """Sampling settings shared by every backend (temperature 0 = greedy)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def request_seed(self, key: str) -> int:
        """A per-request seed derived from the sample id: sampled output does not depend on batching."""
        return int(hashlib.sha256(f"{self.seed}:{key}".encode()).hexdigest()[:8], 16)


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    key: str = ""


@dataclass
class Completion:
    token_ids: list[int]
    finish_reason: str = "stop"
    error: str | None = None


class Backend(ABC):
    """One way of running the target; ``generate`` returns one Completion per Request, in order."""

    name = "backend"

    @abstractmethod
    def generate(self, requests: list[Request]) -> list[Completion]: ...

    def close(self) -> None:
        pass


def make_backend(cfg, model_path: str, tokenizer, eos_ids: list[int]) -> Backend:
    """The backend named by ``cfg.backend``."""
    params = GenParams(cfg.temperature, cfg.top_p, cfg.top_k, list(cfg.stop), sorted(set(cfg.stop_token_ids) | set(eos_ids)),
                       cfg.seed)
    if cfg.backend == "hf":
        from flashdraft.generate.backends.hf import HFBackend

        return HFBackend.load(model_path, params, dtype=cfg.dtype, device=cfg.device, batch_size=cfg.batch_size,
                              tokenizer=tokenizer)
    if cfg.backend == "vllm":
        from flashdraft.generate.backends.vllm_engine import VLLMBackend

        return VLLMBackend(model_path, params, cfg)
    if cfg.backend == "openai":
        from flashdraft.generate.backends.openai_api import OpenAIBackend

        return OpenAIBackend(cfg.servers, params, model=cfg.api_model, api_key=cfg.api_key, concurrency=cfg.concurrency,
                             timeout=cfg.request_timeout, max_retries=cfg.max_retries, backoff=cfg.retry_backoff,
                             tokenizer=tokenizer)
    raise BackendError(f"unknown backend {cfg.backend!r}; use vllm, hf or openai")
