"""Process groups: ``torchrun`` set-up, this rank's device, collective stop decisions, signals."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

import torch
import torch.distributed as dist


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
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def agree(flag: bool) -> bool:
    """True on every rank if it is True on any (stop decisions must be collective)."""
    if dist_world()[0] == 1:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda:LOCAL_RANK`` when CUDA is available (one GPU per torchrun process), else ``cpu``."""
    if device != "auto":
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu"


def init_distributed() -> bool:
    """Under ``torchrun`` (WORLD_SIZE > 1): join the process group once. CUDA tensors go over NCCL,
    CPU ones (stop flags, metric sums) over gloo; without CUDA everything is gloo. -> whether it did."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")
    return True


def bf16_is_fast(device: torch.device) -> bool:
    """Whether bf16 matmuls run in hardware here: any CUDA device, or a CPU with AVX512-BF16 or AMX.

    On an AVX2-only CPU bf16 is emulated: a [4096, 640] x [640, 8192] matmul took 5.8 s in bf16 against
    0.99 s in fp32 on one core of this project's CI machine (AMD EPYC), and a Gemma-3-270M recipe step
    125 s against 6.3 s.
    """
    if device.type != "cpu":
        return True
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
