"""The ``openai`` backend: OpenAI-compatible ``/v1/completions`` servers (vLLM, SGLang, ...).

Prompts are sent as token ids (the runner renders the chat template itself, so the ids the server
sees are exactly the record's). Requests go round-robin over the servers with at most
``concurrency`` in flight per server; 408/409/425/429/5xx answers, timeouts and connection errors are
retried with exponential backoff (each retry on the next server). A request that still fails comes
back as a Completion with ``error`` set; the runner writes it to the error file and a ``--resume``
run tries it again.
"""

from __future__ import annotations

import asyncio
import random

from flashdraft.generate.backends import Backend, BackendError, Completion, GenParams, Request

RETRY_STATUS = {408, 409, 425, 429}


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, servers: list[str], params: GenParams, model: str | None = None, api_key: str = "EMPTY",
                 concurrency: int = 64, timeout: float = 600.0, max_retries: int = 5, backoff: float = 1.0,
                 tokenizer=None):
        import httpx

        if not servers:
            raise BackendError("backend openai needs at least one server URL, e.g. http://127.0.0.1:8000/v1")
        self.servers = [s.rstrip("/") for s in servers]
        self.params, self.tokenizer = params, tokenizer
        self.concurrency, self.timeout, self.max_retries, self.backoff = concurrency, timeout, max_retries, backoff
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.model = model
        if self.model is None:
            try:
                r = httpx.get(f"{self.servers[0]}/models", headers=self.headers, timeout=timeout)
                r.raise_for_status()
                self.model = r.json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
                raise BackendError(f"could not list models at {self.servers[0]}/models ({e!r}); is the server up? "
                                   "pass --api-model to skip the lookup") from e
        self.requests_per_server = [0] * len(self.servers)

    def body(self, req: Request) -> dict:
        p = self.params
        b = {"model": self.model, "prompt": req.prompt_ids, "max_tokens": req.max_tokens, "temperature": p.temperature,
             "top_p": p.top_p, "skip_special_tokens": False, "return_token_ids": True, "logprobs": None}
        if p.top_k > 0:
            b["top_k"] = p.top_k
        if not p.greedy:
            b["seed"] = p.request_seed(req.key)
        if p.stop:
            b["stop"] = p.stop
        if p.stop_token_ids:
            b["stop_token_ids"] = p.stop_token_ids
        return b

    def _completion(self, choice: dict) -> Completion:
        ids = choice.get("token_ids")
        if ids is None:  # a server without return_token_ids: fall back to tokenising the text
            ids = list(self.tokenizer(choice["text"], add_special_tokens=False)["input_ids"])
        return Completion(list(ids), choice.get("finish_reason") or "stop")

    async def _one(self, client, sems, i: int, req: Request) -> Completion:
        import httpx

        last = ""
        for attempt in range(self.max_retries + 1):
            s = (i + attempt) % len(self.servers)
            async with sems[s]:
                self.requests_per_server[s] += 1
                try:
                    r = await client.post(f"{self.servers[s]}/completions", json=self.body(req), headers=self.headers)
                except httpx.TimeoutException:
                    last = f"timeout after {self.timeout} s at {self.servers[s]}"
                except httpx.TransportError as e:
                    last = f"{type(e).__name__} at {self.servers[s]}: {e}"
                else:
                    if r.status_code == 200:
                        try:
                            return self._completion(r.json()["choices"][0])
                        except (KeyError, IndexError, ValueError) as e:
                            return Completion([], "error", f"bad response from {self.servers[s]}: {e!r} {r.text[:200]}")
                    last = f"HTTP {r.status_code} from {self.servers[s]}: {r.text[:300]}"
                    if r.status_code not in RETRY_STATUS and r.status_code < 500:
                        return Completion([], "error", last)
            if attempt < self.max_retries:
                await asyncio.sleep(self.backoff * 2 ** attempt * (0.5 + random.random()))
        return Completion([], "error", f"{last} (gave up after {self.max_retries} retries)")

    async def _all(self, requests: list[Request]) -> list[Completion]:
        import httpx

        sems = [asyncio.Semaphore(self.concurrency) for _ in self.servers]
        limits = httpx.Limits(max_connections=self.concurrency * len(self.servers))
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as client:
            return await asyncio.gather(*(self._one(client, sems, i, r) for i, r in enumerate(requests)))

    def generate(self, requests: list[Request]) -> list[Completion]:
        return asyncio.run(self._all(requests))
