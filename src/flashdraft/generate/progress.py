"""Progress bar (prompts/s, tokens/s, ETA) and the end-of-run summary with a cost estimate."""

from __future__ import annotations

import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn, \
    TimeRemainingColumn


class Progress:
    """A rich progress bar over prompts; the description shows prompts/s and generated tokens/s."""

    def __init__(self, total: int, enabled: bool = True):
        self.t0 = time.monotonic()
        self.bar = None
        if enabled:
            self.bar = RichProgress(
                TextColumn("generate"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            )
            self.task = self.bar.add_task("generate", total=total, rate="")
            self.bar.start()

    def update(self, prompts: int, tokens_total: int) -> None:
        if self.bar is None:
            return
        self.bar.advance(self.task, prompts)
        dt = max(time.monotonic() - self.t0, 1e-9)
        done = self.bar.tasks[0].completed
        self.bar.update(self.task, rate=f"{done / dt:.2f} prompts/s {tokens_total / dt:.1f} tok/s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def summary_lines(m: dict, estimate_prompts: int) -> list[str]:
    """Human summary of a manifest: done, skipped, failed, tokens, throughput, cost of N more prompts."""
    c = m["counts"]
    bad = {k[4:]: v for k, v in c.items() if k.startswith("bad_") and v}
    pps = m["throughput"]["prompts_per_s"]
    lines = [
        f"done {c.get('done', 0)}, skipped {c.get('skipped_done', 0)} already written, "
        f"{c.get('duplicates', 0)} duplicates, failed {c.get('failed', 0)}, bad input {sum(bad.values())}"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(bad.items()))})" if bad else ""),
        f"tokens: {m['tokens'].get('prompt', 0)} prompt, {m['tokens'].get('response', 0)} generated in "
        f"{m['elapsed_s']:.1f} s = {pps:.2f} prompts/s, {m['throughput']['response_tokens_per_s']:.1f} tokens/s",
    ]
    if pps > 0:
        lines.append(f"{estimate_prompts} more prompts take {estimate_prompts / pps / 3600:.2f} hours on this setup")
    return lines
