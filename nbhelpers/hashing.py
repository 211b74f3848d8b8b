"""SHA-256 of a file and atomic writes: the helpers the weights, caches, records and test weights share."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from . import progress

CHUNK_BYTES = 8 << 20  # bytes per read (8 MiB)
BAR_FROM_BYTES = 64 << 20  # files from this size (64 MiB) show a progress bar in bytes


def sha256_file(path: str | os.PathLike, desc: str | None = None) -> str:
    """The SHA-256 of the file ``path`` as 64 lowercase hex digits (OSError when unreadable), read in chunks, with a
    progress bar labelled ``desc`` (default: the file name) for files of :data:`BAR_FROM_BYTES` or more."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    hidden = {} if size >= BAR_FROM_BYTES else {"disable": True}
    with open(path, "rb") as f, progress.bar(total=size, desc=f"sha256 {desc or path.name}", unit="B",
                                             unit_scale=True, unit_divisor=1024, **hidden) as pbar:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(block)
            pbar.update(len(block))
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path next to ``path`` (its folder made) to write in the block; renamed onto ``path`` when the
    block ends without an error, removed when it raises. ``suffix`` ends the temporary name (for writers that read
    the format from it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
