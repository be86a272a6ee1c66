"""The training loop: AdamW + warmup/cosine, clipping, bf16 autocast, metrics, checkpoints, resume, eval, export.

One optimiser step = ``grad_accum`` micro-batches. Anchors of all of them are drawn first, so the
loss normaliser (the summed position weights of every valid (anchor, slot) of the step) is known
before any backward and does not depend on how the step is split into micro-batches.
"""

from __future__ import annotations

import json
import math
import random
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from flashdraft.io import atomic_write_text
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from flashdraft.train.config import TrainConfig
from flashdraft.train.data import DataStats, DataStream, Example, load_examples
from flashdraft.train.evaluate import evaluate_tau, load_eval_prompts
from flashdraft.train.objective import DFlashObjective, TrainError, acceptance_metrics, init_norm_from_target


@dataclass
class TrainResult:
    step: int
    total_steps: int
    stopped: str  # "done", "signal", "time", "stop_after"
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss, this process only
    checkpoint: Path | None = None
    final_drafter: Path | None = None
    eval: dict | None = None


@contextmanager
def stop_signals(flag: dict):
    """SIGTERM/SIGINT set ``flag['signal']``; the loop then saves a checkpoint and returns."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def handler(signum, _frame):
        flag["signal"] = signal.Signals(signum).name

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def dist_world() -> tuple[int, int]:
    """(world size, rank); (1, 0) without an initialised torch.distributed process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def agree(flag: bool) -> bool:
    """True on every rank if it is True on any (stop decisions must be collective)."""
    import torch.distributed as dist

    if dist_world()[0] == 1:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def make_scheduler(optimizer, total_steps: int, warmup_ratio: float, min_lr_ratio: float, lr: float):
    """Linear warmup then cosine decay to ``lr * min_lr_ratio`` (torch.optim.lr_scheduler)."""
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    warm = int(round(total_steps * warmup_ratio))
    cosine = CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warm), eta_min=lr * min_lr_ratio)
    if warm == 0:
        return cosine
    linear = LinearLR(optimizer, start_factor=1.0 / (warm + 1), end_factor=1.0, total_iters=warm)
    return SequentialLR(optimizer, [linear, cosine], milestones=[warm])


