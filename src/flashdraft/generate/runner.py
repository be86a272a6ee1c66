"""The regeneration loop: select prompts, regenerate them turn by turn, write records, report.

Selection is a pure function of the sources and the config: deduplicate identical prompts (content
hash of the non-assistant turns), keep this machine's shard (hash modulo ``num_shards``), this
worker's slice (index modulo workers) and drop ids already written (``--resume``). Prompts are handed
to the backend in chunks; within a chunk every conversation advances one turn per backend call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from flashdraft.generate.backends import Backend, Request, make_backend
from flashdraft.generate.config import GenerateConfig
from flashdraft.generate.convo import Conversation, Renderer
from flashdraft.generate.output import OutputError, OutputWriter, read_errors, written_ids
from flashdraft.generate.progress import Progress, summary_lines
from flashdraft.generate.sources import BadInput, Sample, SourceError, load_source, source_locations
from flashdraft.io import make_output_dir

BAD_INPUT = ("malformed", "empty_conversation", "prompt_too_long")


def select(cfg: GenerateConfig, worker: int = 0, num_workers: int = 1, done: set[str] = frozenset(),
           stats: Counter | None = None) -> Iterator[Sample | BadInput]:
    """This worker's samples (and bad rows) in source order, deduplicated and sharded."""
    stats = stats if stats is not None else Counter()
    seen: set[str] = set()
    index = 0
    for spec in cfg.sources:
        for item in load_source(spec, cfg.limit, cfg.include_heldout):
            if isinstance(item, BadInput):
                if int.from_bytes(item.id.encode()[-4:], "big") % (cfg.num_shards * num_workers) == \
                        cfg.shard_index * num_workers + worker:  # each bad row is reported by one worker only
                    yield item
                continue
            key = item.prompt_key
            if key in seen or item.id in seen:
                stats["duplicates"] += 1
                continue
            seen.update((key, item.id))
            if int(key, 16) % cfg.num_shards != cfg.shard_index:
                continue
            index += 1
            if (index - 1) % num_workers != worker:
                continue
            if item.id in done:
                stats["skipped_done"] += 1
                continue
            yield item


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    buf: list = []
    for it in items:
        buf.append(it)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def eos_token_ids(path: str, tokenizer) -> list[int]:
    from transformers import GenerationConfig

    ids: set[int] = set()
    try:
        val = GenerationConfig.from_pretrained(path).eos_token_id
        ids.update(val if isinstance(val, list) else [val] if val is not None else [])
    except OSError:
        pass
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def context_window(cfg: GenerateConfig, path: str, backend: Backend) -> int:
    if getattr(backend, "max_model_len", None):
        return int(backend.max_model_len)
    if cfg.max_model_len:
        return cfg.max_model_len
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(path)
    return int(getattr(c, "max_position_embeddings", None) or getattr(c.get_text_config(), "max_position_embeddings"))


def regenerate_chunk(convs: list[Conversation], renderer: Renderer, backend: Backend, cfg: GenerateConfig,
                     ctx: int, stats: Counter) -> None:
    """Advance every conversation of the chunk turn by turn until all are finished or failed."""
    while active := [c for c in convs if c.pending]:
        reqs, live = [], []
        for c in active:
            before = (c.ids, c.mask, c.prev_text)
            ids = renderer.next_prompt(c)
            if len(ids) >= ctx - 1:
                if c.turn == 0:
                    c.error = f"prompt_too_long: {len(ids)} tokens, context window {ctx}"
                else:  # keep the turns that fit; later turns would not
                    c.segments = c.segments[: c.turn]
                    c.ids, c.mask, c.prev_text = before
                    stats["truncated_turns"] += 1
                continue
            reqs.append(Request(ids, min(cfg.max_tokens, ctx - len(ids)), f"{c.sample.id}#{c.turn}"))
            live.append(c)
        if not reqs:
            continue
        for c, out in zip(live, backend.generate(reqs)):
            if out.error:
                c.error = f"generation_failed: {out.error}"
            else:
                renderer.add_answer(c, out.token_ids, out.finish_reason)


GENERATION_FIELDS = ("target", "temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "seed",
                     "thinking", "chat_template", "max_turns")


