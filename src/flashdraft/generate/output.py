"""Output folder: Parquet parts written atomically, an append-only error file and the manifest.

Layout of ``OUTPUT/``::

    part-s00000-w0-000001.parquet   records (columns: source, id, messages, response, token_ids, loss_mask, ...)
    errors-s00000-w0.jsonl          one JSON line per skipped or failed sample: {source, id, reason, detail}
    manifest.json                   config, counts, tokens, throughput (rewritten atomically)

Every part is complete or absent (temp file + fsync + rename), so after a kill at any moment the set
of ids in the parts is exactly the set of finished samples: ``--resume`` skips those and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flashdraft.errors import FlashdraftError
from flashdraft.io import atomic_write_bytes, atomic_write_text, make_output_dir

SCHEMA = pa.schema([
    ("source", pa.string()),
    ("id", pa.string()),
    ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("response", pa.string()),
    ("token_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("num_turns", pa.int32()),
    ("finish_reason", pa.string()),
])
PART_RE = re.compile(r"part-s(\d+)-w(\d+)-(\d+)\.parquet$")


class OutputError(FlashdraftError, RuntimeError):
    """An output folder that cannot be used as asked (e.g. not empty without --resume)."""


def part_files(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).glob("part-*.parquet") if PART_RE.search(p.name))


def written_ids(folder: Path) -> list[str]:
    """Ids of every record in the folder's parts (duplicates kept, so callers can check)."""
    ids: list[str] = []
    for p in part_files(folder):
        ids.extend(pq.read_table(p, columns=["id"]).column("id").to_pylist())
    return ids


def read_records(folder: Path) -> pa.Table:
    """All records of an output folder as one table."""
    parts = part_files(folder)
    return pa.concat_tables([pq.read_table(p) for p in parts]) if parts else SCHEMA.empty_table()


def read_errors(folder: Path) -> list[dict]:
    """Error entries of every worker; a torn last line (killed mid-write) is ignored."""
    out = []
    for p in sorted(Path(folder).glob("errors-*.jsonl")):
        for line in p.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class OutputWriter:
    """Buffers records of one worker and writes them as Parquet parts; appends errors."""

    def __init__(self, folder: str | Path, shard_index: int = 0, worker: int = 0, flush_every: int = 512,
                 flush_seconds: float = 300.0):
        self.folder = Path(folder)
        make_output_dir(self.folder)
        self.tag = f"s{shard_index:05d}-w{worker}"
        self.flush_every, self.flush_seconds = flush_every, flush_seconds
        self.buffer: list[dict] = []
        self.last_flush = time.monotonic()
        seqs = [int(m.group(3)) for p in part_files(self.folder) if (m := PART_RE.search(p.name))
                and f"s{m.group(1)}-w{m.group(2)}" == self.tag]
        self.seq = max(seqs, default=0)
        self.error_path = self.folder / f"errors-{self.tag}.jsonl"
        if self.error_path.exists() and self.error_path.stat().st_size:
            with open(self.error_path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
            if torn:  # a kill mid-line: terminate it so the next entry starts clean
                with open(self.error_path, "a") as f:
                    f.write("\n")

    def add(self, record: dict) -> None:
        self.buffer.append(record)
        if len(self.buffer) >= self.flush_every or time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        self.last_flush = time.monotonic()
        if not self.buffer:
            return
        table = pa.Table.from_pylist(self.buffer, schema=SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        self.seq += 1
        atomic_write_bytes(self.folder / f"part-{self.tag}-{self.seq:06d}.parquet", sink.getvalue().to_pybytes())
        self.buffer = []

    def error(self, source: str, sid: str, reason: str, detail: str = "") -> None:
        line = json.dumps({"source": source, "id": sid, "reason": reason, "detail": detail[:2000]}, ensure_ascii=False)
        with open(self.error_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_manifest(self, manifest: dict, name: str | None = None) -> None:
        atomic_write_text(self.folder / (name or "manifest.json"), json.dumps(manifest, indent=2, default=str))