class Trainer:
    """Builds target, drafter, data and optimiser from a :class:`TrainConfig` and runs the loop."""

    def __init__(self, cfg: TrainConfig, target=None, examples: list[Example] | None = None, eval_prompts=None):
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        if target is None:
            from flashdraft.models.target import load_target

            target = load_target(cfg.target)
        self.target = target
        self.out = Path(cfg.out_dir)
        self.resume_from = latest_checkpoint(self.out) if cfg.resume else None
        if self.resume_from is not None:  # the checkpoint's own drafter config wins (same shape)
            self.drafter = DFlashDrafter.from_pretrained(self.resume_from / "drafter", target)
        elif cfg.init_from:
            self.drafter = DFlashDrafter.from_pretrained(cfg.init_from, target)
        else:
            self.drafter = DFlashDrafter.for_target(
                target, num_layers=cfg.num_layers, block_size=cfg.block_size, target_layer_ids=cfg.target_layer_ids,
                mask_token_id=cfg.mask_token_id, intermediate_size=cfg.intermediate_size, seed=cfg.seed,
            )
            if cfg.init_norm_from_target:
                init_norm_from_target(self.drafter, target)
        self.drafter.float().train()
        B = self.drafter.block_size
        if examples is None:
            if not cfg.data:
                raise TrainError("no training data: pass --data FILE (JSONL/Parquet records) or set data: in the YAML")
            examples, self.data_stats = load_examples(cfg.data, target, cfg.max_len, B, cfg.append_eos)
        else:
            self.data_stats = DataStats(kept=len(examples), tokens=sum(len(e.token_ids) for e in examples))
        self.stream = DataStream(examples, cfg.batch_size, cfg.seed, cfg.pack, cfg.max_len)
        per_step = cfg.batch_size * cfg.grad_accum
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * len(examples) / per_step))
        self.objective = DFlashObjective(
            self.drafter, cfg.max_anchors, cfg.gamma, cfg.loss, cfg.feature_noise, cfg.lm_head_chunk, cfg.checkpoint_layers,
            cfg.checkpoint_lm_head, cfg.loss_vocab,
        )
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, self.total_steps, cfg.warmup_ratio, cfg.min_lr_ratio, cfg.lr)
        self.step = 0
        if self.resume_from is not None:
            state = load_checkpoint(self.resume_from, self.drafter, self.optimizer, self.scheduler)
            self.step = int(state["step"])
            self.stream.load_state_dict(state["data"])
        self.eval_prompts = eval_prompts
        if self.eval_prompts is None and cfg.eval_prompts and cfg.eval_n:
            self.eval_prompts = load_eval_prompts(cfg.eval_prompts, target, cfg.eval_n)
        self.metrics_path = self.out / "metrics.jsonl"

    # ---- pieces ---------------------------------------------------------------------------

    @property
    def is_main(self) -> bool:
        return dist_world()[1] == 0

    def _log(self, rec: dict) -> None:
        if not self.is_main:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _trim_metrics(self) -> None:
        """After a resume, drop metric lines written after the checkpoint we resume from."""
        if not self.is_main or not self.metrics_path.is_file():
            return
        keep = [l for l in self.metrics_path.read_text().splitlines() if l.strip() and json.loads(l).get("step", 0) <= self.step]
        atomic_write_text(self.metrics_path, "".join(l + "\n" for l in keep))

    def save(self) -> Path | None:
        if not self.is_main:  # every rank holds the same weights and optimizer state
            return None
        return save_checkpoint(
            self.out, self.step, self.drafter, self.optimizer, self.scheduler, self.stream.state_dict(), self.cfg,
            self.cfg.keep_last,
        )

    def evaluate(self) -> dict | None:
        if not self.eval_prompts or not self.is_main:
            return None
        t0 = time.perf_counter()
        res = evaluate_tau(self.target, self.drafter, self.eval_prompts, self.cfg.eval_max_new_tokens, "dflash")
        rec = {"step": self.step, "kind": "eval", "eval_tau": res["tau"],
               "eval_per_position_acceptance": res["per_position_acceptance"], "eval_rounds": res["rounds"],
               "eval_seconds": time.perf_counter() - t0}
        self._log(rec)
        return res

    def train_step(self) -> dict:
        """One optimiser step over ``grad_accum`` micro-batches per rank -> metrics of the step.

        Under torch.distributed every rank draws the same ``grad_accum * world`` micro-batches and
        their anchors (data only, cheap), so the normaliser is global without communication; rank r
        runs micro-batches r, r + world, ... and gradients are summed across ranks.
        """
        cfg = self.cfg
        world, rank = dist_world()
        micro = [self.stream.next_batch(self.target.device) for _ in range(cfg.grad_accum * world)]
        blocks = [self.objective.blocks(b) for b in micro]
        normaliser = sum(bl.weight_sum for bl in blocks)  # all micro-batches of all ranks
        dev_type = "cpu" if self.target.device.type == "cpu" else "cuda"
        autocast = torch.autocast(dev_type, dtype=torch.bfloat16) if cfg.bf16 else nullcontext()
        sums = torch.zeros(5, dtype=torch.float64)  # loss_sum, tokens, acc * n, tau * n, n
        for batch, bl in list(zip(micro, blocks))[rank::world]:
            with autocast:
                out = self.objective(batch, bl, normaliser)
            out.loss.backward()
            a = acceptance_metrics(out.correct, bl.weights)
            n = a["n_anchors"]
            sums += torch.tensor([out.weighted_loss_sum, batch.num_tokens, a["acc"] * n if n else 0.0,
                                  a["tau_proxy"] * n if n else 0.0, n], dtype=torch.float64)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        if world > 1:
            import torch.distributed as dist

            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.flatten() for g in grads])
            dist.all_reduce(flat)
            dist.all_reduce(sums)
            for p, g in zip(params, flat.split([q.numel() for q in params])):
                p.grad = g.view_as(p).clone()
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        if not torch.isfinite(gnorm):
            raise TrainError(f"non-finite gradient norm at step {self.step + 1}; lower --lr or check the data")
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        loss_sum, tokens, acc_n, tau_n, n = sums.tolist()
        return {
            "step": self.step, "loss": loss_sum / max(normaliser, 1e-12), "lr": lr, "grad_norm": float(gnorm),
            "acc": acc_n / max(n, 1), "tau_proxy": tau_n / max(n, 1), "tokens": int(tokens), "anchors": int(n),
            "epoch": round(self.stream.epoch_float, 4),
        }

    # ---- the loop -------------------------------------------------------------------------

    def run(self, stop_after: int | None = None) -> TrainResult:
        """Train to ``total_steps`` (or ``stop_after`` more steps, a signal, or ``max_minutes``)."""
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        if self.is_main:
            cfg.save(self.out / "config.yaml")
        self._trim_metrics()
        if self.step == 0:
            self._log({"step": 0, "kind": "data", **{k: v for k, v in vars(self.data_stats).items()},
                       "total_steps": self.total_steps})
        result = TrainResult(step=self.step, total_steps=self.total_steps, stopped="done")
        flag: dict[str, str] = {}
        t0, tok_done, start_step = time.perf_counter(), 0, self.step
        cols = [TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
        with stop_signals(flag), Progress(*cols, disable=not (cfg.progress and self.is_main)) as bar:
            task = bar.add_task("train", total=self.total_steps, completed=self.step, info="")
            while self.step < self.total_steps:
                m = self.train_step()
                result.losses[self.step] = m["loss"]
                tok_done += m["tokens"]
                elapsed = time.perf_counter() - t0
                m["tokens_per_s"] = tok_done / elapsed if elapsed > 0 else 0.0
                m["elapsed_s"] = elapsed
                if self.step % cfg.log_every == 0 or self.step == self.total_steps:
                    self._log({"kind": "train", **m})
                bar.update(task, completed=self.step,
                           info=f"loss {m['loss']:.3f} acc {m['acc']:.3f} tau~{m['tau_proxy']:.2f} {m['tokens_per_s']:.0f} tok/s")
                if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < self.total_steps:
                    self.evaluate()
                stop = None
                if flag.get("signal"):
                    stop = "signal"
                elif cfg.max_minutes and elapsed > cfg.max_minutes * 60:
                    stop = "time"
                elif stop_after is not None and self.step - start_step >= stop_after:
                    stop = "stop_after"
                if agree(stop is not None):  # every rank stops at the same step
                    stop = stop or "signal"
                if stop or self.step % cfg.save_every == 0 or self.step == self.total_steps:
                    result.checkpoint = self.save()
                if stop:
                    result.stopped = stop
                    break
        result.step = self.step
        if result.stopped in ("done", "time"):
            result.eval = self.evaluate()
            if self.is_main:
                result.final_drafter = self.drafter.save_pretrained(self.out / "drafter")
        return result
