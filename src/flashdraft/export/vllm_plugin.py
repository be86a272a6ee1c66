"""vLLM plugin: block hints for DFlash drafters served by vLLM.

A DFlash drafter trained with ``block_hints: lookup`` reads prompt lookup's chain in its draft slots where
flashdraft's own decoders put it (``flashdraft decode --hints lookup``); vLLM's DFlash proposer fills every
draft slot with MASK, so served as it is such a drafter accepts what ``--hints none`` measures. This plugin,
loaded by vLLM from the ``vllm.general_plugins`` entry point whenever flashdraft is installed beside it,
swaps vLLM's DFlash proposer for one that writes the same hints (:func:`flashdraft.decode.lookup.lookup_hints`
over each request's tokens, the new bonus token last) into the draft slots before the drafter's forward.

It acts only for a drafter whose ``config.json`` says ``block_hints: lookup`` (``flashdraft export --to vllm``
keeps the key); every other DFlash drafter is served exactly as vLLM serves it. Set ``FLASHDRAFT_VLLM_HINTS=0``
to turn it off.

vLLM's DFlash proposer runs before its bookkeeping, so the host's copy of a request's tokens lacks what the step
just committed; :func:`request_histories` rebuilds each history from that copy (below the step's first position),
the step's own accepted input tokens and the bonus token. Output stays the target's own: hints change what is
drafted, never what is verified.
"""

from __future__ import annotations

import logging
import os

import torch

from flashdraft.decode.lookup import lookup_hints

log = logging.getLogger(__name__)
ENV = "FLASHDRAFT_VLLM_HINTS"


def wants_hints(hf_config) -> bool:
    """Whether a drafter's config asks for prompt lookup's hints in its draft slots."""
    return getattr(hf_config, "block_hints", None) == "lookup" and os.environ.get(ENV, "1") != "0"


def request_histories(committed, target_token_ids: torch.Tensor, target_positions: torch.Tensor, bonus: torch.Tensor,
                      query_start: torch.Tensor, rejected: torch.Tensor | None) -> list[torch.Tensor]:
    """Each request's tokens up to and including its new bonus token, as vLLM's padded proposer sees them.

    The proposer runs before vLLM's bookkeeping, so the host copy (``committed`` [R, max_len], a request's row
    valid below the first position this step's forward read) lacks what this step committed: the forward's own
    tokens (``target_token_ids`` [T], request i at ``query_start[i]:query_start[i + 1]`` less its ``rejected[i]``
    drafts, from position ``target_positions`` of its first one), then the bonus (``bonus`` [R])."""
    tokens, positions = target_token_ids.cpu(), target_positions.reshape(-1, target_token_ids.shape[0])[0].cpu()
    rej = rejected.cpu().tolist() if rejected is not None else [0] * len(bonus)
    out = []
    for i, b in enumerate(bonus.tolist()):
        s, e = int(query_start[i]), int(query_start[i + 1]) - int(rej[i])
        start = int(positions[s]) if e > s else 0
        before = torch.as_tensor(committed[i, :start], dtype=torch.long)
        out.append(torch.cat([before, tokens[s:e].long(), torch.tensor([b])]))
    return out


def hinted_proposer_class():
    """A subclass of vLLM's DFlash proposer that writes block hints into the draft slots of a hinted drafter."""
    from vllm.v1.spec_decode.dflash import DFlashProposer

    class HintedDFlashProposer(DFlashProposer):
        def __init__(self, vllm_config, device, runner=None):
            super().__init__(vllm_config, device, runner)
            self.hint_runner = runner  # its input_batch holds each request's tokens on the host
            self.block_hints = wants_hints(self.draft_model_config.hf_config)
            if self.block_hints:
                log.info("flashdraft: prompt lookup's block hints in the DFlash draft slots")

        def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions, target_hidden_states,
                                  token_indices_to_sample, cad, num_rejected_tokens_gpu):
            n, indices, new_cad = super().set_inputs_first_pass(target_token_ids, next_token_ids, target_positions,
                                                                target_hidden_states, token_indices_to_sample, cad,
                                                                num_rejected_tokens_gpu)
            if self.block_hints and self.hint_runner is not None:
                k, batch = self.num_speculative_tokens, next_token_ids.shape[0]
                histories = request_histories(self.hint_runner.input_batch.token_ids_cpu, target_token_ids,
                                              target_positions, next_token_ids, cad.query_start_loc_cpu,
                                              num_rejected_tokens_gpu)
                mask = self.parallel_drafting_token_id
                hints = torch.stack([lookup_hints(h, k, mask) for h in histories])  # [batch, k]
                queries = self.input_ids[: batch * (1 + k)].view(batch, 1 + k)  # [bonus, MASK x k] per request
                queries[:, 1:] = hints.to(queries.device, queries.dtype)
            return n, indices, new_cad

    return HintedDFlashProposer


def register() -> None:
    """The ``vllm.general_plugins`` entry point: serve hinted DFlash drafters with their hints."""
    if os.environ.get(ENV, "1") == "0":
        return
    from vllm.v1.worker import gpu_model_runner

    if getattr(gpu_model_runner.DFlashProposer, "__name__", "") != "HintedDFlashProposer":
        gpu_model_runner.DFlashProposer = hinted_proposer_class()
