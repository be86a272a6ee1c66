"""1 feature-producer rank + 2 trainer ranks (gloo) == one process with grad_accum 2; only the first trainer writes.

Two variants (CE on layers [1, 3], KL on layer [2]) so the producer sends union-layer features and the final hidden.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashdraft.models.dflash import DFlashDrafter
from flashdraft.train.config import TrainConfig
from flashdraft.train.loop import Trainer
from flashdraft.train.objective import TrainError
from tests.tiny import tiny_target

from .test_loop import make_cfg, write_data

VARIANTS = [{"name": "ce"}, {"name": "kl", "loss": "kl", "target_layer_ids": [2]}]


def cfg_for(out, data, **kw):
    return make_cfg(out, data, max_steps=3, feature_noise=0.0, variants=VARIANTS, **kw)


def _rank(rank: int, world: int, port: int, tmp: str, data: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if rank > 0:  # trainers must get every feature from the producer
        from flashdraft.train import loop

        def no_target_pass(*a, **k):
            raise AssertionError("a trainer ran the target")

        loop.target_pass = no_target_pass
    try:  # each rank its own out_dir, to see who writes what
        cfg = cfg_for(Path(tmp, f"r{rank}"), data, grad_accum=1, target_ranks=1)
        res = Trainer(cfg, target=tiny_target("qwen3")).run()
        out = {"losses": {k: v["losses"] for k, v in res.variants.items()}, "step": res.step, "stopped": res.stopped}
        Path(tmp, f"result{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def test_one_producer_two_trainers_match_one_process_with_accumulation(tmp_path):
    data = str(write_data(tmp_path / "d.jsonl", n=6))
    single = Trainer(cfg_for(tmp_path / "one", data, grad_accum=2), target=tiny_target("qwen3")).run()
    port = 30500 + os.getpid() % 1000
    three = tmp_path / "three"
    mp.spawn(_rank, args=(3, port, str(three), data), nprocs=3, join=True)
    res = [json.loads((three / f"result{r}.json").read_text()) for r in range(3)]
    assert [(r["step"], r["stopped"]) for r in res] == [(3, "done")] * 3  # the producer ends with the trainers
    assert res[0]["losses"] == {}
    for name in ("ce", "kl"):
        want = single.variants[name]["losses"]
        l1, l2 = ({int(k): v for k, v in r["losses"][name].items()} for r in res[1:])
        assert l1 == l2 and list(l1) == list(want) == [1, 2, 3]  # both trainers report the global loss
        for k in l1:
            assert l1[k] == pytest.approx(want[k], rel=1e-5)
        a = DFlashDrafter.from_pretrained(tmp_path / "one" / "run" / name / "drafter")
        b = DFlashDrafter.from_pretrained(three / "r1" / "run" / name / "drafter")
        for va, vb in zip(a.state_dict().values(), b.state_dict().values()):
            torch.testing.assert_close(va, vb, rtol=1e-4, atol=1e-5)
        assert any((three / "r1" / "run" / name / "checkpoints").iterdir())
    assert (three / "r1" / "run" / "metrics.jsonl").is_file()
    for r in (0, 2):  # the producer and the second trainer write nothing
        assert [p for p in (three / f"r{r}").rglob("*") if p.is_file()] == []


def test_target_ranks_must_leave_a_trainer(tmp_path):
    data = write_data(tmp_path / "d.jsonl", n=2, short=0)
    with pytest.raises(TrainError, match=r"target_ranks 1 leaves no trainer in a world of 1 .*launch more processes"):
        Trainer(make_cfg(tmp_path, data, target_ranks=1), target=tiny_target("qwen3"))
    with pytest.raises(ValueError, match="offline cache needs no target ranks"):
        TrainConfig(target_ranks=1, features=str(tmp_path / "cache"))
