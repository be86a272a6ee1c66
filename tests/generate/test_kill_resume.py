"""SIGKILL a running generation at two random points, resume each time: every prompt ends up exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from flashdraft.generate.output import part_files, read_records
from tests.generate.conftest import write_jsonl

N = 160


def _start(src, model_dir, out):
    cmd = [sys.executable, "-m", "flashdraft.generate.cli", str(src), "--target", str(model_dir), "--backend", "hf",
           "--dtype", "float32", "--max-tokens", "8", "--batch-size", "1", "--chunk-size", "4", "--flush-every", "3",
           "-o", str(out), "--resume", "--no-progress"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)


def test_sigkill_twice_then_resume(tmp_path, tiny_dir):
    rng = random.Random()
    src = write_jsonl(tmp_path / "p.jsonl", [{"id": i, "prompt": f"def function_{i}(x):"} for i in range(N)])
    out = tmp_path / "out"
    seen_parts = 0
    for attempt in range(2):
        proc = _start(src, tiny_dir, out)
        want = seen_parts + rng.randint(1, 6)  # a random point: after some more parts, plus a random delay
        deadline = time.monotonic() + 240
        while len(part_files(out)) < want and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.3))
        assert proc.poll() is None, f"run {attempt} finished before it could be killed:\n{proc.stdout.read()}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        seen_parts = len(part_files(out))
        ids = read_records(out).column("id").to_pylist()
        assert len(ids) == len(set(ids)) and 0 < len(ids) < N  # partial, never duplicated
    proc = _start(src, tiny_dir, out)
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, log
    ids = read_records(out).column("id").to_pylist()
    assert sorted(ids) == sorted(f"p:{i}" for i in range(N)), "every prompt exactly once"
    assert "already written" in log and "done" in log
