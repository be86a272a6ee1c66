"""The embedding head without the transformer: a stand-in encoder maps texts to fixed vectors."""

import numpy as np
import pytest

from flashdraft.mix.domains import MixError
from flashdraft.mix.embed import EmbeddingClassifier, fit_head
from flashdraft.mix.records import Sample


class FakeEncoder:
    def __call__(self, texts):
        return np.array([[1.0, 0.0] if "def " in t else [0.0, 1.0] for t in texts])


def test_fit_head_separates_two_clusters():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(2, 0.3, (20, 3)), rng.normal(-2, 0.3, (20, 3))])
    y = np.array([0] * 20 + [1] * 20)
    w, b = fit_head(x, y, 2)
    assert ((x @ w + b).argmax(1) == y).all()


def test_train_save_load_classify(tmp_path):
    samples = [Sample("s", str(i), "q", "def f(): pass" if i % 2 else "hello there") for i in range(10)]
    gold = ["coding" if i % 2 else "general" for i in range(10)]
    clf = EmbeddingClassifier.train(samples, gold, encoder=FakeEncoder())
    clf.save(tmp_path / "head.npz")
    loaded = EmbeddingClassifier.load(tmp_path / "head.npz")
    loaded._encoder = FakeEncoder()
    labels = loaded.classify_batch([Sample("s", "x", "q", "def g(): pass")])
    assert labels[0].domain == "coding" and labels[0].signals["p_coding"] > 0.5


def test_errors():
    with pytest.raises(MixError, match="at least two domains"):
        EmbeddingClassifier.train([Sample("s", "1", "a", "b")], ["coding"], encoder=FakeEncoder())
    with pytest.raises(MixError, match="train one"):
        EmbeddingClassifier.load("/nonexistent/head.npz")
