"""SHA-256 of a file: the one helper the weights, the avatar cache and the batch records share."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from . import progress

CHUNK_BYTES = 1 << 20  # bytes per read of a small file (1 MiB)
LARGE_CHUNK_BYTES = 8 << 20  # bytes per read of a large file (8 MiB)
BAR_FROM_BYTES = 64 << 20  # files from this size (64 MiB) show a progress bar in bytes


def sha256_file(path: str | os.PathLike, desc: str | None = None) -> str:
    """The SHA-256 of the file ``path`` as 64 lowercase hex digits, read in chunks, with a progress bar labelled
    ``desc`` (default: the file name) for files of :data:`BAR_FROM_BYTES` or more.

    Raises:
        OSError: The file cannot be read.
    """
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size < BAR_FROM_BYTES:
            for block in iter(lambda: f.read(CHUNK_BYTES), b""):
                digest.update(block)
        else:
            with progress.bar(total=size, desc=f"sha256 {desc or path.name}", unit="B", unit_scale=True,
                              unit_divisor=1024) as pbar:
                for block in iter(lambda: f.read(LARGE_CHUNK_BYTES), b""):
                    digest.update(block)
                    pbar.update(len(block))
    return digest.hexdigest()
