"""DFlash drafter training on the embedded Gemma-3-270M target: tokens/s and peak memory per configuration.

Not a test. Every configuration trains ``--warmup + --steps`` optimiser steps with
``flashdraft.train.loop.Trainer`` on the same batches (same seed), each in its own subprocess so
that peak memory belongs to one configuration. The shape is BASE below (the Gemma-3-270M recipe's:
1 layer, block 8, target layers [1, 8, 15], max_len 256, 32 anchors, batch 4, bf16 autocast); a
``--config`` YAML replaces shape fields, while the compared ones (LM-head chunking, vocabulary,
block size, variants) are set by each configuration:

    chunked      LM head + loss in checkpointed chunks of 128 rows, full 262k vocabulary
    naive        all rows' logits materialised at once (lm_head_chunk=10**9, no checkpointing)
    draft-vocab  chunked, reduced draft vocabulary (--draft-vocab most frequent supervised tokens)
    b16          chunked, block 16 (alone: with ``chunked`` the cost of training b8 and b16 one after the other)
    shared       chunked, variants b8 + b16 trained together from one target pass per micro-batch

Step time: differences of ``elapsed_s`` in the run's metrics.jsonl, the first ``--warmup`` steps
dropped, median over ``--steps``; tokens/s = mean batch tokens per step / median step time (the
``shared`` run trains two drafters on those tokens). Also printed: CPU s/step (user + system of
the process; far below threads x wall time says the machine is shared) and the wall time of the
step's target pass (``Trainer.features``), the most that sharing it between variants can save.
``--repeats`` runs the configurations again in alternating order and keeps each one's fastest. Memory: the
child's RSS after the target is loaded, its (memory-mapped) weights made resident and the data read
is the baseline; the peak RSS is then reset (``/proc/self/clear_refs``) and
``getrusage().ru_maxrss`` at the end gives the training peak (peak - baseline) and the max RSS of
the whole process (loading included).

    python experiments/train_throughput.py                                  # all configurations, 4 steps + 1 warm-up
    python experiments/train_throughput.py --steps 2 --warmup 1 --configs draft-vocab b16 --out-json /tmp/t.json

Data (``--data``): a JSONL of {token_ids, loss_mask} records or a ``flashdraft generate`` output
folder. The default ``runs/gemma3-270m-dflash/generated`` is the recipe's ``flashdraft generate`` output
(``python recipes/gemma3_270m_dflash.py --out runs/gemma3-270m-dflash --stages prompts,generate``);
or regenerate code completions with the target itself:

    flashdraft generate stdlib-code --limit 128 --backend hf --dtype float32 --max-tokens 192 -o runs/gen-270m
    python experiments/train_throughput.py --data runs/gen-270m
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = {  # the training shape measured (recipes/gemma3_270m_dflash.yaml when this benchmark was written)
    "num_layers": 1, "block_size": 8, "target_layer_ids": [1, 8, 15], "max_len": 256, "max_anchors": 32,
    "loss": "ce", "batch_size": 4, "grad_accum": 1, "bf16": True,
}
CHUNKED = {"lm_head_chunk": 128, "checkpoint_lm_head": True, "draft_vocab_size": None, "loss_vocab": None,
           "block_size": 8, "variants": []}
CONFIGS = {  # name -> the compared TrainConfig fields
    "chunked": CHUNKED,
    "naive": {**CHUNKED, "lm_head_chunk": 10**9, "checkpoint_lm_head": False},
    "draft-vocab": {**CHUNKED, "draft_vocab_size": "--draft-vocab"},
    "b16": {**CHUNKED, "block_size": 16},
    "shared": {**CHUNKED, "variants": [{"name": "b8", "block_size": 8}, {"name": "b16", "block_size": 16}]},
}
BOOKKEEPING = {  # every step logged, nothing else written or evaluated during the run
    "log_every": 1, "save_every": 10**6, "eval_n": 0, "eval_every": 0, "eval_prompts": None, "tensorboard": False,
    "progress": False, "resume": False, "init_from": None, "features": None, "max_minutes": None, "target_ranks": 0,
    "device": "cpu", "target_dtype": "float32",
}


def rss_mib() -> float:
    """Current resident set size of this process."""
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reset_peak_rss() -> bool:
    """Reset the peak RSS (ru_maxrss, VmHWM) to the current RSS; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def touch_weights(model) -> None:
    """Make every weight resident: the loader memory-maps them, and pages first touched by the
    training (the target body in its first pass, the whole 262k-row head) would count as training memory."""
    import torch

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.sum()


def compared_fields(a, name: str) -> dict:
    return {k: a.draft_vocab if v == "--draft-vocab" else v for k, v in CONFIGS[name].items()}


