"""AR, DFlash and DDTree decoding: one draft-verify-walk loop, three tree shapes.

Each round the bonus token (root) and the drafted nodes are verified in ONE target forward
(depth-based position ids, ancestor-only visibility), then a walk from the root follows the child
whose token equals the target's choice at the current node; the first target choice without a
matching child becomes the next bonus. The target KV cache is compacted to the walked path.

Losslessness. Every emitted token is the target's own choice given the committed prefix: at T = 0
the argmax (so greedy output equals AR token for token); at T > 0 a fresh sample from
softmax(logits / T) of the target at that node ("sample-and-walk", DDTree's rule; for a chain it is
z-lab's DFlash rule). Drafted tokens only decide how many such samples one forward yields, never
which values they take, so every emitted token is an exact sample of the target's distribution.
The drafter's probabilities are never used for acceptance.

Hybrid targets (recurrent layers): the verify forward also gets the tree's parents, so every node's
recurrent state is computed from its parent's, and compaction keeps the state of the last accepted
node (see :mod:`flashdraft.models.recurrent`). The same argument then holds node for node.
"""

from __future__ import annotations

import math
import time

import torch

from flashdraft.decode.base import DecodeError, Decoder, DecodeStats, Generation, register
from flashdraft.decode.lookup import lookup_hints
from flashdraft.decode.sizing import SIZINGS, VerifyCosts, cost_sized, verify_costs
from flashdraft.decode.tree import DraftTree, argmax_chain, best_first_tree, best_first_tree_by, root_only, tree_marginals
from flashdraft.models.drafter import is_stepwise, propose_scores
from flashdraft.models.forward import cache_length, compact_cache, lm_logits, new_cache, target_forward
from flashdraft.models.target import Target


