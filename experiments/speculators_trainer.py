"""speculators 0.9's own DFlash trainer against flashdraft's, on the same data, split, drafter shape and starting
weights (issue: held against a peer). Two steps:

``prepare``: the records (a `flashdraft generate` output) become speculators' training folder: a `datasets` folder
(input_ids, loss_mask, seq_len) and ``hidden_states/hs_{i}.safetensors`` (the target's layers ``--layers`` and its
last layer's output before the final norm, [T, K + 1, H], what speculators' vLLM extraction writes). The rows are
ordered so that speculators' validation split (its last ``1 - train_data_ratio``) is exactly the hold-out that
`flashdraft train --set holdout=0.1` draws (same seed), and the printed ``--train-data-ratio`` selects it. A fresh
flashdraft drafter of the chosen shape (its draft vocabulary drawn from the training rows) is saved and exported
with `flashdraft export --to speculators`, so both trainers start from the same weights. For a Gemma target the
verifier folder speculators reads is a copy whose ``embed_tokens`` rows carry Gemma's sqrt(hidden) scale and whose
``lm_head`` is the raw tied table: speculators loads the raw rows into its embedding otherwise (docs/training.md).

``train``: speculators' ``speculators.train`` main on this CPU. Its trainer moves the model and batches to
``get_local_rank()`` (an int: CUDA device 0) and stops there on a machine without an accelerator
("Cannot access accelerator device when none is available"), and its step timer calls
``torch.accelerator.synchronize()``, which stops the same way; here the first returns the CPU device and the
second does nothing (CPU work is synchronous), and nothing else of speculators changes. Wall time and peak RSS
are printed.

    python experiments/speculators_trainer.py prepare --data runs/mixed/data --out runs/spec
    python experiments/speculators_trainer.py train --out runs/spec -- --epochs 2 ...  (the printed command)
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from flashdraft.io import atomic_write_text
from flashdraft.models.forward import capture_layer_outputs
from flashdraft.models.target import load_target, resolve_target_path
from flashdraft.train.config import TrainConfig
from flashdraft.train.data import load_examples
from flashdraft.train.objective import DFlashObjective


def verifier_folder(target, spec: str, out: Path) -> Path:
    """The target's folder as speculators should read it: for Gemma, embed rows scaled as Gemma's embedding module
    scales them and the tied head written out raw."""
    src = Path(resolve_target_path(spec))
    embed = target.model.get_input_embeddings()
    scale = getattr(embed, "embed_scale", None)
    if scale is None:
        return src
    dst = out / "verifier"
    if not (dst / "model.safetensors").exists():
        from safetensors.torch import load_file, save_file

        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name != "model.safetensors":
                shutil.copy(f, dst / f.name)
        tensors = load_file(src / "model.safetensors")
        key = next(k for k in tensors if k.endswith("embed_tokens.weight"))
        raw = tensors[key]
        tensors["lm_head.weight"] = raw.clone()
        tensors[key] = (raw.float() * float(scale)).to(raw.dtype)
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def prepare(a) -> None:
    from datasets import Dataset
    from safetensors.torch import save_file

    out = Path(a.out)
    (out / "data" / "hidden_states").mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(a.threads)
    target = load_target(a.target)
    cfg = TrainConfig(target=a.target, data=[a.data], num_layers=a.num_layers, block_size=a.block_size,
                      target_layer_ids=a.layers, draft_vocab_size=a.draft_vocab_size, max_len=a.max_len,
                      holdout=a.holdout, seed=a.seed)
    examples, _ = load_examples(cfg.data, target, cfg.max_len, cfg.block_size, cfg.append_eos)
    n = len(examples)
    perm = np.random.default_rng([cfg.seed, 7]).permutation(n)  # flashdraft train's hold-out draw (train/loop.py)
    n_hold = min(max(1, int(round(cfg.holdout * n))), n - 1)
    hold = set(perm[:n_hold].tolist())
    train = [e for i, e in enumerate(examples) if i not in hold]
    held = [e for i, e in enumerate(examples) if i in hold]
    ratio = (n - n_hold + 0.5) / n
    assert int(n * ratio) == len(train)
    rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
    last = target.config.num_hidden_layers - 1
    with torch.no_grad():
        for i, e in enumerate(train + held):
            ids = torch.tensor([e.token_ids])
            with capture_layer_outputs(target, list(a.layers) + [last]) as feats:
                target.model.get_decoder()(input_ids=ids, use_cache=False)
            hs = torch.stack([f[0] for f in feats], dim=1)  # [T, K + 1, H]
            save_file({"hidden_states": hs.to(torch.float32).contiguous(), "token_ids": ids[0]},
                      str(out / "data" / "hidden_states" / f"hs_{i}.safetensors"))
            rows["input_ids"].append(e.token_ids)
            rows["loss_mask"].append([bool(m) for m in e.loss_mask])
            rows["seq_len"].append(len(e.token_ids))
    Dataset.from_dict(rows).with_format("torch").save_to_disk(str(out / "data"))
    drafter = DFlashObjective.new_drafter(target, cfg, train)
    drafter.save_pretrained(out / "init")
    atomic_write_text(out / "init" / "train_config.yaml", json.dumps(cfg.model_dump(mode="json")))
    verifier = verifier_folder(target, a.target, out)
    # the files name this machine's verifier folder: speculators reads the verifier's weights from that name
    subprocess.run([sys.executable, "-m", "flashdraft.cli", "export", str(out / "init"), "--to", "speculators",
                    "--out", str(out / "init_speculators"), "--target", a.target,
                    "--target-ref", str(verifier.resolve())], check=True)
    lens = np.array(rows["seq_len"][: len(train)])
    info = {"rows": n, "train": len(train), "heldout": n_hold, "train_data_ratio": ratio,
            "mean_len": float(lens.mean()), "train_tokens": int(lens.sum()), "verifier": str(verifier)}
    atomic_write_text(out / "prepare.json", json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))


def train(a, rest: list[str]) -> None:
    import speculators.train.trainer as trainer_mod
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig as SpeculatorsConfig

    cpu = torch.device("cpu")
    trainer_mod.get_local_rank = lambda: cpu  # the trainer's device is this CPU ...
    if not torch.accelerator.is_available():  # ... and its step timer's sync a no-op (CPU work is synchronous)
        torch.accelerator.synchronize = lambda *args, **kwargs: None
    torch.set_num_threads(a.threads)
    info = json.loads((Path(a.out) / "prepare.json").read_text())
    argv = ["--speculator-type", "dflash", "--verifier-name-or-path", info["verifier"],
            "--from-pretrained", str(Path(a.out) / "init_speculators"), "--data-path", str(Path(a.out) / "data"),
            "--train-data-ratio", str(info["train_data_ratio"]), "--hidden-states-dtype", "float32",
            "--num-workers", "0", "--on-missing", "raise", "--save-path", str(Path(a.out) / "speculators"),
            "--log-dir", str(Path(a.out) / "speculators_logs"), *rest]
    cfg = SpeculatorsConfig.resolve(argv)
    t0 = time.perf_counter()
    main(cfg)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res = {"wall_s": wall, "peak_rss_mb": rss, "argv": argv}
    atomic_write_text(Path(a.out) / "speculators_run.json", json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="gemma-3-270m")
    p.add_argument("--layers", type=int, nargs="+", default=[1, 8, 15])
    p.add_argument("--num-layers", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--max-len", type=int, default=320)
    p.add_argument("--holdout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    t = sub.add_parser("train", help="speculators' trainer; arguments after -- go to speculators.train")
    t.add_argument("--out", required=True)
    t.add_argument("--threads", type=int, default=2)
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if a.cmd == "prepare":
        prepare(a)
    else:
        train(a, rest)


if __name__ == "__main__":
    main()
