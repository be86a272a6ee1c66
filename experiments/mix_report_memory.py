"""Peak memory and time of `flashdraft mix report` on N synthetic rows (default 1,000,000).

    python experiments/mix_report_memory.py                 # 1M rows, Parquet
    python experiments/mix_report_memory.py --rows 100000 --format jsonl

Rows are synthetic (short templated samples of each domain in `flashdraft generate`'s layout:
source, id, messages, response); they exist only to show that memory stays bounded as the row
count grows. The report runs in a child process, whose peak RSS (ru_maxrss) is printed.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEMPLATES = [
    ("Write a Python function that returns the {n}th Fibonacci number.",
     "```python\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n```"),
    ("A shop sells {n} apples at $3 each. How much is that?", "{n} * 3 = {m}. The answer is $\\boxed{{{m}}}$."),
    ("Give me {n} tips for staying focused.", "Take short breaks, keep your desk tidy and set one goal per hour."),
    ("Translate to German: I have {n} cats.", "Ich habe {n} Katzen."),
    ("<|tools|>\n[{{\"name\": \"get_time\", \"parameters\": {{\"type\": \"object\", \"properties\": {{}}}}}}]\n"
     "What time is it in city {n}?", "{{\"name\": \"get_time\", \"arguments\": {{\"city\": \"{n}\"}}}}"),
]


def make_rows(path: Path, n: int, fmt: str, seed: int = 0) -> None:
    """Write ``n`` synthetic rows to ``path`` in chunks (JSONL or Parquet)."""
    rng = random.Random(seed)
    chunk = 50_000

    def rows(start: int, stop: int):
        for i in range(start, stop):
            p, r = TEMPLATES[rng.randrange(len(TEMPLATES))]
            k = rng.randrange(2, 999)
            yield {"source": f"src{i % 4}", "id": str(i), "messages": [{"role": "user", "content": p.format(n=k)}],
                   "response": r.format(n=k, m=3 * k)}

    if fmt == "jsonl":
        with open(path, "w") as fh:
            for s in range(0, n, chunk):
                fh.write("".join(json.dumps(r) + "\n" for r in rows(s, min(n, s + chunk))))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        writer = None
        for s in range(0, n, chunk):
            t = pa.Table.from_pylist(list(rows(s, min(n, s + chunk))))
            writer = writer or pq.ParquetWriter(path, t.schema)
            writer.write_table(t)
        writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--format", choices=["parquet", "jsonl"], default="parquet")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / f"synthetic.{a.format}"
        t0 = time.perf_counter()
        make_rows(data, a.rows, a.format)
        print(f"wrote {a.rows:,} synthetic rows ({data.stat().st_size / 2**20:.0f} MiB {a.format}) in "
              f"{time.perf_counter() - t0:.0f} s")
        t0 = time.perf_counter()
        code = ("import sys; from typer.testing import CliRunner; from flashdraft.mix.cli import app; "
                "r = CliRunner().invoke(app, ['report', sys.argv[1], '--out', sys.argv[2]]); "
                "print(r.output); sys.exit(r.exit_code)")
        proc = subprocess.run([sys.executable, "-c", code, str(data), str(Path(d) / "rep")], capture_output=True,
                              text=True)
        dt = time.perf_counter() - t0
        print(proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else proc.stderr[-2000:])
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"report: {dt:.0f} s wall ({a.rows / dt:,.0f} rows/s), peak RSS of the report process: {peak:,.0f} MiB, "
              f"exit {proc.returncode}")


if __name__ == "__main__":
    main()
