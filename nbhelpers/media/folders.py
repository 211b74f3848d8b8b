"""Can a job write its output? Every job that writes a file calls :func:`check_writable` on the output's folder
before any frame is decoded or any model loads."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from ..errors import InputError


def write_problem(folder: str | os.PathLike) -> str:
    """Why this process cannot make files in ``folder`` (creating it and its missing parents), or ``""``.

    Reads the permission bits, then makes the missing folders and a file in ``folder`` (what the bits do not say:
    root on a read-only mount, a full or read-only file system) and removes what it made again."""
    folder = Path(folder).expanduser().absolute()
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    where = "" if existing == folder else f"{existing}/ is "
    if not existing.is_dir():
        return f"{existing} is a file, not a folder" if where else "a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{where}read-only or not yours"
    made = missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".nbhelpers-write-check-"):
            pass
    except OSError as exc:  # ENOENT for a folder that is there: a file system that takes no new files (/proc)
        return f"{where}not writable" if exc.errno == errno.ENOENT else exc.strerror or type(exc).__name__
    finally:
        remove_empty(made)  # a folder where another job put something meanwhile stays
    return ""


def check_writable(folder: str | os.PathLike, what: str = "the output") -> Path:
    """Check that a job can write ``what`` into ``folder`` (made when missing); returns the folder.

    Raises InputError: ``cannot write in <folder>/ (<why>)``: the folder or a parent is a file, read-only, not this
    user's, or cannot be made."""
    path = Path(folder).expanduser()
    if why := write_problem(path):
        raise InputError(f"cannot write in {str(path).rstrip(os.sep)}/ ({why}). Give {what} a folder you can write in.")
    return path


def missing_folders(folder: str | os.PathLike) -> list[Path]:
    """``folder`` and its parents that do not exist yet, innermost first (what :func:`remove_empty` takes)."""
    folder = Path(folder).expanduser().absolute()
    return [p for p in (folder, *folder.parents) if not p.exists()]


def remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (:func:`missing_folders`) that is empty; one holding anything stays."""
    for part in folders:
        with contextlib.suppress(OSError):
            part.rmdir()