def check_resume_config(cfg: GenerateConfig, out_dir: Path) -> dict[str, str]:
    """Refuse to resume a folder written with other generation settings (records would be mixed), or with a
    source name that stood for another file (its record ids would match rows they are not); return the source
    locations the folder took rows from before ({} for a new one)."""
    mf = out_dir / "manifest.json"
    if not (cfg.resume and mf.exists()):
        return {}
    manifest = json.loads(mf.read_text())
    old = manifest.get("config", {})
    new = cfg.model_dump(mode="json")
    diff = [f"{k}: {old[k]!r} -> {new[k]!r}" for k in GENERATION_FIELDS if k in old and old[k] != new[k]]
    if diff:
        raise OutputError(f"output {out_dir} was written with other generation settings ({'; '.join(diff)}); "
                          "resume with the same settings or choose another --output")
    was = manifest.get("source_locations", {})
    for name, loc in source_locations(cfg.sources).items():
        if name in was and was[name] != loc:
            raise OutputError(f"source name {name!r} stood for {was[name]} in output {out_dir}, now for {loc} (record "
                              f"ids are {name}:<row id>); give this source another name ({name}2={loc}) or choose "
                              "another --output")
    return was


class Runner:
    """One worker: selection, backend, writer and counters."""

    def __init__(self, cfg: GenerateConfig, worker: int = 0, num_workers: int = 1, backend: Backend | None = None):
        from flashdraft.models.target import resolve_target_path

        self.cfg, self.worker, self.num_workers = cfg, worker, num_workers
        self.path = resolve_target_path(cfg.target)
        self.tokenizer = load_tokenizer(self.path)
        self.eos = eos_token_ids(self.path, self.tokenizer)
        self.renderer = Renderer(self.tokenizer, cfg.chat_template == "auto", cfg.thinking, self.eos)
        self._backend = backend
        self.stats: Counter = Counter()
        self.source_locations: dict[str, str] = {}

    def run(self) -> dict:
        cfg, out_dir = self.cfg, Path(self.cfg.output)
        self.stats = Counter()
        done = set(written_ids(out_dir)) if out_dir.exists() else set()
        if done and not cfg.resume and self.worker == 0:
            raise OutputError(f"output {out_dir} already holds {len(done)} records; pass --resume to continue it "
                              "or choose another --output")
        was = check_resume_config(cfg, out_dir)
        self.source_locations = {**was, **source_locations(cfg.sources)}  # every source this folder took rows from
        known_bad = {e["id"] for e in read_errors(out_dir) if e.get("reason") in BAD_INPUT} if out_dir.exists() else set()
        for spec in cfg.sources:
            if next(iter(load_source(spec, 1, cfg.include_heldout)), None) is None:
                raise SourceError(f"prompt source {spec} holds no rows; pass a non-empty file (JSONL, JSON or Parquet "
                                  "rows with a prompt or messages) or drop it")
        count_stats: Counter = Counter()
        total = sum(1 for it in select(cfg, self.worker, self.num_workers, done, count_stats) if isinstance(it, Sample))
        self.stats["skipped_done"] = count_stats["skipped_done"]
        self.stats["duplicates"] = count_stats["duplicates"]
        writer = OutputWriter(out_dir, cfg.shard_index, self.worker, cfg.flush_every, cfg.flush_seconds)
        backend = self._backend or make_backend(cfg, self.path, self.tokenizer, self.eos)
        ctx = context_window(cfg, self.path, backend)
        t0 = time.monotonic()
        self._manifest(writer, 0.0, total, final=False)  # on disk before the first record: a kill leaves both
        progress = Progress(total, enabled=cfg.progress and self.worker == 0 and self.num_workers == 1)
        try:
            items = select(cfg, self.worker, self.num_workers, done, Counter())
            for chunk in _chunks(items, cfg.backend_chunk_size):
                convs = []
                for it in chunk:
                    if isinstance(it, BadInput):
                        self.stats[f"bad_{it.reason}"] += 1
                        if it.id not in known_bad:
                            writer.error(it.source, it.id, it.reason, it.detail)
                    else:
                        convs.append(self.renderer.start(it, cfg.max_turns))
                regenerate_chunk(convs, self.renderer, backend, cfg, ctx, self.stats)
                for c in convs:
                    if c.error:
                        reason = c.error.split(":", 1)[0]
                        self.stats["failed" if reason == "generation_failed" else f"bad_{reason}"] += 1
                        if c.sample.id not in known_bad:
                            writer.error(c.sample.source, c.sample.id, reason, c.error)
                        continue
                    rec = c.record()
                    n_resp = sum(rec["loss_mask"])
                    self.stats["done"] += 1
                    self.stats["response_tokens"] += n_resp
                    self.stats["prompt_tokens"] += len(rec["token_ids"]) - n_resp
                    self.stats["rerendered"] += int(c.rerendered)
                    writer.add(rec)
                writer.flush()  # a kill loses at most the chunk in flight
                progress.update(len(convs), self.stats["response_tokens"])
                self._manifest(writer, time.monotonic() - t0, total, final=False)
        finally:
            progress.close()
            backend.close() if self._backend is None else None
        return self._manifest(writer, time.monotonic() - t0, total, final=True)

    def _manifest(self, writer: OutputWriter, elapsed: float, total: int, final: bool) -> dict:
        s = self.stats
        m = {
            "config": self.cfg.model_dump(mode="json"),
            "source_locations": self.source_locations,
            "worker": self.worker, "num_workers": self.num_workers, "finished": final, "selected": total,
            "counts": {k: v for k, v in sorted(s.items()) if "tokens" not in k},
            "tokens": {"prompt": s["prompt_tokens"], "response": s["response_tokens"]},
            "elapsed_s": round(elapsed, 3),
            "throughput": {"prompts_per_s": round(s["done"] / elapsed, 4) if elapsed else 0.0,
                           "response_tokens_per_s": round(s["response_tokens"] / elapsed, 2) if elapsed else 0.0},
        }
        name = "manifest.json" if self.num_workers == 1 else f"manifest-s{self.cfg.shard_index:05d}-w{self.worker}.json"
        writer.write_manifest(m, name)
        return m


