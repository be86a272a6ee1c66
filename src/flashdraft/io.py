"""Atomic file writes (a reader, or a resumed run, never sees a half-written file) and the one output-path
policy of every verb: an output that is a file where a folder is meant, or that is one of the verb's
inputs, is refused; a folder a verb publishes whole (export, import) is refused when it holds files the
verb did not write, unless ``--overwrite``; and files the verb did not write are never deleted."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from flashdraft.errors import FlashdraftError

WRITTEN = ".flashdraft-files.json"  # in a published folder: the names its writer put there (the rest are kept)


class OutputPathError(FlashdraftError, ValueError):
    """An output path a verb must not write: a file where a folder is meant, one of its inputs, or a folder of
    someone else's files."""


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


def atomic_replace_dir(tmp_dir: Path, final_dir: Path, keep_foreign: bool = False) -> None:
    """Move a fully written ``tmp_dir`` into place as ``final_dir`` (replacing an old one).

    ``tempfile.mkdtemp`` (and some writers) create owner-only entries; outputs are meant to be shared,
    so the tree is made readable (dirs 0755, files 0644) before it appears under its final name.
    ``keep_foreign``: the entries of an old ``final_dir`` that its writer did not put there (not in its
    :data:`WRITTEN` list) and ``tmp_dir`` does not replace are carried into the new folder (hard links where
    the file system allows, else copies), and ``tmp_dir``'s own names are listed in a new :data:`WRITTEN`.
    """
    final_dir = Path(final_dir)
    for root, dirs, files in os.walk(tmp_dir):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    if keep_foreign:
        ours = sorted(e.name for e in Path(tmp_dir).iterdir())
        for entry in _foreign_entries(final_dir):
            if entry.name not in ours:
                _carry(entry, Path(tmp_dir) / entry.name)
        (Path(tmp_dir) / WRITTEN).write_text(json.dumps(ours) + "\n")
        os.chmod(Path(tmp_dir) / WRITTEN, 0o644)
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final_dir, old)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp_dir, final_dir)


def _written_names(folder: Path) -> set[str]:
    try:
        return set(json.loads((folder / WRITTEN).read_text()))
    except (OSError, ValueError, TypeError):
        return set()


def _foreign_entries(folder: Path) -> list[Path]:
    """The entries of ``folder`` that the flashdraft writer of it did not put there ([] for no folder)."""
    if not folder.is_dir():
        return []
    ours = _written_names(folder) | {WRITTEN}
    return sorted(e for e in folder.iterdir() if e.name not in ours)


def _carry(src: Path, dst: Path) -> None:
    """``src`` (file, folder or link) at ``dst`` too: hard links where possible (no bytes copied), else a copy."""
    def link_or_copy(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True, copy_function=link_or_copy)
    else:
        link_or_copy(src, dst)


def same_or_inside(path: Path, other: Path) -> bool:
    """Whether ``path`` is ``other`` or lies inside it (both resolved)."""
    path, other = Path(path).resolve(), Path(other).resolve()
    return path == other or other in path.parents


def check_not_input(out: str | Path, inputs: Iterable[str | Path], flag: str = "--out") -> None:
    """Refuse an output that is one of the verb's inputs (or lies inside an input folder, or holds an input)."""
    for inp in inputs:
        if inp is not None and (same_or_inside(out, inp) or same_or_inside(inp, out)):
            raise OutputPathError(f"{flag} {out} would overwrite the input {inp}; write to a new path")


def check_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """Refuse an output folder path that is, or runs through, a file (nothing is created)."""
    p = Path(path)
    for q in (p, *p.parents):
        if q.exists() and not q.is_dir():
            where = "" if q == p else f" ({q} is a file)"
            raise OutputPathError(f"{flag} {p} is not a folder{where}; pass a folder path (a new one, or one this "
                                  "command wrote before)")
    return p


def make_output_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create the output folder ``path`` (and its parents) after :func:`check_output_dir`."""
    p = check_output_dir(path, flag)
    p.mkdir(parents=True, exist_ok=True)
    return p


def check_output_file(path: str | Path, flag: str = "--out") -> Path:
    """An output file path: refuse an existing folder there, or a parent that is a file."""
    p = Path(path)
    if p.is_dir():
        raise OutputPathError(f"{flag} {p} is a folder; pass a file path")
    check_output_dir(p.parent, flag=f"{flag} {p}: its folder")
    return p


def check_publish_dir(out: str | Path, is_own: Callable[[Path], bool], what: str, overwrite: bool = False,
                      inputs: Iterable[str | Path] = (), flag: str = "--out") -> Path:
    """The policy for a folder a verb writes whole (``what``: e.g. "an exported drafter"): not a file, not an
    input; an existing non-empty folder only if ``is_own(folder)`` (this verb wrote it) or ``overwrite``.
    Publish with ``atomic_replace_dir(tmp, out, keep_foreign=True)``, which never deletes another's files."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"{flag} {out} is an existing file; pass a folder path for {what}")
    check_not_input(out, inputs, flag)
    if out.is_dir() and not overwrite and not is_own(out):
        foreign = [e.name for e in _foreign_entries(out)]
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise OutputPathError(f"{flag} {out} holds files that are not {what} ({shown}); pass a new or empty "
                                  "folder, or --overwrite to write into it (files of other names are kept)")
    return out
