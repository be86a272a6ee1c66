"""An EAGLE-3 drafter exported ``--to vllm`` and served by the real vLLM CPU build (``method: eagle3``) on
the embedded Gemma-3-270M target.

The drafter is trained in the fixture by a short :class:`~flashdraft.train.loop.Trainer` run
(``objective: eagle3``) on the target's own greedy continuations of the test prompts, so vLLM accepts
drafts. One subprocess (``vllm_driver.py``) runs plain greedy and then speculative greedy with the
export (same engine settings: Transformers model implementation, which exposes Gemma's intermediate
hidden states to the drafter; eager; bf16), recording every drafter pass. Checked here:

- speculative output == plain output, token for token up to bf16 near-ties of the target (near_tie.py);
- vLLM's acceptance rate within 10% (relative) of flashdraft's own ``eagle3`` chain decoder on the same
  prompts and num_speculative_tokens, and above zero;
- what vLLM hands its drafter: the features it fuses are HF ``hidden_states`` at the translated aux ids, the
  embeddings are exactly HF's scaled Gemma rows (not the raw table), pass by pass;
- proposal by proposal, vLLM's chain of drafts equals flashdraft's for the same committed prefix
  (>= 90%: bf16 near-ties between vLLM's Transformers backend and HF's forward).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flashdraft.decode import build_decoder
from flashdraft.export.conventions import hf_hidden_state_index
from flashdraft.export.formats import export_drafter
from flashdraft.models.eagle3 import Eagle3Drafter
from flashdraft.models.forward import new_cache, target_forward
from flashdraft.models.target import embedded_target_dir, load_target
from flashdraft.train.config import TrainConfig
from flashdraft.train.loop import Trainer
from tests.export.near_tie import assert_equal_up_to_near_ties
from tests.export.vllm_driver import launch

PROMPTS = ["def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "import numpy as np\n\ndef mean_squared_error(y_true, y_pred):\n",
           "class Stack:\n    def __init__(self):\n"]
MAX_TOKENS = 32
K = 3  # num_speculative_tokens = flashdraft's chain budget
TRAIN_TOKENS = 40  # greedy continuation trained on (covers MAX_TOKENS + K)
TRAIN_STEPS = 40  # the drafter learns the test's own continuations: high acceptance, so the counts are large
ACCEPTANCE_RELATIVE_TOLERANCE = 0.10
DRAFT_AGREEMENT = 0.9
# Relative L2 error per position between vLLM's captured aux state and HF's hidden state: measured <= 0.022
# for the right layer (bf16, vLLM's Transformers backend vs HF), >= 0.19 for the layer before or after.
FEATURE_REL_ERROR = 0.06

pytestmark = pytest.mark.embedded


@torch.no_grad()
def greedy_records(target, prompts: list[list[int]], n: int) -> list[dict]:
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
        resp = gen[0, len(p):].tolist()
        out.append({"token_ids": p + resp, "loss_mask": [0] * len(p) + [1] * len(resp)})
    return out


def train_drafter(target, prompts, tmp: Path) -> Path:
    """A drafter trained on the bf16 target's greedy continuations of the test prompts. The training pass runs
    an fp32 copy of the target: bf16 matmuls are emulated on CPUs without AVX512-BF16/AMX (minutes a step)."""
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in greedy_records(target, prompts, TRAIN_TOKENS)))
    cfg = TrainConfig(target="gemma-3-270m", target_dtype="float32", data=[str(data)], out_dir=str(tmp / "run"),
                      objective="eagle3", ttt_steps=K, draft_vocab_size=4096, max_len=128, batch_size=len(prompts),
                      max_steps=TRAIN_STEPS, lr=3e-3, warmup_ratio=0.1, progress=False, tensorboard=False)
    return Trainer(cfg, target=load_target("gemma-3-270m", dtype="float32")).run().final_drafter


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_eagle3")
    target = load_target("gemma-3-270m", dtype="bfloat16")
    prompts = [target.encode(p) for p in PROMPTS]
    src = train_drafter(target, prompts, tmp)
    out = export_drafter(src, "vllm", tmp / "drafter", target, str(embedded_target_dir()), serve_dtype="bfloat16").out
    res = launch(out, prompts, MAX_TOKENS, tmp, "transformers", "eagle3", K)
    rec = torch.load(tmp / "result.json.tensors.pt")
    cfg = json.loads((out / "config.json").read_text())
    return target, Eagle3Drafter.from_pretrained(out, target), prompts, res, rec, cfg


def test_speculative_output_equals_plain_output(served, embedded_target):
    """Token for token, up to bf16 near-ties of the target (:mod:`tests.export.near_tie`)."""
    _, _, prompts, res, _, _ = served
    assert_equal_up_to_near_ties(embedded_target, prompts, res["spec"]["outputs"], res["plain"]["outputs"])
    assert all(len(o) == MAX_TOKENS for o in res["plain"]["outputs"])


def test_acceptance_matches_flashdraft(served):
    target, drafter, prompts, res, _, _ = served
    m = res["spec"]["metrics"]
    assert m["num_accepted_tokens"] > 0
    theirs = m["num_accepted_tokens"] / m["num_draft_tokens"]
    dec = build_decoder("eagle3", target, drafter, budget=K)
    rounds = acc = 0
    for p in prompts:
        g = dec.generate(p, MAX_TOKENS)
        rounds += len(g.stats.taus)
        acc += sum(g.stats.accepted)  # as vLLM counts: the last round's drafts before the output is cut
    ours = acc / (rounds * K)
    assert ours > 0 and abs(theirs - ours) <= ACCEPTANCE_RELATIVE_TOLERANCE * ours, (theirs, ours)


def _proposals(res, prompts):
    """vLLM's passes grouped per proposal (a first pass, then K - 1 one-token passes) -> (prompt index,
    bonus position, drafts, index of the first pass), in request order."""
    rounds = res["rounds"]
    assert len(rounds) % K == 0
    out, k, prev = [], 0, -1
    for i in range(0, len(rounds), K):
        group = rounds[i:i + K]
        assert all(len(r["ids"]) == 1 for r in group[1:])
        bonus = group[1]["pos"][0]  # the second pass sits at the bonus token's position
        if bonus < prev:
            k += 1
        prev = bonus
        out.append((k, bonus, [r["drafts"][0] for r in group], i))
    assert k == len(prompts) - 1
    return out


@torch.no_grad()
def test_served_drafter_gets_flashdraft_inputs_and_proposes_flashdraft_drafts(served):
    target, drafter, prompts, res, rec, cfg = served
    emb = target.model.get_input_embeddings()
    seqs = [p + o for p, o in zip(prompts, res["spec"]["outputs"])]
    feats, hidden = {}, {}
    for k, s in enumerate(seqs):  # causal target: the features of a prefix are a prefix of these
        seq = torch.tensor(s)
        n = torch.arange(seq.numel())
        _, feats[k] = target_forward(target, new_cache(), seq, n, n[:, None] >= n[None, :], drafter.target_layer_ids)
        hidden[k] = target.model(seq[None], output_hidden_states=True).hidden_states
    props = _proposals(res, prompts)
    assert len(rec["features"]) == len(props) and len(rec["embeds"]) == len(res["rounds"])
    agree = compared = 0
    for j, (k, bonus, drafts, first) in enumerate(props):
        if bonus >= len(seqs[k]):  # a last round past MAX_TOKENS: its tokens were cut from the output
            continue
        compared += 1
        r, e, f = res["rounds"][first], rec["embeds"][first], rec["features"][j]  # f [n, 3 * d]
        ids, pos = torch.tensor(r["ids"]), torch.tensor(r["pos"])
        assert torch.equal(e, emb(ids[None])[0].float())  # exactly HF's scaled rows
        assert not torch.allclose(e, emb.weight[ids].float(), rtol=0.1)  # not the raw table
        valid = pos < bonus  # padded passes also carry rejected positions (pos + 1 <= bonus < len(seqs[k]))
        assert torch.equal(ids[valid], torch.tensor(seqs[k])[pos[valid] + 1])  # position i is fed token i + 1
        for a, aux in enumerate(cfg["eagle_aux_hidden_state_layer_ids"]):
            ref = hidden[k][hf_hidden_state_index("vllm", aux)][0, pos[valid]].float()
            got = f[valid, a * target.hidden_size:(a + 1) * target.hidden_size]
            err = ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).max()  # per position; bf16: ~0.02, a neighbour layer: > 0.15
            assert err < FEATURE_REL_ERROR, (aux, float(err))
        drafter.reset()
        ours = drafter.propose(torch.tensor(seqs[k][: bonus + 1]), feats[k][:bonus], depth=K).argmax(-1).tolist()
        agree += ours == drafts
    assert compared >= len(props) - len(prompts)
    assert agree >= DRAFT_AGREEMENT * compared, f"{agree}/{compared} proposals with identical drafts"