def choose(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    """The target's token for one node: argmax at T = 0, else a sample of softmax(logits / T)."""
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


def committed(tokens: list[int], room: int, stop: set[int]) -> list[int]:
    """The part of a round's ``tokens`` (accepted drafts + bonus) that is output: at most ``room`` tokens, up to
    and including the first stop token. A round's tau counts these, so the last round of a generation cut
    at ``max_new_tokens`` or at EOS adds only what it emitted (tau = tokens committed / verify rounds)."""
    tokens = tokens[:room]
    for i, t in enumerate(tokens):
        if t in stop:
            return tokens[: i + 1]
    return tokens


class _Timer:
    def __init__(self, stats: DecodeStats):
        self.stats, self.t = stats, time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stats.stage_seconds[stage] += now - self.t
        self.t = now


class SpeculativeDecoder(Decoder):
    """The shared loop; subclasses say how a round's tree is drafted (:meth:`draft_tree`)."""

    def __init__(self, target: Target, drafter=None, budget: int | None = None):
        if self.needs_drafter and drafter is None:
            raise DecodeError(f"method {self.method!r} needs a drafter; pass --drafter PATH (or use --method ar)")
        if budget is not None and budget < 1:
            raise DecodeError(f"--budget must be >= 1 (number of drafted tree nodes), got {budget}")
        self.target, self.drafter, self.budget = target, drafter, budget
        self.layer_ids: list[int] = list(drafter.target_layer_ids) if drafter is not None else []

    @classmethod
    def create(cls, target: Target, drafter=None, budget: int | None = None, **options) -> "SpeculativeDecoder":
        return cls(target, drafter=drafter, budget=budget, **options)

    @property
    def max_depth(self) -> int:
        return 0 if self.drafter is None else self.drafter.max_depth

    def draft(self, tokens: torch.Tensor, feats: torch.Tensor | None):
        """The drafter's proposal for the round after ``tokens`` (committed ids, the bonus last), given the
        features of the newly committed positions; :meth:`draft_tree` turns it into the verified tree."""
        return self.drafter.propose(tokens, feats) if self.drafter is not None else None

    def draft_tree(self, root: int, draft_logits: torch.Tensor | None) -> DraftTree:
        raise NotImplementedError

    def recurrent_parents(self, tree: DraftTree) -> list[int]:
        """The parent each node's recurrent state starts from (hybrid targets): its tree parent."""
        return tree.parents

    # On a CPU every LM-head row costs (Gemma-3-270M, one core: 46 / 59 / 68 / 96 ms for 1 / 2 / 4 / 8 rows), so the
    # walk's batches stop before nodes the drafter gives less than this chance of being reached.
    CPU_SPINE_MIN_PROB = 0.1

    def spine(self, tree: DraftTree, start: int = 0) -> list[int]:
        """The nodes the walk scores in one LM-head batch from ``start``: the best-child path from there, on a CPU
        cut before a node the drafter gives less than :attr:`CPU_SPINE_MIN_PROB` of being reached from ``start``
        (on a GPU extra rows cost nothing, so the whole path)."""
        return tree.spine(start, self.spine_min_logprob())

    def spine_min_logprob(self) -> float:
        """The log-probability (relative to the batch's first node) below which :meth:`spine` stops."""
        return math.log(self.CPU_SPINE_MIN_PROB) if self.target.device.type == "cpu" else -math.inf

    def walk(self, tree: DraftTree, hidden: torch.Tensor, temperature: float, gen: torch.Generator):
        """Follow the target's choices through the tree -> (accepted path node indices, next bonus token).

        Logits are computed lazily: the spine (:meth:`spine`) in one batch; when the walk reaches a node
        outside it, that node's own spine in another, so an LM head over a large vocabulary is paid for
        (about) the visited nodes only.
        """
        spine = self.spine(tree)
        logits = dict(zip(spine, lm_logits(self.target, hidden[spine])))
        node, path = 0, [0]
        while True:
            if node not in logits:
                rows = self.spine(tree, node)
                logits.update(zip(rows, lm_logits(self.target, hidden[rows])))
            tok = choose(logits[node], temperature, gen)
            child = tree.children[node].get(tok)
            if child is None:
                return path, tok
            path.append(child)
            node = child

    def check_request(self, prompt_ids, max_new_tokens: int, temperature: float) -> torch.Tensor:
        if prompt_ids is None or len(prompt_ids) == 0:
            raise DecodeError("empty prompt: give at least one token (text prompts are tokenised with the target's tokenizer)")
        if max_new_tokens < 1:
            raise DecodeError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise DecodeError(f"temperature must be >= 0, got {temperature}")
        ids = torch.as_tensor(list(prompt_ids), dtype=torch.long, device=self.target.device)
        if int(ids.min()) < 0 or int(ids.max()) >= self.target.vocab_size:
            raise DecodeError(f"prompt token ids must lie in 0..{self.target.vocab_size - 1} (the target vocabulary)")
        limit = getattr(self.target.config, "max_position_embeddings", None)
        if limit and len(ids) + max_new_tokens + self.max_depth > limit:
            raise DecodeError(
                f"prompt ({len(ids)}) + max_new_tokens ({max_new_tokens}) exceeds the target's {limit} positions; "
                "shorten the prompt or lower max_new_tokens"
            )
        return ids

    def generate(self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, seed: int = 0) -> Generation:
        ids = self.check_request(prompt_ids, max_new_tokens, temperature)
        dev = ids.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        stop = set(self.target.eos_token_ids)
        stats = DecodeStats(method=self.method, prompt_tokens=len(ids), max_depth=self.max_depth)
        t_start = time.perf_counter()
        timer = _Timer(stats)

        cache = new_cache(self.target)
        if self.drafter is not None:
            self.drafter.reset()
        n = len(ids)
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril_()
        hidden, feats = target_forward(self.target, cache, ids, torch.arange(n, device=dev), causal, self.layer_ids)
        bonus = choose(lm_logits(self.target, hidden[-1:])[0], temperature, gen)
        out = [bonus]
        tokens = torch.cat([ids, ids.new_tensor([bonus])])  # committed ids, the bonus last
        timer.lap("prefill")

        while len(out) < max_new_tokens and out[-1] not in stop:
            draft_logits = self.draft(tokens, feats)
            timer.lap("draft")
            tree = self.draft_tree(bonus, draft_logits)
            visible = tree.visibility(dev)
            timer.lap("tree_build")
            past = cache_length(cache)  # == position of the root
            node_ids = torch.tensor(tree.tokens, dtype=torch.long, device=dev)
            positions = past + torch.tensor(tree.depths, dtype=torch.long, device=dev)
            hidden, feats = target_forward(self.target, cache, node_ids, positions, visible, self.layer_ids,
                                           tree_parents=self.recurrent_parents(tree))
            path, bonus = self.walk(tree, hidden, temperature, gen)
            timer.lap("verify")
            keep = torch.tensor(path, dtype=torch.long, device=dev)
            compact_cache(cache, past, keep)
            if feats is not None:
                feats = feats.index_select(0, keep)  # [len(path), K * hidden]: features of committed tokens
            new = committed([tree.tokens[i] for i in path[1:]] + [bonus], max_new_tokens - len(out), stop)
            out.extend(new)
            tokens = torch.cat([tokens, tokens.new_tensor(new)])
            stats.taus.append(len(new))
            stats.accepted.append(len(path) - 1)
            timer.lap("commit")

        out = committed(out, max_new_tokens, stop)  # the prefill's token alone may be a stop token
        stats.new_tokens = len(out)
        stats.total_seconds = time.perf_counter() - t_start
        return Generation(tokens=out, stats=stats)


@register("ar")
class ARDecoder(SpeculativeDecoder):
    """Autoregressive baseline in the same harness: one token per target forward (KV-cached)."""

    needs_drafter = False
    uses_budget = False

    def __init__(self, target: Target, drafter=None, budget: int | None = None):
        super().__init__(target, drafter=None, budget=None)

    def draft_tree(self, root, draft_logits):
        return root_only(root)


HINTS = ("lookup", "none")


def block_hints(drafter, hints: str | None) -> str:
    """The block hints a DFlash decoder drafts with: ``hints`` if given, else the drafter's ``block_hints``
    (config.json), else "none" (MASK in every draft slot)."""
    if hints is None:
        hints = getattr(getattr(drafter, "cfg", None), "block_hints", None) or "none"
    if hints not in HINTS:
        raise DecodeError(f"hints {hints!r} is not one of {', '.join(HINTS)}; pick one")
    return hints


def require_block_drafter(method: str, drafter) -> None:
    """Refuse a step-wise drafter (EAGLE-3) for a method that drafts a whole block per pass."""
    if is_stepwise(drafter):
        arch = getattr(drafter, "architecture", type(drafter).__name__)
        raise DecodeError(f"method {method!r} drafts a whole block per pass; the {arch} drafter drafts token by token: "
                          "use --method eagle3 (chain) or eagle3_tree with it")


def hint_ids(drafter, tokens: torch.Tensor, hints: str) -> torch.Tensor | None:
    """The draft slots' ids for the block after ``tokens``: None (MASK) or, with ``hints="lookup"``, [B-1] prompt
    lookup's chain."""
    return None if hints == "none" else lookup_hints(tokens, drafter.block_size - 1, drafter.mask_token_id)


def draft_block(drafter, tokens: torch.Tensor, feats: torch.Tensor | None, hints: str):
    """(logits [B-1, C], ids [C] or None): a DFlash drafter's logits over its draft vocabulary for the block after
    ``tokens`` (propose_scores), its draft slots MASK or, with ``hints="lookup"``, prompt lookup's chain."""
    ids = hint_ids(drafter, tokens, hints)
    return propose_scores(drafter, tokens, feats) if ids is None else propose_scores(drafter, tokens, feats, hints=ids)


@register("dflash")
class DFlashDecoder(SpeculativeDecoder):
    """One drafter pass over [bonus, MASK x (B-1)]; the argmax chain of B-1 drafts is verified in one forward.

    ``hints="lookup"``: the draft slots hold prompt lookup's chain instead of MASK (:func:`lookup_hints`), for
    drafters trained with them (``block_hints``, the default then); the drafter confirms or corrects it.
    """

    OPTIONS = ("hints",)
    uses_budget = False  # the block size sets the chain

    def __init__(self, target: Target, drafter=None, budget: int | None = None, hints: str | None = None):
        super().__init__(target, drafter=drafter, budget=budget)
        require_block_drafter(self.method, drafter)
        self.hints = block_hints(drafter, hints)

    def draft(self, tokens, feats):
        return draft_block(self.drafter, tokens, feats, self.hints)

    def draft_tree(self, root, proposal):
        logits, ids = proposal
        return argmax_chain(root, logits, ids)


@register("ddtree")
class DDTreeDecoder(SpeculativeDecoder):
    """The top-``budget`` prefixes of the drafter's per-position marginals, verified as one tree.

    ``sizing="cost"``: each round keeps only the most probable prefixes that pay for their verify cost
    on this machine (:mod:`flashdraft.decode.sizing`), down to a plain step; ``"fixed"`` verifies them all.
    """

    DEFAULT_BUDGET = 32
    OPTIONS = ("sizing", "tree_temperature", "hints")

    def __init__(self, target: Target, drafter=None, budget: int | None = None, sizing: str = "fixed",
                 tree_temperature: float | None = None, hints: str | None = None):
        if sizing not in SIZINGS:
            raise DecodeError(f"sizing {sizing!r} is not one of {', '.join(SIZINGS)}; pick one")
        super().__init__(target, drafter=drafter, budget=budget if budget is not None else self.DEFAULT_BUDGET)
        require_block_drafter(self.method, drafter)
        self.sizing, self.hints = sizing, block_hints(drafter, hints)
        if tree_temperature is None:  # the drafter's calibrated temperature (config.json), else 1
            tree_temperature = getattr(getattr(drafter, "cfg", None), "tree_temperature", None) or 1.0
        if not tree_temperature > 0:
            raise DecodeError(f"tree_temperature must be > 0, got {tree_temperature}")
        self.tree_temperature = float(tree_temperature)
        self._costs: VerifyCosts | None = None

    def sized(self, tree: DraftTree, keep: int = 0) -> DraftTree:
        """``tree`` (best-first) cut to the size that pays on this machine under ``sizing="cost"``."""
        if self.sizing == "fixed":
            return tree
        if self._costs is None:
            self._costs = verify_costs(self.target, self.budget + 1, max_rows=self.max_depth + 1)  # a spine's rows
        return cost_sized(tree, self._costs, keep, self.spine_min_logprob())

    def draft(self, tokens, feats):
        if hasattr(self.drafter, "propose_candidates"):  # DFlash2: children scored after their own parent
            return self.drafter.propose_candidates(tokens, feats, hint_ids(self.drafter, tokens, self.hints))
        return draft_block(self.drafter, tokens, feats, self.hints)

    def draft_tree(self, root, proposal):
        if not isinstance(proposal, tuple):  # DFlash2 candidates: children scored after their own parent
            tree = best_first_tree_by(root, proposal.children(self.tree_temperature), proposal.top.shape[0], self.budget)
            return self.sized(tree)
        logits, ids = proposal  # [B-1, C], [C] or None
        return self.sized(best_first_tree(root, self.marginals(logits), self.budget, ids))

    def marginals(self, logits: torch.Tensor) -> torch.Tensor:
        """[B-1, C] the drafter's log-probabilities per depth at :attr:`tree_temperature`, which the tree is built from."""
        return tree_marginals(logits, self.tree_temperature)