def merge_manifests(cfg: GenerateConfig, parts: list[dict], elapsed: float) -> dict:
    counts: Counter = Counter()
    tokens: Counter = Counter()
    for p in parts:
        counts.update(p["counts"])
        tokens.update(p["tokens"])
    return {
        "config": cfg.model_dump(mode="json"), "source_locations": parts[0].get("source_locations", {}) if parts else {},
        "num_workers": len(parts), "finished": all(p["finished"] for p in parts),
        "selected": sum(p["selected"] for p in parts), "counts": dict(counts), "tokens": dict(tokens),
        "elapsed_s": round(elapsed, 3),
        "throughput": {"prompts_per_s": round(counts["done"] / elapsed, 4) if elapsed else 0.0,
                       "response_tokens_per_s": round(tokens["response"] / elapsed, 2) if elapsed else 0.0},
    }


def run_parallel(cfg: GenerateConfig) -> dict:
    """One worker process per engine (``CUDA_VISIBLE_DEVICES`` = its GPUs), prompts sharded by index."""
    t0 = time.monotonic()
    if not cfg.resume and Path(cfg.output).exists() and (n_done := len(written_ids(Path(cfg.output)))):
        raise OutputError(f"output {cfg.output} already holds {n_done} records; pass --resume to continue it "
                          "or choose another --output")
    n, tp = cfg.data_parallel, cfg.tensor_parallel
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(n * tp)]
    make_output_dir(cfg.output, "--output")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=cfg.output, prefix=".config-", delete=False) as f:
        cfg_path = f.name
    cfg.model_copy(update={"resume": True}).save(cfg_path)  # checked above; workers must not race on it
    procs = []
    for w in range(n):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(gpus[w * tp:(w + 1) * tp]))
        procs.append(subprocess.Popen([sys.executable, "-m", "flashdraft.generate.runner", cfg_path, str(w), str(n)],
                                      env=env))
    manifests = [Path(cfg.output) / f"manifest-s{cfg.shard_index:05d}-w{w}.json" for w in range(n)]
    started = {m: m.stat().st_mtime for m in manifests if m.exists()}  # left by an earlier run
    progress, shown = None, 0
    while any(p.poll() is None for p in procs):
        time.sleep(2.0)
        cur = [json.loads(m.read_text()) for m in manifests if m.exists() and m.stat().st_mtime != started.get(m)]
        if cfg.progress and len(cur) == n:
            if progress is None:
                progress = Progress(sum(c["selected"] for c in cur))
            done = sum(c["counts"].get("done", 0) + c["counts"].get("failed", 0) for c in cur)
            progress.update(done - shown, sum(c["tokens"]["response"] for c in cur))
            shown = done
    if progress is not None:
        progress.close()
    codes = [p.wait() for p in procs]
    os.unlink(cfg_path)
    if any(codes):
        raise RuntimeError(f"generation workers exited with codes {codes}; see their output above, then rerun with --resume")
    parts = [json.loads(m.read_text()) for m in manifests]
    m = merge_manifests(cfg, parts, time.monotonic() - t0)
    OutputWriter(cfg.output, cfg.shard_index, 0).write_manifest(m)
    return m


def run(cfg: GenerateConfig, backend: Backend | None = None, console=None) -> dict:
    """Run the whole generation (in-process, or one worker per engine) and print the summary."""
    m = run_parallel(cfg) if cfg.data_parallel > 1 and backend is None else Runner(cfg, backend=backend).run()
    for line in summary_lines(m, cfg.estimate_prompts):
        (console.print if console else print)(line)
    return m


if __name__ == "__main__":  # worker entry point used by run_parallel
    _cfg = GenerateConfig.load(sys.argv[1])
    Runner(_cfg, int(sys.argv[2]), int(sys.argv[3])).run()
