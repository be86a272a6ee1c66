"""Training from the offline feature cache gives the same numbers as the online target pass."""

from __future__ import annotations

import pytest

from flashdraft.train.data import load_examples
from flashdraft.train.features import write_features
from flashdraft.train.loop import Trainer
from flashdraft.train.objective import TrainError
from tests.tiny import tiny_target

from .test_loop import make_cfg, write_data


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("data") / "train.jsonl")


def cache_for(tmp_path, data, layer_ids, with_final=False, dtype="float32", block_size=4):
    target = tiny_target("qwen3")
    examples, _ = load_examples([str(data)], target, 64, block_size)
    return write_features(target, examples, layer_ids, tmp_path / "feats", shard_size=4, dtype=dtype,
                          with_final=with_final, progress=False)


@pytest.mark.parametrize("loss", ["ce", "kl"])
def test_offline_features_give_the_online_losses(tmp_path, data, loss):
    cache = cache_for(tmp_path, data, [1, 2, 3], with_final=loss == "kl")
    online = Trainer(make_cfg(tmp_path / "on", data, loss=loss), target=tiny_target("qwen3")).run()
    offline = Trainer(make_cfg(tmp_path / "off", data, loss=loss, features=str(cache)), target=tiny_target("qwen3")).run()
    assert list(online.losses) == list(offline.losses) == [1, 2, 3, 4, 5, 6]
    for k in online.losses:  # fp32 cache: equal up to the batched-vs-single target forward's rounding
        assert offline.losses[k] == pytest.approx(online.losses[k], rel=1e-5, abs=1e-6)


def test_a_cache_for_other_layers_or_data_is_refused(tmp_path, data):
    cache = cache_for(tmp_path, data, [2])
    with pytest.raises(TrainError, match=r"\[2\].*\[1, 3\]|\[1, 3\].*\[2\]"):
        Trainer(make_cfg(tmp_path, data, features=str(cache)), target=tiny_target("qwen3"))
    other = write_data(tmp_path / "other.jsonl", n=4, seed=5)
    cache2 = cache_for(tmp_path / "o", other, [1, 3])
    with pytest.raises(TrainError, match="data"):
        Trainer(make_cfg(tmp_path, data, features=str(cache2)), target=tiny_target("qwen3"))
    with pytest.raises(TrainError, match="target"):
        Trainer(make_cfg(tmp_path, data, features=str(cache_for(tmp_path / "t", data, [1, 3]))),
                target=tiny_target("qwen3", seed=3))
