"""Recipe: DFlash drafters for the embedded Gemma-3-270M made by the product's own stages over mixed prompts.

Every stage is the CLI verb a user runs (``flashdraft generate``, ``flashdraft mix report | plan | rebalance``) or,
for training, the same code as ``flashdraft train``. Stages (``--stages``, comma-separated; each one resumes or
keeps what an earlier call wrote):

1. prompts   - the mix pool's questions in the named sets' plain form (``experiments/mixed_prompts.py``: coding,
               math, general, translation; rows holding a named set's test or dev question, and HumanEval, left
               out) -> ``prompts.jsonl``; ``--heads`` installed-package function heads (the Python source of
               ``recipes/gemma3_270m_dflash.py``'s draws) -> ``heads.jsonl``, the coding source a plan draws from.
2. generate  - ``flashdraft generate prompts.jsonl -o data`` (vLLM when installed, fp32, greedy, 128 tokens,
               resumable): the target's own answers.
3. report    - ``flashdraft mix report data``: what the answers are, per domain.
4. plan      - per arm, ``flashdraft mix plan`` with ``heads.jsonl`` as the candidate source: how many heads reach
               the arm's mix at ``--total`` rows; the largest number any arm asks for is generated into ``data``.
5. rebalance - per arm, ``flashdraft mix rebalance data`` at the arm's mix (``--max-repeat`` copies at most) ->
               ``train-<arm>.jsonl``.
6. train     - per arm, the target's features once (``features-<arm>``), then the trainer with
               ``recipes/gemma3_270m_dflash.yaml`` and the ``--set`` overrides (``--init``: start from that drafter),
               ``--max-steps`` steps for every arm: the same sequences and tokens seen by each.
7. eval      - per arm and for the shipped drafter, the walk of ``experiments/heldout_walk.py`` on the named sets'
               dev parts, with MASK in the draft slots (what SGLang and speculators serve) and with prompt lookup's
               hints (flashdraft's decoders, and vLLM with flashdraft's plugin), beside prompt lookup.

Arms (``--arm NAME=MIX``, repeatable) are the mix ablation: by default ``mix`` (the planned mix below) and
``code`` (coding only, as the shipped drafter's data), the same rows, steps and recipe otherwise.

The planned mix, coding 0.3 / math 0.3 / general 0.2 / translation 0.2: served prompts are code, math, chat and
other languages (the named sets' four domains); math gets as much as code because its answers are the least like
code (the shipped drafter's served math tau is its lowest); the pool holds 240 general questions once dev and test
rows are out, so general and translation, which also carries the non-English text, share the rest.

The figures of docs/results.md ("A drafter from the pipeline's own mixed data") came from the ``mix`` arm of::

    python experiments/vocab_trade.py --sizes 16384 --out runs/mixed/vocab
    python recipes/gemma3_270m_mixed.py --out runs/mixed --heads 1300 --total 1200 \\
        --init runs/mixed/vocab/v16384 --max-steps 250 --threads 2

(the ``code`` arm's training was stopped in its feature stage for lack of time; the same command resumes it).

Minutes per stage and the walk figures land in ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ARMS = ["mix=coding=0.3,math=0.3,general=0.2,translation=0.2", "code=coding=1"]
SHIPPED = ROOT / "assets" / "gemma-3-270m-dflash"
DEV_SETS = ("code-dev", "math-dev", "chat-dev", "multilingual-dev")
TRAIN_SETS = ["loss=kl", "batch_size=32", "max_anchors=8", "lr=5e-4", "bf16=false", "num_layers=2", "block_size=16",
              "position_weights=first_error", "focal=1.0", "block_hints=lookup", "hint_prob=0.5", "max_len=448",
              "save_every=50", "keep_last=2", "eval_every=0"]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "flashdraft.cli", *args]


def code_recipe():
    """``recipes/gemma3_270m_dflash.py`` as a module (its function-head draws)."""
    spec = importlib.util.spec_from_file_location("gemma3_270m_dflash", ROOT / "recipes" / "gemma3_270m_dflash.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/gemma3-270m-mixed")
    ap.add_argument("--per-domain", type=int, default=100000, help="mix-pool questions a domain (default: all)")
    ap.add_argument("--heads", type=int, default=1300, help="package function heads in heads.jsonl (the plan's pool)")
    ap.add_argument("--arm", action="append", default=None, help="NAME=MIX, e.g. mix=coding=0.5,math=0.5 (repeatable)")
    ap.add_argument("--total", type=int, default=1600, help="training rows of every arm")
    ap.add_argument("--max-repeat", type=int, default=2, help="most copies of one row in an arm's training set")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--backend", default="auto", choices=["auto", "vllm", "hf"])
    ap.add_argument("--init", default="assets/gemma-3-270m-dflash", help="drafter to start from ('none': fresh)")
    ap.add_argument("--max-steps", type=int, default=300)
    ap.add_argument("--train-minutes", type=float, default=120.0, help="a safety cap; --max-steps ends a run")
    ap.add_argument("--set", action="append", default=[], help="override a TrainConfig field (after the recipe's own)")
    ap.add_argument("--eval-limit", type=int, default=16, help="prompts of each dev set walked")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stages", default="prompts,generate,report,plan,rebalance,train,eval")
    a = ap.parse_args()
    arms = dict(spec.split("=", 1) for spec in (a.arm or DEFAULT_ARMS))
    torch.set_num_threads(a.threads)
    out, stages = Path(a.out), set(a.stages.split(","))
    out.mkdir(parents=True, exist_ok=True)
    data, report = out / "data", out / "mix_report"
    res_path = out / "results.json"
    results = json.loads(res_path.read_text()) if res_path.is_file() else {}
    minutes = results.setdefault("minutes", {})

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def stage(name: str, fn) -> None:
        if name in stages:
            t0 = time.perf_counter()
            fn()
            minutes[name] = round((time.perf_counter() - t0) / 60, 2)
            log(f"{name}: {minutes[name]:.1f} min")
            atomic_write_text(res_path, json.dumps(results, indent=2) + "\n")

    from flashdraft.io import atomic_write_text

    backend = a.backend if a.backend != "auto" else ("vllm" if importlib.util.find_spec("vllm") else "hf")
    generate = cli("generate", "-o", str(data), "--backend", backend, "--dtype", "float32", "--max-tokens",
                   str(a.new_tokens), "--temperature", "0", "--resume", "--no-progress")

    def prompts() -> None:
        subprocess.run([sys.executable, str(ROOT / "experiments" / "mixed_prompts.py"), "--out", str(out),
                        "--per-domain", str(a.per_domain)], check=True)
        heads = code_recipe().code_prompts(a.heads, seed=0, packages=True, cuts=False)
        atomic_write_text(out / "heads.jsonl", "".join(json.dumps({"prompt": p}) + "\n" for p in heads))
        log(f"{len(heads)} package function heads -> {out / 'heads.jsonl'}")

    def plan() -> None:
        want = 0
        for name, mix in arms.items():
            pj = out / f"plan-{name}.json"
            subprocess.run(cli("mix", "plan", str(report / "report.json"), "--target", mix, "--total", str(a.total),
                               "--candidate", f"heads={out / 'heads.jsonl'}", "--allow-downsample",
                               "--out", str(out / f"plan-{name}.md"), "--json", str(pj)), check=True)
            want = max(want, json.loads(pj.read_text())["take"]["heads"])
        rows = (out / "heads.jsonl").read_text().splitlines()[:want]
        atomic_write_text(out / "heads-planned.jsonl", "".join(r + "\n" for r in rows))
        results["heads_generated"] = len(rows)
        log(f"the plans take up to {want} heads: generating them")
        subprocess.run(generate + [f"heads={out / 'heads-planned.jsonl'}"], check=True)

    def rebalance() -> None:
        for name, mix in arms.items():
            subprocess.run(cli("mix", "rebalance", str(data), "--target", mix, "--total", str(a.total),
                               "--max-repeat", str(a.max_repeat), "--seed", "0",
                               "--out", str(out / f"train-{name}.jsonl")), check=True)

    def train() -> None:
        from flashdraft.config import parse_sets
        from flashdraft.models.target import load_target
        from flashdraft.train.config import TrainConfig
        from flashdraft.train.data import load_examples
        from flashdraft.train.features import write_features
        from flashdraft.train.loop import Trainer

        target = load_target("gemma-3-270m")
        sets = list(TRAIN_SETS)
        if a.init != "none":  # the drafter's own shape: its draft vocabulary (a resume checks the config against it)
            size = json.loads((Path(a.init) / "config.json").read_text()).get("draft_vocab_size")
            sets += [f"init_from={a.init}"] + ([f"draft_vocab_size={size}"] if size else [])
        sets += a.set
        for name in arms:
            over = dict(data=[str(out / f"train-{name}.jsonl")], out_dir=str(out / name),
                        features=str(out / f"features-{name}"), max_minutes=a.train_minutes, max_steps=a.max_steps,
                        threads=a.threads)
            cfg = TrainConfig.load(ROOT / "recipes" / "gemma3_270m_dflash.yaml",
                                   **{**over, **parse_sets(sets, TrainConfig)})
            examples, _ = load_examples(cfg.data, target, cfg.max_len, cfg.block_size, cfg.append_eos)
            write_features(target, examples, sorted(cfg.target_layer_ids), cfg.features, dtype="bfloat16",
                           with_final=cfg.loss == "kl", progress=False)
            res = Trainer(cfg, target=target).run()
            results.setdefault("train", {})[name] = {"steps": res.step, "stopped": res.stopped,
                                                     "sequences": len(examples)}
            log(f"train {name}: {res.step} steps ({res.stopped}) on {len(examples)} sequences")

    def evaluate() -> None:
        walk = [sys.executable, str(ROOT / "experiments" / "heldout_walk.py"), "--data", str(data), "--humaneval", "0",
                "--no-heldout", "--limit", str(a.eval_limit), "--new-tokens", str(a.new_tokens), "--threads",
                str(a.threads), "--cache", str(out / "dev_continuations.json")]
        for s in DEV_SETS:
            walk += ["--prompts", s]
        drafters = [str(out / name / "drafter") for name in arms] + [str(SHIPPED)]  # and the drafter shipped today
        for hints in ("none", "lookup"):
            run = subprocess.run(walk + ["--hints", hints, *drafters], check=True, capture_output=True, text=True)
            rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
            results.setdefault("dev_walk", {})[hints] = rows
            for r in rows:
                log(f"{r['drafter']} {r['set']} hints={hints}: walk tau {r['drafter_walk_tau']:.2f} "
                    f"(prompt lookup {r['prompt_lookup_walk_tau']:.2f})")

    stage("prompts", prompts)
    stage("generate", lambda: subprocess.run(generate + [str(out / "prompts.jsonl")], check=True))
    stage("report", lambda: subprocess.run(cli("mix", "report", str(data), "--out", str(report)), check=True))
    stage("plan", plan)
    stage("rebalance", rebalance)
    stage("train", train)
    stage("eval", evaluate)
    log("minutes: " + ", ".join(f"{k} {v:.1f}" for k, v in minutes.items()))


if __name__ == "__main__":
    main()
