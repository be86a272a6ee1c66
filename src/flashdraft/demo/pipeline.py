"""``flashdraft demo``: the whole pipeline on one target, each stage through the stage's own code.

prompts (built-in offline sources; HumanEval held out) -> generate (vLLM when installed, else HF) ->
mix report -> train (the Gemma recipe under a minutes budget, from the shipped drafter or from scratch)
-> bench decode on HumanEval (AR vs DFlash vs DDTree, shipped and trained drafter in one interleaved
run) -> export for vLLM (+ the serve command) -> report.html / report.md. Every stage leaves a marker
(:mod:`flashdraft.demo.stages`); a re-run skips finished stages unless ``fresh``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from flashdraft.config import Section
from flashdraft.decode.sizing import Sizing
from flashdraft.demo.stages import Stage, StageError
from flashdraft.io import atomic_write_text
from flashdraft.models.chat import ChatTemplateMode


class DemoConfig(Section):
    """Settings of ``flashdraft demo``; the defaults end the whole demo within 20 minutes on 2 CPU cores."""

    out: str = Field("runs/demo", description="run folder: one sub-folder per stage, stages/ markers, report/")
    target: str = Field("gemma-3-270m", description="target: embedded name, HF folder/id or .gguf file")
    drafter: str | None = Field("auto", description="the shipped drafter, benched next to the new one; auto: "
                                "assets/<target>-dflash when the repository ships one, else none (a fresh drafter "
                                "is trained and benched alone)")
    chat_template: ChatTemplateMode = Field(
        "auto", description="generate and bench: prompts through the target's chat template when it has one (as a "
        "served user's), or never (raw text)")
    recipe: str = Field("recipes/gemma3_270m_dflash.yaml", description="TrainConfig YAML of the training recipe")
    sources: list[str] = Field(["stdlib-code", "stdlib-docs"], description="built-in prompt sources (no held-out sets)")
    prompts: int = Field(24, ge=1, description="prompts in all, split evenly across the sources")
    new_tokens: int = Field(64, ge=1, description="generate: max new tokens per prompt")
    backend: Literal["auto", "vllm", "hf"] = Field(
        "auto", description="generate backend; auto: vllm when installed and a GPU is there, else hf (vLLM's CPU "
        "build compiles for minutes before its first token)")
    minutes: float = Field(4.0, gt=0, description="train: wall-clock budget (TrainConfig.max_minutes)")
    fine_tune: bool = Field(True, description="train: start from a drafter (init_from, else `drafter`); False: fresh")
    init_from: str | None = Field(None, description="train: the drafter to fine-tune (default: `drafter`)")
    train_steps: int | None = Field(None, ge=1, description="train: optimizer steps (default: the recipe's epochs)")
    fine_tune_lr: float = Field(2e-4, gt=0, description="train: peak learning rate when fine-tuning a drafter (the "
                                "recipe's 3e-3 is for a fresh one and wipes out what a trained drafter knows; an lr= "
                                "in train_set wins)")
    train_set: list[str] = Field(
        ["batch_size=4", "bf16=false"],
        description="train: more TrainConfig fields, key=value; the default fine-tunes 4 sequences a step in fp32 (CPUs "
        "without bf16 matrix units run bf16 backward matmuls on a slow reference path); the shipped drafter keeps its "
        "8192-token draft vocabulary (a full-vocabulary drafter wants loss_vocab=8192, a sampled softmax)")
    bench_prompts: int = Field(3, ge=1, description="bench: held-out HumanEval prompts")
    bench_tokens: int = Field(48, ge=2, description="bench: new tokens per prompt")
    budgets: list[int] = Field([8, 16], description="bench: DDTree node budgets")
    sizings: list[Sizing] = Field(
        ["fixed", "cost"], min_length=1, description="bench: DDTree sizings; cost adds rows ddtree@b+cost, the tree cut "
        "each round to what pays for its verify cost on this machine (flashdraft.decode.sizing)")
    repeats: int = Field(1, ge=1, description="bench: runs per prompt and variant (median TPOT)")
    ngram: bool = Field(True, description="bench: also run prompt lookup (ngram, ngram_tree@b) and the hybrid tree "
                        "(ddtree_ngram@b: the drafter's tree plus the lookup's chain in the same budget)")
    lookup_min: int = Field(2, ge=1, description="bench: prompt lookup's shortest n-gram match (vLLM's "
                            "prompt_lookup_min); 2 drafts only on repeats, which pays on a CPU")
    threads: int = Field(1, ge=1, description="torch intra-op threads (1 on a shared machine)")

    @property
    def shipped(self) -> str | None:
        """The shipped drafter benched next to the new one (``drafter``; auto: the repository's asset for the target)."""
        if self.drafter != "auto":
            return self.drafter or None
        asset = Path("assets") / f"{Path(self.target).name}-dflash"
        return str(asset) if (asset / "config.json").is_file() else None

    @property
    def start_from(self) -> str | None:
        """The drafter training starts from (None: a fresh one)."""
        return (self.init_from or self.shipped) if self.fine_tune else None


def _target(ctx: dict, cfg: DemoConfig):
    """The target, loaded once per run and shared by the stages that need it."""
    if "target" not in ctx:
        from flashdraft.models.target import load_target

        ctx["target"] = load_target(cfg.target, dtype="float32")
    return ctx["target"]


def _need(ctx: dict, stage: str, key: str) -> str:
    try:
        return ctx["outputs"][stage][key]
    except KeyError:
        raise StageError(f"stage output {stage}.{key} is missing; rerun with --fresh") from None


def stage_prompts(cfg: DemoConfig, ctx: dict) -> dict:
    from flashdraft.generate.sources import HELDOUT, BadInput, load_source

    held = [s for s in cfg.sources if s in HELDOUT]
    if held:
        raise StageError(f"prompt sources {held} are held out for the bench; choose others (e.g. stdlib-code)")
    per = -(-cfg.prompts // len(cfg.sources))
    rows = []
    for spec in cfg.sources:
        for s in load_source(spec, limit=per):
            if not isinstance(s, BadInput):
                rows.append({"id": f"{s.source}/{s.id}", "source": s.source, "prompt": s.messages[-1]["content"]})
    rows = rows[: cfg.prompts]
    path = Path(ctx["out"]) / "prompts.jsonl"
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return {"prompts": str(path), "count": len(rows), "sources": cfg.sources}


def stage_generate(cfg: DemoConfig, ctx: dict) -> dict:
    from flashdraft.generate.config import GenerateConfig
    from flashdraft.generate.runner import run

    import torch

    gpu_vllm = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()
    backend = cfg.backend if cfg.backend != "auto" else ("vllm" if gpu_vllm else "hf")
    out = Path(ctx["out"]) / "generated"
    gcfg = GenerateConfig(sources=[_need(ctx, "prompts", "prompts")], target=cfg.target, backend=backend,
                          dtype="float32", temperature=0.0, max_tokens=cfg.new_tokens, chat_template=cfg.chat_template,
                          output=str(out), resume=True, max_model_len=2048, enforce_eager=True,
                          chunk_size=16, flush_every=16)  # written every 16 records: Ctrl-C loses at most one chunk
    t0 = time.perf_counter()
    m = run(gcfg)
    return {"data": str(out), "backend": backend, "records": m["counts"].get("done", 0) + m["counts"].get("skipped_done", 0),
            "response_tokens": m["tokens"]["response"], "seconds": round(time.perf_counter() - t0, 1),
            "manifest": str(out / "manifest.json")}


def stage_mix(cfg: DemoConfig, ctx: dict) -> dict:
    from flashdraft.mix.config import MixConfig
    from flashdraft.mix.methods import make_classifier
    from flashdraft.mix.report import compose_path, write_report

    mcfg = MixConfig()
    clf = make_classifier(mcfg.method, mcfg.labels, mcfg.keyword_labels, mcfg.model, mcfg.abstain_below)
    comp = compose_path(_need(ctx, "generate", "data"), clf, mcfg.examples, mcfg.seed, mcfg.batch_size,
                        mcfg.source_field, mcfg.workers)
    paths = write_report(comp, Path(ctx["out"]) / "mix", "generated")
    return {kind: str(p) for kind, p in paths.items()}


def train_sets(cfg: DemoConfig) -> list[str]:
    """The TrainConfig overrides of the train stage: ``train_set``, plus ``fine_tune_lr`` and the drafter's own
    block size when fine-tuning (unless ``train_set`` names them)."""
    sets = list(cfg.train_set)
    named = {kv.split("=", 1)[0].strip() for kv in sets}
    if cfg.start_from and "lr" not in named:
        sets.append(f"lr={cfg.fine_tune_lr}")
    block = drafter_block_size(cfg.start_from) if cfg.start_from and "block_size" not in named else None
    if block:  # the recipe's block size would retrain the drafter at it
        sets.append(f"block_size={block}")
    return sets


def drafter_block_size(folder: str) -> int | None:
    """The drafter folder's ``block_size``, read by its family's config schema (None for a family without one,
    e.g. EAGLE-3); a folder that is not a drafter raises DrafterError naming what it lacks."""
    from flashdraft.models.drafter import drafter_architecture, drafter_class

    return getattr(drafter_class(drafter_architecture(folder)).load_config(folder), "block_size", None)


def stage_train(cfg: DemoConfig, ctx: dict) -> dict:
    from flashdraft.train.config import TrainConfig
    from flashdraft.train.loop import Trainer

    if not Path(cfg.recipe).is_file():
        raise StageError(f"train recipe {cfg.recipe} not found; run from the repository root or pass --recipe")
    out = Path(ctx["out"]) / "train"
    tcfg = TrainConfig.load(cfg.recipe, sets=train_sets(cfg), target=cfg.target, data=[_need(ctx, "generate", "data")],
                            out_dir=str(out), max_minutes=cfg.minutes, init_from=cfg.start_from,
                            max_steps=cfg.train_steps, threads=cfg.threads, resume=True)
    res = Trainer(tcfg, target=_target(ctx, cfg)).run()
    if res.stopped == "signal":  # the loop saved a checkpoint; the next run resumes from it
        raise KeyboardInterrupt(f"train stopped at step {res.step}/{res.total_steps}")
    return {"drafter": str(res.final_drafter), "steps": res.step, "total_steps": res.total_steps,
            "stopped": res.stopped, "init_from": cfg.start_from, "metrics": str(out / "metrics.jsonl")}


def machine() -> dict:
    """Where the figures were measured: date, host, CPU model, cores, torch threads."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return dict(date=time.strftime("%Y-%m-%d %H:%M %Z"), host=platform.node(), cpu=cpu, cores=os.cpu_count(),
                torch_threads=torch.get_num_threads(), gpu=gpu, python=platform.python_version(),
                torch=torch.__version__)


def stage_bench(cfg: DemoConfig, ctx: dict) -> dict:
    from tqdm import tqdm

    from flashdraft.bench.decode_bench import load_prompts, markdown_table, run_decode_bench
    from flashdraft.bench.plots import decode_plots
    from flashdraft.models.chat import ChatSettings
    from flashdraft.models.drafter import load_drafter

    target = _target(ctx, cfg)
    drafters = {"shipped": load_drafter(cfg.shipped, target)} if cfg.shipped else {}
    drafters["trained"] = load_drafter(_need(ctx, "train", "drafter"), target)
    name, prompts = load_prompts("humaneval", cfg.bench_prompts)
    out = Path(ctx["out"]) / "bench"
    bar = tqdm(total=len(prompts), desc="bench decode (prompts)", unit="prompt")
    try:
        res = run_decode_bench(target, drafters, {name: prompts}, cfg.budgets, [0.0], cfg.bench_tokens, cfg.repeats,
                               out, log=lambda _msg: bar.update(1), ngram=cfg.ngram,
                               lookup=dict(lookup_min=cfg.lookup_min), sizings=list(cfg.sizings),
                               chat=ChatSettings(cfg.chat_template))
    finally:
        bar.close()
    atomic_write_text(out / "results.md", markdown_table(res))
    atomic_write_text(out / "machine.json", json.dumps(machine(), indent=1) + "\n")
    plots = decode_plots(res, out / "plots")
    return {"results": str(out / "results.json"), "table": str(out / "results.md"), "machine": str(out / "machine.json"),
            "drafters": {"shipped": cfg.shipped, "trained": _need(ctx, "train", "drafter")},
            "prompting": res["prompting"],
            "plots": [str(p) for p in plots]}


def stage_export(cfg: DemoConfig, ctx: dict) -> dict:
    from flashdraft.export.formats import export_drafter
    from flashdraft.export.serve import serve_commands
    from flashdraft.models.target import resolve_target_path

    ref = resolve_target_path(cfg.target)
    rep = export_drafter(_need(ctx, "train", "drafter"), "vllm", Path(ctx["out"]) / "export" / "vllm",
                         _target(ctx, cfg), ref)
    cmds = serve_commands(rep.out, ref, rep.quirks.family)
    sh = Path(ctx["out"]) / "export" / "serve.sh"
    atomic_write_text(sh, "#!/usr/bin/env bash\n# baseline and speculative vLLM servers for the exported drafter\n"
                      + "".join(f"# {k}\n{v}\n" for k, v in cmds.items()))
    return {"exported": str(rep.out), "format": rep.format, "serve": cmds, "serve_script": str(sh), "notes": rep.notes}


def stage_report(cfg: DemoConfig, ctx: dict) -> dict:
    from flashdraft.demo.report import write_report

    paths = write_report(Path(ctx["out"]), cfg)
    return {k: str(p) for k, p in paths.items()}


# name, what it does, its function, what it writes under the run folder (--fresh deletes it)
STAGES: list[tuple[str, str, object, tuple[str, ...]]] = [
    ("prompts", "prompts from the built-in offline sources (HumanEval held out for the bench)", stage_prompts,
     ("prompts.jsonl",)),
    ("generate", "the target answers every prompt (greedy): its own distribution, as training records", stage_generate,
     ("generated",)),
    ("mix", "what the generated data is, per domain (mix report)", stage_mix, ("mix",)),
    ("train", "a short run of the training recipe under the minutes budget (resumes from its checkpoints)",
     stage_train, ("train",)),
    ("bench", "AR vs DFlash vs DDTree on held-out HumanEval, shipped and trained drafter side by side", stage_bench,
     ("bench",)),
    ("export", "the trained drafter in vLLM's format, with the commands that serve it", stage_export, ("export",)),
    ("report", "report.html and report.md from the result files", stage_report, ("report",)),
]


def demo_stages(cfg: DemoConfig) -> list[Stage]:
    """The demo's stages, each bound to ``cfg``."""
    return [Stage(name, what, (lambda ctx, f=fn: f(cfg, ctx)), outputs) for name, what, fn, outputs in STAGES]
