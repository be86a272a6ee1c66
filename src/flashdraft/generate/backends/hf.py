"""The ``hf`` backend: transformers ``generate`` in-process, batched with left padding."""

from __future__ import annotations

import torch

from flashdraft.generate.backends import Backend, Completion, GenParams, Request


def _device(name: str) -> str:
    if name != "auto":
        return name
    return "cuda" if torch.cuda.is_available() else "cpu"


class HFBackend(Backend):
    """Batches requests of similar length (sorted), pads on the left, cuts each answer at its first stop id."""

    name = "hf"

    def __init__(self, model, params: GenParams, batch_size: int = 16, tokenizer=None):
        self.model, self.params, self.batch_size, self.tokenizer = model, params, batch_size, tokenizer
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self.pad_id = int(pad if pad is not None else (params.stop_token_ids or [0])[0])

    @classmethod
    def load(cls, path: str, params: GenParams, dtype: str = "float32", device: str = "auto", batch_size: int = 16,
             tokenizer=None) -> "HFBackend":
        from transformers import AutoModelForCausalLM

        dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, attn_implementation="sdpa")
        return cls(model.to(_device(device)).eval(), params, batch_size, tokenizer)

    @torch.no_grad()
    def _batch(self, reqs: list[Request]) -> list[Completion]:
        dev = next(self.model.parameters()).device
        width = max(len(r.prompt_ids) for r in reqs)
        ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            att[i, width - len(r.prompt_ids):] = 1
        p = self.params
        kw = dict(do_sample=False) if p.greedy else dict(do_sample=True, temperature=p.temperature, top_p=p.top_p,
                                                         top_k=p.top_k if p.top_k > 0 else None)
        if not p.greedy:
            torch.manual_seed(p.request_seed(reqs[0].key))
        if p.stop:
            kw.update(stop_strings=p.stop, tokenizer=self.tokenizer)
        out = self.model.generate(
            ids.to(dev), attention_mask=att.to(dev), max_new_tokens=max(r.max_tokens for r in reqs),
            eos_token_id=p.stop_token_ids or None, pad_token_id=self.pad_id, **kw,
        )[:, width:].tolist()
        stops = set(p.stop_token_ids)
        res = []
        for r, row in zip(reqs, out):
            cut = next((j + 1 for j, t in enumerate(row) if t in stops), None)
            toks = row[: min(cut or len(row), r.max_tokens)]
            stopped = cut is not None and cut <= r.max_tokens
            if p.stop and not stopped:
                k = self._stop_string_cut(toks)
                stopped, toks = k is not None, toks[:k] if k is not None else toks
            res.append(Completion(toks, "stop" if stopped else "length"))
        return res

    def _stop_string_cut(self, toks: list[int]) -> int | None:
        """Length of the shortest prefix whose text contains a stop string (None: no stop string)."""
        if not any(s in self.tokenizer.decode(toks) for s in self.params.stop):
            return None
        return next(k for k in range(1, len(toks) + 1) if any(s in self.tokenizer.decode(toks[:k]) for s in self.params.stop))

    def generate(self, requests: list[Request]) -> list[Completion]:
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        out: list[Completion | None] = [None] * len(requests)
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            for i, c in zip(idx, self._batch([requests[i] for i in idx])):
                out[i] = c
        return out  # type: ignore[return-value]
