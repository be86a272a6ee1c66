"""The training loop: AdamW (or Muon + AdamW) + warmup/cosine, clipping, bf16 autocast, EMA, metrics, checkpoints, resume, eval, export.

One optimiser step = ``grad_accum`` micro-batches. Anchors of all of them are drawn first, so the
loss normaliser (summed position weights, or anchors for D-PACE, of the whole step) is known before
any backward and does not depend on how the step is split into micro-batches or ranks.

Several drafter *variants* (``cfg.variants``: block sizes, gammas, learning rates, ...) train at
once: each micro-batch runs the frozen target once (or reads the feature cache once) over the union
of the variants' layers, and every variant takes its own columns. Each variant has its own drafter,
optimizer, scheduler, EMA, checkpoints and exported drafter under ``<out_dir>/<name>/``; their
random draws (anchors, noise, sampled negatives) are seeded per variant and micro-batch, so a
variant trained with others gives the same numbers as trained alone. One unnamed variant (no
``variants``) keeps everything directly in ``out_dir``.
"""

from __future__ import annotations

import json
import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from flashdraft.io import atomic_write_text, check_output_dir, make_output_dir
from flashdraft.models.chat import ChatSettings, prompting_of
from flashdraft.models.draft_vocab import format_coverage
from flashdraft.models.drafter import Drafter, load_drafter
from flashdraft.models.forward import target_pass
from flashdraft.train.checkpoint import (
    check_resume_shape, checkpoint_steps, load_checkpoint, prune_checkpoints, read_best, save_checkpoint, write_best,
)
from flashdraft.train.config import TrainConfig
from flashdraft.train.data import DataStats, DataStream, Example, collate, coverage_by_domain, domain_classifier, load_examples
from flashdraft.train.diagnostics import (
    NgramBaseline, calibrate_tree, feature_scale, feature_stats, format_feature_stats, format_report, heldout_report,
)
from flashdraft.train.disaggregated import FeatureChannel, role, share_plan
from flashdraft.train.dist import agree, bf16_is_fast, dist_world, resolve_device, stop_signals
from flashdraft.train.optim import EMA, make_optimizer, make_scheduler
from flashdraft.train.evaluate import evaluate_tau, load_eval_prompts
from flashdraft.train.objective import TrainError
from flashdraft.train.objectives import add_metrics, all_reduce_metrics, objective_class


@dataclass
class TrainResult:
    step: int
    total_steps: int
    stopped: str  # "done", "signal", "time", "stop_after"
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss of the first variant, this process
    checkpoint: Path | None = None
    final_drafter: Path | None = None
    eval: dict | None = None
    variants: dict[str, dict] = field(default_factory=dict)  # name -> {"losses", "final_drafter", "eval"}
    heldout: dict | None = None  # variant -> held-out per-slot accuracy, ablation and baselines (cfg.holdout)


