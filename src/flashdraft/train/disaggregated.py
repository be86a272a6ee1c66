"""Disaggregated training on one box: some ranks only run the frozen target and stream its features
to the ranks that train the drafters, over point-to-point ``send``/``recv`` (gloo or NCCL), no disk.

With ``target_ranks = N`` in a world of W processes, ranks 0..N-1 are *producers* and ranks N..W-1
*trainers*. The trainers are the data-parallel world (W - N ranks, their own process group for the
gradient all-reduce), so the losses equal those of a plain (W - N)-rank run. Every rank draws the
same micro-batches from the same seeded stream, so only features travel: producer p serves the
trainers whose index among trainers is p modulo N, and for each micro-batch such a trainer runs it
sends the union-layer features [b, T, K*H] (then the final hidden state [b, T, H] if a variant
trains with KL), each as a 3-int shape header followed by the data.

Trainers still load the whole target: on GPUs its embedding and LM head, which the drafter borrows,
are the only parts a trainer uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from flashdraft.train.config import TrainConfig
from flashdraft.train.objective import TrainError


@dataclass(frozen=True)
class Role:
    """Where this process sits: its global rank, how many producer ranks precede the trainers, the
    data-parallel world (the trainers) and the trainers' process group (None = the default group)."""

    rank: int
    producers: int
    world: int
    group: object = None

    @property
    def is_producer(self) -> bool:
        return self.rank < self.producers

    @property
    def dp_rank(self) -> int:
        """Index among the trainers (micro-batches dp_rank, dp_rank + world, ... are this rank's)."""
        return self.rank - self.producers

    def producer_of(self, dp_rank: int) -> int:
        """Global rank of the producer that serves the trainer with index ``dp_rank``."""
        return dp_rank % self.producers


def role(cfg: TrainConfig) -> Role:
    """This rank's role under ``cfg.target_ranks`` (a collective: every rank must call it, in order)."""
    world, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_available() and dist.is_initialized() else (1, 0)
    n = cfg.target_ranks
    if n == 0:
        return Role(rank, 0, world)
    if n >= world:
        raise TrainError(
            f"target_ranks {n} leaves no trainer in a world of {world} process(es); launch more processes "
            f"(e.g. torchrun --nproc-per-node {n + 1}) or set target_ranks below {world} (0 = no producers)"
        )
    group = dist.new_group(ranks=list(range(n, world)))  # every rank must take part in creating it
    return Role(rank, n, world - n, group)


def share_plan(r: Role, plan: dict | None) -> dict:
    """The first trainer's plan (layer ids, KL or not, resume step and data position) on every rank."""
    box = [plan]
    dist.broadcast_object_list(box, src=r.producers)
    return box[0]


class FeatureChannel:
    """Producer -> trainer feature stream. Producers ``send`` without waiting (the next micro-batch's
    target pass overlaps the trainer's step) and ``flush`` at the end of each step."""

    def __init__(self, r: Role, device: torch.device, dtype: torch.dtype):
        self.role, self.device, self.dtype = r, device, dtype
        self._pending: list[tuple[list, list[torch.Tensor]]] = []  # works + the tensors they read

    def serve_step(self, stream, n_micro: int, device: torch.device, compute) -> None:
        """Producer: draw one step's ``n_micro`` micro-batches like every trainer (trainer i % world runs
        micro-batch i); for those of the trainers this rank serves, ``compute(batch)`` -> send."""
        world = self.role.world
        for i in range(n_micro):
            batch = stream.next_batch(device)
            if self.role.producer_of(i % world) == self.role.rank:
                self.send(i % world, *compute(batch))
        self.flush()

    def send(self, dp_rank: int, features: torch.Tensor, final: torch.Tensor | None) -> None:
        dst = self.role.producers + dp_rank
        for t in (features, final):
            if t is None:
                continue
            t = t.contiguous()
            header = torch.tensor(t.shape, dtype=torch.int64, device=t.device)  # [3]: b, T, D
            self._pending.append(([dist.isend(header, dst), dist.isend(t, dst)], [header, t]))

    def flush(self) -> None:
        for works, _ in self._pending:
            for w in works:
                w.wait()
        self._pending.clear()

    def recv(self, want_final: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(features [b, T, K*H], final hidden [b, T, H] | None) of this trainer's next micro-batch."""
        src = self.role.producer_of(self.role.dp_rank)
        features = self._recv(src)
        return features, self._recv(src) if want_final else None

    def _recv(self, src: int) -> torch.Tensor:
        header = torch.empty(3, dtype=torch.int64, device=self.device)
        dist.recv(header, src)
        t = torch.empty(header.tolist(), dtype=self.dtype, device=self.device)  # [b, T, D]
        dist.recv(t, src)
        return t
