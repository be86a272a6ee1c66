"""Two gloo ranks with grad_accum 1 == one process with grad_accum 2 (same micro-batches, same normaliser)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashdraft.models.dflash import DFlashDrafter
from flashdraft.train.loop import Trainer
from tests.tiny import tiny_target

from .test_loop import make_cfg, write_data


def _rank(rank: int, world: int, port: int, tmp: str, data: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from pathlib import Path

        res = Trainer(make_cfg(Path(tmp), data, grad_accum=1, max_steps=3, feature_noise=0.0),
                      target=tiny_target("qwen3")).run()
        Path(tmp, f"losses{rank}.json").write_text(json.dumps(res.losses))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_one_process_with_accumulation(tmp_path):
    data = str(write_data(tmp_path / "d.jsonl", n=6))
    single = Trainer(make_cfg(tmp_path / "one", data, grad_accum=2, max_steps=3, feature_noise=0.0),
                     target=tiny_target("qwen3")).run()
    port = 29500 + os.getpid() % 1000
    mp.spawn(_rank, args=(2, port, str(tmp_path / "two"), data), nprocs=2, join=True)
    l0 = {int(k): v for k, v in json.loads((tmp_path / "two" / "losses0.json").read_text()).items()}
    l1 = {int(k): v for k, v in json.loads((tmp_path / "two" / "losses1.json").read_text()).items()}
    assert l0 == l1  # every rank reports the global loss
    assert list(l0) == list(single.losses)
    for k in l0:
        assert l0[k] == pytest.approx(single.losses[k], rel=1e-5)
    a = DFlashDrafter.from_pretrained(tmp_path / "one" / "run" / "drafter")
    b = DFlashDrafter.from_pretrained(tmp_path / "two" / "run" / "drafter")
    for va, vb in zip(a.state_dict().values(), b.state_dict().values()):
        torch.testing.assert_close(va, vb, rtol=1e-4, atol=1e-5)


def test_torchrun_cli_runs_ddp(tmp_path):
    """`torchrun --nproc-per-node 2 -m flashdraft.cli train` joins a gloo group and equals one process."""
    import subprocess
    import sys

    from .test_data_cli import word_tokenizer

    folder = tmp_path / "tiny-target"
    tiny_target("qwen3").model.save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    data = str(write_data(tmp_path / "d.jsonl", n=6))
    common = ["--target", str(folder), "--data", data, "--max-steps", "2", "--batch-size", "2", "--block-size", "4",
              "--set", "target_layer_ids=[1, 3]", "--set", "mask_token_id=95", "--set", "max_len=64",
              "--set", "max_anchors=4", "--set", "tensorboard=false", "--set", "progress=false", "--set", "threads=1"]
    one = subprocess.run([sys.executable, "-m", "flashdraft.cli", "train", "--out-dir", str(tmp_path / "one"),
                          "--grad-accum", "2", *common], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    port = str(29500 + (os.getpid() + 7) % 1000)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port,
                          "-m", "flashdraft.cli", "train", "--out-dir", str(tmp_path / "two"), "--grad-accum", "1",
                          *common], capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]

    def losses(run):
        lines = [json.loads(l) for l in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return [l["loss"] for l in lines if l["kind"] == "train"]

    assert len(losses("two")) == 2  # rank 0 logs once per step
    assert losses("two") == pytest.approx(losses("one"), rel=1e-5)