class Variant:
    """One drafter being trained: drafter, objective, optimizer, scheduler, EMA and its folder.

    The objective class (``cfg.objective``, from the objective registry) makes fresh drafters; saved
    ones load through the drafter registry (``config.json`` architectures)."""

    def __init__(self, name: str | None, cfg: TrainConfig, root: Path, target, examples: list[Example],
                 total_steps: int, resume_step: int | None, scale_of=None, prompting: dict | None = None):
        self.name, self.cfg = name, cfg
        self.out = root / name if name else root
        self.resume_from = self.out / "checkpoints" / f"step-{resume_step:08d}" if resume_step is not None else None
        objective = objective_class(cfg.objective)
        if self.resume_from is not None:  # the checkpoint's own drafter config wins (same shape)
            self.drafter = load_drafter(self.resume_from / "drafter", target)
            check_resume_shape(cfg, self.drafter.cfg, self.resume_from)
        elif cfg.init_from:
            self.drafter = load_drafter(cfg.init_from, target)
            grow = getattr(self.drafter, "grow_layers", None)
            if grow is not None and cfg.num_layers > len(self.drafter.layers):  # deeper: added layers start as identity
                self.drafter = grow(cfg.num_layers)
            if "block_size" in cfg.model_fields_set and "block_size" in getattr(type(self.drafter.cfg), "model_fields", {}):
                self.drafter.cfg.block_size = cfg.block_size  # set in the config, it wins: no weight depends on it
            adopt = getattr(objective, "adopt", None)  # an objective may start its own family from another's drafter
            if adopt is not None:
                self.drafter = adopt(self.drafter, cfg)
        else:
            self.drafter = objective.new_drafter(target, cfg, examples)
        self.drafter.float().train()
        if "block_hints" in getattr(type(self.drafter.cfg), "model_fields", {}):  # unset: as init_from has it
            hints = cfg.block_hints or self.drafter.cfg.block_hints or "none"
            self.drafter.cfg.block_hints = None if hints == "none" else hints  # what training and decoders fill in
        if self.resume_from is None and prompting is not None:  # how the training sequences were prompted
            if isinstance(self.drafter.cfg, dict):  # a family whose config is a plain dict
                self.drafter.cfg["prompting"] = prompting
            else:
                self.drafter.cfg.prompting = prompting
        self.scale = scale_of(self.drafter.target_layer_ids, cfg.feature_norm) if scale_of else None
        if self.scale is not None:  # fc reads the features at a common scale (folded into fc.weight on save)
            fresh = self.resume_from is None and not cfg.init_from
            self.drafter.set_feature_scale(self.scale, keep_function=not fresh)
        attention = cfg.attention
        if attention == "auto":
            attention = "flex" if target.device.type == "cuda" else "sdpa"
        self.objective = objective.from_config(self.drafter, cfg, attention)
        self.optimizer = make_optimizer(self.drafter, cfg.optimizer, cfg.lr, cfg.betas, cfg.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, total_steps, cfg.warmup_ratio, cfg.min_lr_ratio, cfg.lr)
        self.ema = EMA(self.drafter, cfg.ema_decay) if cfg.ema_decay else None
        self.best = read_best(self.out)
        self.losses: dict[int, float] = {}

    @property
    def label(self) -> str:
        return self.name or "drafter"

    def eval_weights(self):
        """Context in which the drafter holds the weights that are evaluated and exported (EMA if on)."""
        return self.ema.applied(self.drafter) if self.ema else nullcontext(self.drafter)

    def seed(self, step: int, micro: int) -> int:
        """Seed of this variant's random draws in micro-batch ``micro`` of step ``step``."""
        return int(np.random.SeedSequence([self.cfg.seed, step, micro]).generate_state(1)[0])