def train_config(a, name: str, out_dir: str):
    """BASE, then --config's YAML, then the configuration's compared fields and the bookkeeping."""
    import yaml

    from flashdraft.train.config import TrainConfig

    data = dict(BASE)
    if a.config:
        data.update(yaml.safe_load(Path(a.config).read_text()) or {})
    data.update(compared_fields(a, name))
    data.update(BOOKKEEPING, target=a.target, data=[a.data], out_dir=out_dir, max_steps=a.warmup + a.steps,
                threads=a.threads, seed=a.seed)
    return TrainConfig(**data)


def step_times(metrics: Path) -> tuple[list[float], list[int], list[int]]:
    """Wall time, batch tokens and anchors of every optimiser step (one line per step; variants share the step)."""
    rows: dict[int, dict] = {}
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train":
            rows.setdefault(rec["step"], rec)
    steps = sorted(rows)
    elapsed = [0.0] + [rows[s]["elapsed_s"] for s in steps]
    return ([b - a for a, b in zip(elapsed, elapsed[1:])], [rows[s]["tokens"] for s in steps],
            [rows[s]["anchors"] for s in steps])


def child(a) -> None:
    """Train one configuration and write its figures to ``--child-out``."""
    import torch

    from flashdraft.models.target import load_target
    from flashdraft.train.data import load_examples
    from flashdraft.train.loop import Trainer

    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory(prefix=f"train-bench-{a.child}-") as out_dir:
        cfg = train_config(a, a.child, out_dir)
        target = load_target(cfg.target, dtype=cfg.target_dtype, device=cfg.device)
        min_block = min(v.block_size for _, v in cfg.variant_configs())
        examples, _ = load_examples(cfg.data, target, cfg.max_len, min_block, cfg.append_eos)
        touch_weights(target.model)
        gc.collect()
        baseline, load_peak = rss_mib(), max_rss_mib()
        reset = reset_peak_rss()
        trainer = Trainer(cfg, target=target, examples=examples)
        cpu_s: list[float] = []
        target_s: list[float] = []
        train_step, features = trainer.train_step, trainer.features

        def timed_step():  # process CPU time of each step (all threads) and its target-pass wall time
            c = os.times()
            target_s.append(0.0)
            out = train_step()
            d = os.times()
            cpu_s.append(d.user + d.system - c.user - c.system)
            return out

        def timed_features(*args):
            t = time.perf_counter()
            out = features(*args)
            target_s[-1] += time.perf_counter() - t
            return out

        trainer.train_step, trainer.features = timed_step, timed_features
        trainer.run()
        peak = max_rss_mib()
        times, tokens, anchors = step_times(Path(out_dir) / "metrics.jsonl")
    if len(times) != a.warmup + a.steps:
        raise RuntimeError(f"{a.child}: metrics.jsonl holds {len(times)} train steps, expected {a.warmup + a.steps}")
    res = {
        "config": a.child, "fields": compared_fields(a, a.child), "step_s": times, "cpu_s": cpu_s, "target_s": target_s,
        "tokens": tokens,
        "anchors": anchors, "baseline_rss_mib": baseline, "load_peak_rss_mib": load_peak, "peak_reset": reset,
        "train_peak_mib": peak - baseline, "max_rss_mib": max(peak, load_peak),
    }
    Path(a.child_out).write_text(json.dumps(res))


def summarise(res: dict, warmup: int) -> dict:
    times, tokens = res["step_s"][warmup:], res["tokens"][warmup:]
    med = statistics.median(times)
    return {**res, "median_step_s": med, "median_cpu_s": statistics.median(res["cpu_s"][warmup:]),
            "median_target_s": statistics.median(res["target_s"][warmup:]),
            "tokens_per_step": statistics.mean(tokens), "tokens_per_s": statistics.mean(tokens) / med,
            "anchors_per_step": statistics.mean(res["anchors"][warmup:])}


