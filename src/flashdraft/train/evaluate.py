"""Real decoding acceptance during and after training: DFlash (and DDTree) tau on held-out prompts."""

from __future__ import annotations

from pathlib import Path

import torch

from flashdraft import records
from flashdraft.decode import build_decoder
from flashdraft.models.chat import ChatSettings, Prompt
from flashdraft.models.draft_vocab import vocab_coverage
from flashdraft.train.objective import TrainError


def load_eval_prompts(path: str | Path, target, n: int, chat: ChatSettings | None = None) -> list[list[int]]:
    """First ``n`` prompts of a prompt file (``{"prompt": str}``, ``{"prompt_ids": [...]}``, chat records: the
    turns before the first answer) as token ids, rendered by ``chat`` (default: raw text; the trainer passes the
    rendering its training sequences were made with)."""
    if not Path(path).exists():
        raise TrainError(f"eval prompts {path} do not exist; pass a JSONL of {{prompt}} or {{prompt_ids}} records")
    chat = chat or ChatSettings("never")
    return [x if isinstance(x, list) else chat.encode(target, Prompt(text=records.prompt_text(x),
                                                                      messages=tuple(records.prompt_turns(x))))
            for _, x in records.read_prompt_rows(path, n)]


@torch.no_grad()
def evaluate_tau(
    target, drafter, prompts: list[list[int]], max_new_tokens: int, method: str = "dflash", budget: int | None = None
) -> dict:
    """Greedy decoding of every prompt with ``method``; tau = tokens per verify round (bonus included).

    Returns tau_mean over all rounds, tau per prompt, per-position acceptance over all rounds and tokens.
    """
    was_training = drafter.training
    drafter.eval()
    try:
        dec = build_decoder(method, target, drafter, budget=budget)
        taus: list[int] = []
        per_prompt, outputs = [], []
        for ids in prompts:
            g = dec.generate(ids, max_new_tokens)
            taus.extend(g.stats.taus)
            per_prompt.append(g.stats.tau_mean)
            outputs.append(g.tokens)
        depth = drafter.max_depth
        rounds = max(len(taus), 1)
        per_pos = [sum(t >= k + 1 for t in taus) / rounds for k in range(1, depth + 1)]
        t2d = getattr(drafter, "t2d", None)  # a reduced draft vocabulary: what it covers of the (lossless) outputs
        coverage = {"vocab_coverage": vocab_coverage(t2d.cpu(), outputs, depth)} if isinstance(t2d, torch.Tensor) else {}
        return {
            **coverage,
            "method": method,
            "budget": budget,
            "tau": sum(taus) / rounds,
            "tau_per_prompt": per_prompt,
            "per_position_acceptance": per_pos,
            "rounds": len(taus),
            "prompts": len(prompts),
        }
    finally:
        drafter.reset()
        drafter.train(was_training)