class Trainer:
    """Builds target, drafters, data and optimisers from a :class:`TrainConfig` and runs the loop.

    With ``cfg.target_ranks`` > 0 the first ranks are feature producers (target and data only; their
    ``run`` is :meth:`serve`) and the others train on the features they send (disaggregated.py).
    """

    def __init__(self, cfg: TrainConfig, target=None, examples: list[Example] | None = None, eval_prompts=None):
        self.cfg = cfg
        check_output_dir(cfg.out_dir, "--out-dir")  # a bad output path is named before the target loads
        self.role = role(cfg)  # (producer or trainer, the trainers' group and world); a collective
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        if target is None:
            from flashdraft.models.target import load_target

            target = load_target(cfg.target, dtype=cfg.target_dtype, device=resolve_device(cfg.device))
        self.target = target
        self.bf16 = cfg.bf16 and bf16_is_fast(target.device)
        self.out = Path(cfg.out_dir)
        named = cfg.variant_configs()
        min_block = min(v.block_size for _, v in named)  # the data filter is shared by all variants
        if examples is None:
            if not cfg.data:
                raise TrainError("no training data: pass --data FILE (JSONL/Parquet records) or set data: in the YAML")
            # a reduced draft vocabulary is drawn and its coverage reported per domain: label records that name none
            reduced = any(c.draft_vocab_size or c.objective == "eagle3" for _, c in named)
            examples, self.data_stats = load_examples(cfg.data, target, cfg.max_len, min_block, cfg.append_eos,
                                                      cfg.domain_field, domain_classifier() if reduced else None)
        else:
            self.data_stats = DataStats(kept=len(examples), tokens=sum(len(e.token_ids) for e in examples))
        self.all_examples = examples  # the offline cache holds them all
        self.heldout: list[Example] = []
        if cfg.holdout > 0 and len(examples) > 1:
            perm = np.random.default_rng([cfg.seed, 7]).permutation(len(examples))
            n_hold = min(max(1, int(round(cfg.holdout * len(examples)))), len(examples) - 1)
            hold = set(perm[:n_hold].tolist())
            # a seeded sample of the held-out set, not its lowest indices (those are all the first file's)
            self.heldout = [examples[i] for i in sorted(perm[: min(n_hold, cfg.holdout_max)].tolist())]
            examples = [e for i, e in enumerate(examples) if i not in hold]
        if cfg.train_sequences is not None:
            if cfg.train_sequences > len(examples):
                raise TrainError(
                    f"train_sequences {cfg.train_sequences} is more than the {len(examples)} training sequences the data "
                    "holds after the hold-out; lower it or generate more data"
                )
            keep = np.random.default_rng([cfg.seed, 11]).permutation(len(examples))[: cfg.train_sequences]
            examples = [examples[i] for i in sorted(keep.tolist())]
        self.examples = examples
        self.stream = DataStream(examples, cfg.batch_size, cfg.seed, cfg.pack, cfg.max_len)
        per_step = cfg.batch_size * cfg.grad_accum
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * len(examples) / per_step))
        self.store = None
        if cfg.features:
            from flashdraft.train.features import FeatureStore

            self.store = FeatureStore(cfg.features)
        self.stats_layers = sorted({i for _, c in named for i in objective_class(c.objective).feature_layer_ids(target, c)})
        if self.store is not None:  # refuse a cache made for other data/layers before reading it
            self.store.check(target, self.stats_layers, self.all_examples, need_final=any(objective_class(c.objective).wants_final(c) for _, c in named))
        self.feature_rms = self._channel_rms(self.stats_layers, cfg.stats_sequences)  # [K * H]
        if self.role.is_producer:  # no drafters, optimizers or eval: the first trainer says what to compute
            plan = share_plan(self.role, None)
            self.variants, self.layer_ids, self.want_final = [], plan["layer_ids"], plan["want_final"]
            self.step = plan["step"]
            self.stream.load_state_dict(plan["data"])
            self.channel = FeatureChannel(self.role, target.device, target.dtype)
            return
        resume_step = self._common_checkpoint([self.out / n if n else self.out for n, _ in named]) if cfg.resume else None
        self.feature_stats = feature_stats(self.feature_rms, self.stats_layers)
        # how the training sequences were prompted: saved in each drafter's config, and how eval prompts are rendered
        self.prompting = prompting_of([e.token_ids for e in examples], getattr(target, "tokenizer", None))
        self.variants = [Variant(n, c, self.out, target, examples, self.total_steps, resume_step, self._scale_of,
                                 self.prompting)
                         for n, c in named]
        # the target pass captures the union of the variants' layers; each variant reads its columns
        self.layer_ids = sorted({i for v in self.variants for i in v.drafter.target_layer_ids})
        H = target.hidden_size
        for v in self.variants:
            ids = v.drafter.target_layer_ids
            v.columns = None if ids == self.layer_ids else torch.cat(
                [torch.arange(self.layer_ids.index(i) * H, (self.layer_ids.index(i) + 1) * H) for i in ids]
            ).to(target.device)
        self.want_final = any(v.objective.wants_final(v.cfg) for v in self.variants)
        self.coverage = {v.label: self._coverage(v) for v in self.variants if self._t2d(v) is not None}
        if self.store is not None:
            self.store.check(target, self.layer_ids, self.all_examples, need_final=self.want_final)
        self.step = 0
        if resume_step is not None:
            for v in self.variants:
                state = load_checkpoint(v.resume_from, v.drafter, v.optimizer, v.scheduler)
                if v.ema is not None:
                    if "ema" not in state["extra"]:
                        raise TrainError(f"checkpoint {v.resume_from} has no EMA weights; resume with ema_decay unset")
                    v.ema.load_state_dict(state["extra"]["ema"])
                if v.scale is not None:  # the checkpoint's weights are folded: restore the training form exactly
                    v.drafter.restore_feature_scale(state["extra"], v.scale)
            self.step = int(state["step"])
            self.stream.load_state_dict(state["data"])
        self.channel = None
        if self.role.producers:
            share_plan(self.role, {"layer_ids": self.layer_ids, "want_final": self.want_final, "step": self.step,
                                   "data": self.stream.state_dict()})
            self.channel = FeatureChannel(self.role, target.device, target.dtype)
        self.eval_prompts = eval_prompts
        if self.eval_prompts is None and cfg.eval_prompts and cfg.eval_n:
            self.eval_prompts = load_eval_prompts(cfg.eval_prompts, target, cfg.eval_n,
                                                  ChatSettings("auto" if self.prompting["chat_template"] else "never"))
        self.metrics_path = self.out / "metrics.jsonl"
        self._tb: dict[str, object] = {}
        if cfg.bf16 and not self.bf16:
            self._say("bf16: this CPU has no bf16 matmul hardware (AVX512-BF16 or AMX), where bf16 autocast runs "
                      "~6-20x slower than fp32; training in fp32 (set bf16: false to silence this)")

    @staticmethod
    def _t2d(v: Variant) -> torch.Tensor | None:
        t2d = getattr(v.drafter, "t2d", None)
        return t2d.cpu() if isinstance(t2d, torch.Tensor) else None

    def _coverage(self, v: Variant, n_train: int = 4096) -> dict[str, dict]:
        """What ``v``'s draft vocabulary covers of the target's tokens (supervised spans), per domain: on up to
        ``n_train`` training sequences (a seeded draw) and on the held-out ones."""
        pick = np.random.default_rng([self.cfg.seed, 13]).permutation(len(self.examples))[:n_train]
        report = {"train": coverage_by_domain(self._t2d(v), [self.examples[i] for i in sorted(pick.tolist())],
                                              v.drafter.max_depth)}
        if self.heldout:
            report["heldout"] = coverage_by_domain(self._t2d(v), self.heldout, v.drafter.max_depth)
        return report

    def _write_coverage(self, v: Variant, folder: Path) -> None:
        if v.label in self.coverage and self.is_main:
            atomic_write_text(folder / "vocab_coverage.json", json.dumps(self.coverage[v.label], indent=1))

    @torch.no_grad()
    def _channel_rms(self, layer_ids: list[int], n: int) -> torch.Tensor:
        """Channel RMS [K * H] of the target features over up to ``n`` training sequences (first position
        of each excluded). With feature producer ranks, rank 0 (a producer) computes it for everyone."""
        from flashdraft.train.diagnostics import sample_mask

        D = len(layer_ids) * self.target.hidden_size
        sq, count = torch.zeros(D, dtype=torch.float64), 0
        if not self.role.producers or dist_world()[1] == 0:
            rows = [[e] for e in self.examples[:n]]
            for s in range(0, len(rows), 4):
                part = rows[s : s + 4]
                batch = collate(part, [0] * len(part), self.target.device)
                f = self._features_of(batch, part, layer_ids)[0]  # [b, T, K * H]
                f = f[sample_mask(batch.positions, batch.doc_ids)].double().cpu()  # [N, K * H]
                sq += f.pow(2).sum(0)
                count += f.shape[0]
        rms = (sq / max(count, 1)).sqrt().float()
        if self.role.producers:
            import torch.distributed as dist

            dist.broadcast(rms, src=0)
        return rms

    def _features_of(self, batch, rows, layer_ids: list[int], want_final: bool = False):
        """Features of ``layer_ids`` for a batch: the offline cache, else one target pass."""
        if self.store is not None:
            return self.store.collate(rows, layer_ids, self.target.device, want_final)
        return target_pass(self.target, batch, layer_ids, want_final)

    def _scale_of(self, layer_ids: list[int], mode: str) -> torch.Tensor | None:
        """The fc input scale of a drafter reading ``layer_ids`` (None for mode 'none')."""
        if mode == "none" or not bool((self.feature_rms > 0).any()):
            return None
        H = self.target.hidden_size
        cols = torch.cat([torch.arange(self.stats_layers.index(i) * H, (self.stats_layers.index(i) + 1) * H)
                          for i in layer_ids])
        return feature_scale(self.feature_rms.index_select(0, cols), len(layer_ids), mode)

    @staticmethod
    def _common_checkpoint(folders: list[Path]) -> int | None:
        """Newest step every variant has a complete checkpoint of (a kill between two variants'
        saves leaves one variant a step ahead; all resume from the older common step)."""
        steps = [set(checkpoint_steps(f)) for f in folders]
        common = set.intersection(*steps) if steps else set()
        return max(common) if common else None

    # ---- pieces ---------------------------------------------------------------------------

    @property
    def drafter(self) -> Drafter:
        return self.variants[0].drafter

    @property
    def is_main(self) -> bool:
        """The rank that logs, evaluates and saves: rank 0, or the first trainer after the producers."""
        return dist_world()[1] == self.role.producers

    def _log(self, rec: dict, variant: Variant | None = None) -> None:
        if not self.is_main:
            return
        if variant is not None and variant.name:
            rec = {"variant": variant.name, **rec}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.cfg.tensorboard and variant is not None:
            self._tensorboard(variant, rec)

    def _tensorboard(self, v: Variant, rec: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if v.label not in self._tb:
            self._tb[v.label] = SummaryWriter(str(self.out / "tensorboard" / v.label), purge_step=self.step or None)
        w = self._tb[v.label]
        for k, val in rec.items():
            if k in ("step", "variant", "kind") or isinstance(val, bool):
                continue
            if isinstance(val, (int, float)) and math.isfinite(val):
                w.add_scalar(f"{rec.get('kind', 'train')}/{k}", val, rec["step"])
            elif isinstance(val, list) and val and all(isinstance(x, (int, float)) for x in val):
                for i, x in enumerate(val):
                    if math.isfinite(x):
                        w.add_scalar(f"{rec.get('kind', 'train')}/{k}/{i + 1}", x, rec["step"])
        w.flush()

    def _trim_metrics(self) -> None:
        """After a resume, drop metric lines written after the checkpoint we resume from."""
        if not self.is_main or not self.metrics_path.is_file():
            return
        keep = [l for l in self.metrics_path.read_text().splitlines() if l.strip() and json.loads(l).get("step", 0) <= self.step]
        atomic_write_text(self.metrics_path, "".join(l + "\n" for l in keep))

    def save(self) -> Path | None:
        """Checkpoint every variant at this step, then prune (so a common step always survives)."""
        if not self.is_main:  # every rank holds the same weights and optimizer state
            return None
        paths = []
        for v in self.variants:
            extra = {"ema": v.ema.state_dict()} if v.ema else {}
            if v.scale is not None:  # the saved drafter holds fc.weight folded; resume from the exact training form
                extra.update(v.drafter.feature_scale_state())
            paths.append(save_checkpoint(v.out, self.step, v.drafter, v.optimizer, v.scheduler, self.stream.state_dict(),
                                         v.cfg, extra))
        for v in self.variants:
            prune_checkpoints(v.out, self.cfg.keep_last, protect=v.best.get("step"))
        return paths[0]

    def evaluate(self) -> dict[str, dict] | None:
        """Real greedy tau (the objective's eval method) of every variant (EMA weights if on) on the held-out prompts."""
        if not self.eval_prompts or not self.is_main:
            return None
        out = {}
        for v in self.variants:
            t0 = time.perf_counter()
            with v.eval_weights():
                res = evaluate_tau(self.target, v.drafter, self.eval_prompts, self.cfg.eval_max_new_tokens,
                                   v.objective.eval_method)
            self._log({"step": self.step, "kind": "eval", "eval_tau": res["tau"],
                       "eval_per_position_acceptance": res["per_position_acceptance"], "eval_rounds": res["rounds"],
                       "eval_seconds": time.perf_counter() - t0}, v)
            out[v.label] = res
        return out

    @cached_property
    def ngram(self) -> NgramBaseline:
        """The n-gram / prompt-lookup baselines fitted on the training sequences (fitted once, on first use)."""
        return NgramBaseline(self.examples)

    def diagnose(self) -> dict[str, dict] | None:
        """Held-out per-slot accuracy, context ablation and n-gram baselines of every variant (cfg.holdout)."""
        if not self.heldout or not self.is_main:
            return None
        out = {}
        for v in self.variants:
            t0 = time.perf_counter()
            ids = v.drafter.target_layer_ids
            with v.eval_weights():
                rep = heldout_report(v.objective, self.heldout,
                                     lambda b, rows: self._features_of(b, rows, ids, v.objective.wants_final(v.cfg)),
                                     self.ngram, batch_size=self.cfg.batch_size, seed=self.cfg.seed,
                                     walk=self.cfg.holdout_walk)
            rec = {"step": self.step, "kind": "heldout", "heldout_seconds": time.perf_counter() - t0,
                   "n_anchors": rep["n_anchors"], "ablation_ratio": rep["ablation_ratio"],
                   "ignores_context": rep["ignores_context"], "walk_rounds": rep.get("walk_rounds", 0)}
            for name, m in rep.items():
                if isinstance(m, dict):
                    rec[f"{name}_acc_per_slot"], rec[f"{name}_tau_proxy"] = m["acc_per_slot"], m["tau_proxy"]
                    if "walk_tau" in m:
                        rec[f"{name}_walk_tau"] = m["walk_tau"]
            self._log(rec, v)
            self._say(f"[{v.label}] " + format_report(rep, self.step))
            out[v.label] = rep
        return out

    def calibrate_trees(self) -> None:
        """Set each block drafter's ``tree_temperature`` (saved in its config.json) to the one at which DDTree's
        tree estimates its own acceptance right on the walked held-out sequences (:func:`calibrate_tree`)."""
        on = bool(self.heldout and self.is_main and self.cfg.calibrate_tree and self.cfg.holdout_walk)
        for v in self.variants:
            if v.objective.eval_method != "dflash" or not hasattr(v.drafter.cfg, "tree_temperature"):
                continue  # DDTree reads a block drafter's marginals
            v.drafter.cfg.tree_temperature = None  # an init_from drafter's calibration does not hold for new weights
            if not on:
                continue
            ids = v.drafter.target_layer_ids
            with v.eval_weights():
                cal = calibrate_tree(v.objective, self.heldout[: self.cfg.holdout_walk],
                                     lambda b, rows: self._features_of(b, rows, ids, v.objective.wants_final(v.cfg)),
                                     seed=self.cfg.seed)
            if not cal:
                continue
            v.drafter.cfg.tree_temperature = cal["tree_temperature"]
            self._log({"step": self.step, "kind": "tree_calibration", **cal}, v)
            per = cal["per_temperature"]
            self._say(f"[{v.label}] DDTree@{cal['budget']} on {cal['anchors']} held-out anchors: tree_temperature "
                      f"{cal['tree_temperature']} (drafts accepted / the tree's estimate / walk tau: "
                      + ", ".join(f"T {t:g} {p['accepted']:.2f} / {p['expected']:.2f} / {p['walk_tau']:.2f}"
                                  for t, p in per.items()) + ")")

    def _say(self, text: str) -> None:
        if self.is_main and self.cfg.progress:
            from rich.console import Console

            Console(stderr=True).print(text, markup=False, highlight=False)

    def _track_best(self, evals: dict[str, dict]) -> None:
        """After an eval at a checkpointed step: remember the best step by held-out tau (kept by pruning)."""
        for v in self.variants:
            tau = evals[v.label]["tau"]
            if v.best.get("tau") is None or tau > v.best["tau"]:
                v.best = {"step": self.step, "tau": tau}
                write_best(v.out, v.best)

    def features(self, batch, micro_examples) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Target features of the union layers [b, T, K*H] (+ final hidden [b, T, H] for KL): one
        frozen target pass, rows read from the offline feature cache, or received from a producer rank."""
        if self.channel is not None:
            return self.channel.recv(self.want_final)
        if self.store is None:
            return target_pass(self.target, batch, self.layer_ids, self.want_final)
        feats, final_h = self.store.collate(micro_examples, self.layer_ids, self.target.device, self.want_final)
        return feats, None if final_h is None else final_h.to(self.target.dtype)

    def train_step(self) -> dict[str, dict]:
        """One optimiser step of every variant over ``grad_accum`` micro-batches per rank -> metrics per variant.

        Under torch.distributed every rank draws the same ``grad_accum * world`` micro-batches and
        their anchors (data only, cheap), so the normaliser is global without communication; rank r
        runs micro-batches r, r + world, ... and gradients are summed across ranks. With producer
        ranks, world and r count the trainers only.
        """
        cfg = self.cfg
        world, rank = self.role.world, self.role.dp_rank
        micro, rows = [], []
        for _ in range(cfg.grad_accum * world):
            micro.append(self.stream.next_batch(self.target.device))
            rows.append(self.stream.last_rows)
        blocks = {v.label: [v.objective.blocks(b) for b in micro] for v in self.variants}
        norms = {k: sum(bl.norm for bl in bls) for k, bls in blocks.items()}  # all micro-batches of all ranks
        dev_type = "cpu" if self.target.device.type == "cpu" else "cuda"
        autocast = torch.autocast(dev_type, dtype=torch.bfloat16) if self.bf16 else nullcontext()
        sums: dict[str, dict[str, torch.Tensor]] = {v.label: {} for v in self.variants}  # named sum/total pairs
        for i in range(rank, len(micro), world):
            batch = micro[i]
            feats, final_h = self.features(batch, rows[i])  # paid once for all variants
            for v in self.variants:
                bl = blocks[v.label][i]
                f = feats if v.columns is None else feats.index_select(-1, v.columns)
                with autocast:
                    out = v.objective(batch, bl, norms[v.label], f, final_h, seed=v.seed(self.step, i))
                out.loss.backward()
                add_metrics(sums[v.label], v.objective.metrics(out, batch, bl))
        metrics = {}
        for v in self.variants:
            metrics[v.label] = self._optimizer_step(v, sums[v.label], norms[v.label], world)
        self.step += 1
        for m in metrics.values():
            m["step"] = self.step
        return metrics

    def _optimizer_step(self, v: Variant, sums: dict[str, torch.Tensor], normaliser: float, world: int) -> dict:
        params = [p for g in v.optimizer.param_groups for p in g["params"]]
        if world > 1:
            import torch.distributed as dist

            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.flatten() for g in grads])
            dist.all_reduce(flat, group=self.role.group)
            all_reduce_metrics(sums, self.role.group)
            for p, g in zip(params, flat.split([q.numel() for q in params])):
                p.grad = g.view_as(p).clone()
        clip = v.cfg.grad_clip if v.cfg.grad_clip > 0 else float("inf")
        gnorm = torch.nn.utils.clip_grad_norm_(params, clip)
        if not torch.isfinite(gnorm):
            raise TrainError(f"{v.label}: non-finite gradient norm at step {self.step + 1}; lower lr or check the data")
        lr = v.optimizer.param_groups[0]["lr"]
        v.optimizer.step()
        v.scheduler.step()
        v.optimizer.zero_grad(set_to_none=True)
        if v.ema is not None:
            v.ema.update(v.drafter)
        return {**v.objective.summary(sums, normaliser), "lr": lr, "grad_norm": float(gnorm),
                "epoch": round(self.stream.epoch_float, 4)}

    # ---- the loop -------------------------------------------------------------------------

    def run(self, stop_after: int | None = None) -> TrainResult:
        """Train to ``total_steps`` (or ``stop_after`` more steps, a signal, or ``max_minutes``)."""
        if self.role.is_producer:
            return self.serve(stop_after)
        cfg = self.cfg
        make_output_dir(self.out)
        if self.is_main:
            cfg.save(self.out / "config.yaml")
        self._trim_metrics()
        if self.step == 0:
            self._log({"step": 0, "kind": "data", **{k: v for k, v in vars(self.data_stats).items()},
                       "total_steps": self.total_steps, "variants": [v.label for v in self.variants],
                       "heldout_sequences": len(self.heldout)})
            self._log({"step": 0, "kind": "features", "layers": self.feature_stats,
                       "feature_norm": {v.label: v.cfg.feature_norm for v in self.variants}})
            self._say(format_feature_stats(self.feature_stats))
            for v in self.variants:
                if v.label in self.coverage:
                    self._log({"step": 0, "kind": "vocab_coverage", **self.coverage[v.label]}, v)
                    self._write_coverage(v, v.out)
                    self._say(f"[{v.label}] " + format_coverage(self.coverage[v.label], int(self._t2d(v).sum())))
        result = TrainResult(step=self.step, total_steps=self.total_steps, stopped="done")
        flag: dict[str, str] = {}
        t0, start_step, self._tokens = time.perf_counter(), self.step, 0
        cols = [TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
        try:
            with stop_signals(flag), Progress(*cols, disable=not (cfg.progress and self.is_main)) as bar:
                task = bar.add_task("train", total=self.total_steps, completed=self.step, info="")
                while self.step < self.total_steps:
                    stop = self._one_step(result, bar, task, t0, start_step, stop_after, flag)
                    if stop:
                        result.stopped = stop
                        break
            result.step = self.step
            if result.stopped in ("done", "time"):
                result.heldout = self.diagnose()
                self.calibrate_trees()
                evals = self.evaluate()
                for v in self.variants:
                    rec = result.variants.setdefault(v.label, {})
                    rec["eval"] = evals[v.label] if evals else None
                    if evals and "vocab_coverage" in evals[v.label] and v.label in self.coverage:
                        self.coverage[v.label]["eval"] = {"all": evals[v.label]["vocab_coverage"]}
                        self._say(f"[{v.label}] " + format_coverage({"eval": self.coverage[v.label]["eval"]},
                                                                    int(self._t2d(v).sum())))
                    if self.is_main:
                        with v.eval_weights():
                            rec["final_drafter"] = v.drafter.save_pretrained(v.out / "drafter")
                        self._write_coverage(v, v.out / "drafter")
                first = result.variants[self.variants[0].label]
                result.final_drafter, result.eval = first.get("final_drafter"), first.get("eval")
            for v in self.variants:
                result.variants.setdefault(v.label, {})["losses"] = v.losses
            result.losses = self.variants[0].losses
        finally:
            for w in self._tb.values():
                w.close()
            self._tb = {}
        return result

    def _one_step(self, result, bar, task, t0, start_step, stop_after, flag) -> str | None:
        cfg = self.cfg
        metrics = self.train_step()
        elapsed = time.perf_counter() - t0
        self._tokens += metrics[self.variants[0].label]["tokens"]  # the same batches feed every variant
        for v in self.variants:
            m = metrics[v.label]
            v.losses[self.step] = m["loss"]
            m["tokens_per_s"] = self._tokens / elapsed if elapsed > 0 else 0.0
            m["elapsed_s"] = elapsed
            if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                self._log({"kind": "train", **m}, v)
        m = metrics[self.variants[0].label]
        info = [f"loss {m['loss']:.3f}"] + ([f"acc {m['acc']:.3f}"] if "acc" in m else []) + (
            [f"tau~{m['tau_proxy']:.2f}"] if "tau_proxy" in m else [])  # what the objective reports
        bar.update(task, completed=self.step, info=" ".join(info) + f" {m['tokens_per_s']:.0f} tok/s")
        stop = self._stop(flag, elapsed, start_step, stop_after)
        evals = None
        if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < self.total_steps and not stop:
            self.diagnose()
            evals = self.evaluate()
        if evals:
            self._track_best(evals)
        if stop or evals or self.step % cfg.save_every == 0 or self.step == self.total_steps:
            result.checkpoint = self.save()
        return stop

    def _stop(self, flag, elapsed, start_step, stop_after) -> str | None:
        """Why to stop after this step (None: go on); a collective over all ranks, producers included."""
        stop = None
        if flag.get("signal"):
            stop = "signal"
        elif self.cfg.max_minutes and elapsed > self.cfg.max_minutes * 60:
            stop = "time"
        elif stop_after is not None and self.step - start_step >= stop_after:
            stop = "stop_after"
        if agree(stop is not None):  # every rank stops at the same step
            stop = stop or "signal"
        return stop

    # ---- feature producer (cfg.target_ranks) ----------------------------------------------

    def serve(self, stop_after: int | None = None) -> TrainResult:
        """Producer rank: step for step with the trainers, send the target features of their micro-batches.
        No checkpoints, eval or logs; stops at the same step as the trainers."""
        result = TrainResult(step=self.step, total_steps=self.total_steps, stopped="done")
        flag: dict[str, str] = {}
        t0, start_step = time.perf_counter(), self.step
        with stop_signals(flag), torch.no_grad():
            while self.step < self.total_steps:
                self.channel.serve_step(self.stream, self.cfg.grad_accum * self.role.world, self.target.device,
                                        lambda b: target_pass(self.target, b, self.layer_ids, self.want_final))
                self.step += 1
                stop = self._stop(flag, time.perf_counter() - t0, start_step, stop_after)
                if stop:
                    result.stopped = stop
                    break
        result.step = self.step
        return result