def run_child(a, name: str, tmp: str) -> dict | None:
    out = Path(tmp) / f"{name}.json"
    cmd = [sys.executable, __file__, "--child", name, "--child-out", str(out), "--target", a.target, "--data", a.data,
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads),
           "--draft-vocab", str(a.draft_vocab), "--seed", str(a.seed)] + (["--config", a.config] if a.config else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  {name}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return summarise(json.loads(out.read_text()), a.warmup)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=None, help="YAML of TrainConfig shape fields over BASE (e.g. a recipe)")
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--data", default="runs/gemma3-270m-dflash/generated")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=4, help="measured optimiser steps (median)")
    ap.add_argument("--warmup", type=int, default=1, help="steps dropped before measuring")
    ap.add_argument("--repeats", type=int, default=1, help="runs per configuration, alternating; the fastest counts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-vocab", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-json", default=None, help="also write every figure here")
    ap.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    if not Path(a.data).exists():
        sys.exit(f"training data {a.data} does not exist; pass --data (see --help for how to make it)")

    print(f"target={a.target} data={a.data} config={a.config or 'BASE'} threads={a.threads} "
          f"median of {a.steps} steps (warm-up {a.warmup}), best of {a.repeats}, one subprocess per run")
    runs: dict[str, list[dict]] = {name: [] for name in a.configs}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="train-bench-") as tmp:
        for rep in range(a.repeats):
            for name in a.configs if rep % 2 == 0 else a.configs[::-1]:
                r = run_child(a, name, tmp)
                if r is not None:
                    runs[name].append(r)
                    print(f"  {name}: {r['median_step_s']:.2f} s/step, {r['median_cpu_s']:.2f} CPU s/step, "
                          f"training peak {r['train_peak_mib']:.0f} MiB", flush=True)
    results = {name: min(rs, key=lambda r: r["median_step_s"]) for name, rs in runs.items() if rs}
    for name, r in results.items():
        r["all_median_step_s"] = [x["median_step_s"] for x in runs[name]]
        r["max_train_peak_mib"] = max(x["train_peak_mib"] for x in runs[name])
    print(f"  ({time.perf_counter() - t_start:.0f} s in all)")

    print(f"\n{'configuration':<14} {'s/step':>8} {'CPU s/step':>11} {'target s/step':>14} {'tokens/s':>9}"
          f" {'train peak MiB':>15} {'max RSS MiB':>12} {'anchors/step':>13}")
    for name, r in results.items():
        print(f"{name:<14} {r['median_step_s']:>8.2f} {r['median_cpu_s']:>11.2f} {r['median_target_s']:>14.2f}"
              f" {r['tokens_per_s']:>9.1f}"
              f" {r['train_peak_mib']:>15.0f} {r['max_rss_mib']:>12.0f} {r['anchors_per_step']:>13.0f}")
    if any(not r["peak_reset"] for r in results.values()):
        print("note: the kernel refused to reset the peak RSS: training peaks include the target load")

    ratios: dict[str, float] = {}
    c = results.get("chunked")
    if c and "naive" in results:
        n = results["naive"]
        ratios["naive_over_chunked_peak"] = n["train_peak_mib"] / c["train_peak_mib"]
        ratios["naive_over_chunked_tokens_per_s"] = n["tokens_per_s"] / c["tokens_per_s"]
    if c and "draft-vocab" in results:
        ratios["draft_vocab_over_full_tokens_per_s"] = results["draft-vocab"]["tokens_per_s"] / c["tokens_per_s"]
        ratios["draft_vocab_over_full_peak"] = results["draft-vocab"]["train_peak_mib"] / c["train_peak_mib"]
    if c and "b16" in results and "shared" in results:
        sequential = c["median_step_s"] + results["b16"]["median_step_s"]
        ratios["sequential_b8_b16_step_s"] = sequential
        ratios["shared_over_sequential_time"] = results["shared"]["median_step_s"] / sequential
        ratios["shared_over_sequential_cpu"] = results["shared"]["median_cpu_s"] / (
            c["median_cpu_s"] + results["b16"]["median_cpu_s"])
    if ratios:
        print()
    if "naive_over_chunked_peak" in ratios:
        print(f"naive / chunked: training peak {ratios['naive_over_chunked_peak']:.2f}x, "
              f"tokens/s {ratios['naive_over_chunked_tokens_per_s']:.2f}x")
    if "draft_vocab_over_full_tokens_per_s" in ratios:
        print(f"draft vocab {a.draft_vocab} / full vocab (chunked): tokens/s "
              f"{ratios['draft_vocab_over_full_tokens_per_s']:.2f}x, "
              f"training peak {ratios['draft_vocab_over_full_peak']:.2f}x")
    if "shared_over_sequential_time" in ratios:
        print(f"b8 + b16 from one target pass: {results['shared']['median_step_s']:.2f} s/step vs "
              f"{ratios['sequential_b8_b16_step_s']:.2f} s one after the other "
              f"({ratios['shared_over_sequential_time']:.2f}x the time, saves "
              f"{1 - ratios['shared_over_sequential_time']:.0%}; CPU time {ratios['shared_over_sequential_cpu']:.2f}x)")
    if a.out_json:
        args = {k: v for k, v in vars(a).items() if not k.startswith("child")}
        Path(a.out_json).write_text(json.dumps({"args": args, "base": BASE, "results": results, "ratios": ratios},
                                               indent=1))


if __name__ == "__main__":
    main()
