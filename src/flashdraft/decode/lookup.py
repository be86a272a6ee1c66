"""Prompt lookup's match (:func:`lookup`), shared by the ``ngram*`` decoders, the drafters' block hints
(:func:`lookup_hints`) and the held-out baselines."""

from __future__ import annotations

import torch

HINT_MAX_N, HINT_MIN_N = 3, 1  # the n-grams block hints match (fixed: a drafter is trained on exactly these hints)


def lookup(tokens: torch.Tensor, k: int, max_n: int = 3, min_n: int = 1, branches: int = 1) -> list[list[int]]:
    """Continuations of earlier occurrences of the context's last n-gram (n = max_n .. min_n), best first.

    tokens: [L] long. A continuation is the ``k`` tokens after an earlier occurrence at s (token L + j is
    copied from s + n + j, from the copy itself past the end, as a repeating period would go on); for
    ``branches`` = 1 the answer is the most recent occurrence of the longest matching n-gram that has
    a continuation. Duplicates are dropped; empty list when nothing matches.
    """
    L = int(tokens.shape[0])
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        windows = tokens[: L - 1].unfold(0, n, 1)  # [L - n, n]: every n-gram that ends before the last token
        hits = (windows == tokens[L - n :]).all(dim=1).nonzero().flatten().tolist()  # start indices
        for s in reversed(hits):  # most recent first
            cont = tokens[s + n : s + n + k].tolist()
            while len(cont) < k:  # the copy runs into the end: keep copying what it predicted (LZ77-style overlap)
                cont.append(cont[s + n + len(cont) - L])
            key = tuple(cont)
            if cont and key not in seen:
                seen.add(key)
                out.append(cont)
                if len(out) >= branches:
                    return out
    return out


def lookup_hints(tokens: torch.Tensor, k: int, mask_id: int) -> torch.Tensor:
    """[k] ids for a block's draft slots (``block_hints: lookup``): the prompt-lookup chain after ``tokens``
    ([L], the anchor last; n = 3 .. 1, the most recent match), or ``mask_id`` everywhere when nothing matches."""
    found = lookup(tokens, k, HINT_MAX_N, HINT_MIN_N)
    if not found:
        return torch.full((k,), mask_id, dtype=torch.long, device=tokens.device)
    return torch.tensor(found[0], dtype=torch.long, device=tokens.device)
