"""Atomic file writes: a reader (or a resumed run) never sees a half-written file."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temp file next to ``path`` for a writer to fill (any format: JSON Lines, Parquet, safetensors);
    when the block ends it is fsynced, made readable (0644) and renamed onto ``path``; on an error it is removed.

    The temp name is ``.<name>.<random>.tmp``, so a half-written file never matches ``path``'s pattern."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes owner-only files; outputs are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same folder, fsync, then rename."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_replace_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully written ``tmp_dir`` into place as ``final_dir`` (replacing an old one).

    ``tempfile.mkdtemp`` (and some writers) create owner-only entries; outputs are meant to be shared,
    so the tree is made readable (dirs 0755, files 0644) before it appears under its final name.
    """
    final_dir = Path(final_dir)
    for root, dirs, files in os.walk(tmp_dir):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final_dir, old)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp_dir, final_dir)
