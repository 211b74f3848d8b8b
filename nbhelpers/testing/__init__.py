"""Tiny random weights in the official layout, for tests, CI notebooks and trying the code without a download.

:func:`make_tiny_weights` writes a complete weights tree with the real file names and formats, holding small models
of the real block types built from the core's architectures (:mod:`.tiny_models`, :mod:`.tiny_faces`); a
``tiny.json`` marker (:data:`nbhelpers.weights.TINY_MARKER`) tells it from real weights. Tests add writers to
:data:`WRITERS`. The core never imports this package; importing it loads no torch.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..constants import VERSIONS
from ..errors import InputError
from ..weights import TINY_MARKER
from .tiny_faces import (
    face_template_input_px,
    random_dwpose_state_dict,
    simcc_peak_model,
    template_dwpose_state_dict,
    write_random_dwpose_checkpoint,
    write_tiny_dwpose,
    write_tiny_dwpose_onnx,
    write_tiny_s3fd,
)
from .tiny_models import (
    TINY_UNET_CHANGES,
    _atomic_json,
    tiny_unet_config,
    tiny_whisper_config,
    write_random_bisenet,
    write_tiny_bisenet,
    write_tiny_unet,
    write_tiny_vae,
    write_tiny_whisper,
)

__all__ = ["TINY_MARKER", "TINY_UNET_CHANGES", "WRITER_NEEDS", "face_template_input_px", "make_tiny_weights",
           "random_dwpose_state_dict", "simcc_peak_model", "WRITERS", "template_dwpose_state_dict", "tiny_unet_config",
           "tiny_whisper_config", "write_random_bisenet", "write_random_dwpose_checkpoint", "write_tiny_bisenet",
           "write_tiny_dwpose", "write_tiny_dwpose_onnx", "write_tiny_s3fd", "write_tiny_unet", "write_tiny_vae",
           "write_tiny_whisper"]

# The optional packages a writer needs; make_tiny_weights leaves it out when one is missing, unless it is named.
WRITER_NEEDS: dict[str, tuple[str, ...]] = {"dwpose-onnx": ("onnx",)}
FILE_MODE = 0o644  # every file of the tree (before the umask): the same as open() gives, whichever writer wrote it

# name -> fn(directory[, versions]) writing one model's tiny files; make_tiny_weights runs them in this order, each
# with torch's RNG seeded from its name. Add or replace an entry to extend the tree.
WRITERS: dict[str, Callable[..., Any]] = {
    "unet": write_tiny_unet, "vae": write_tiny_vae, "whisper": write_tiny_whisper, "parsing": write_tiny_bisenet,
    "s3fd": write_tiny_s3fd, "dwpose-onnx": write_tiny_dwpose_onnx, "dwpose": write_tiny_dwpose,
}


def make_tiny_weights(directory: str | os.PathLike, versions: Sequence[str] = ("v15",), *,
                      writers: Sequence[str] | None = None) -> Path:
    """Write a complete tiny-model weights tree in the official layout (random, deterministic weights).

    Every writer of :data:`WRITERS` runs, then ``tiny.json`` is written; files are written through temporary names with
    mode 0644 less the umask. By default a writer whose optional package is missing (:data:`WRITER_NEEDS`) is left out
    silently and listed under ``left_out`` in ``tiny.json``; ``writers`` names the ones to run. ``versions`` are the
    MuseTalk versions whose UNet to write. Returns ``directory``. InputError for an unknown version or writer name;
    MissingDependencyError or ImportError when torch, diffusers or transformers is missing."""
    versions = tuple(versions)
    bad = [v for v in versions if v not in VERSIONS]
    if bad or not versions:
        raise InputError(f"versions must be a non-empty subset of {VERSIONS}; got {versions!r}.")
    import torch

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    available = dict(WRITERS)
    unknown = sorted(set(writers or ()) - set(available))
    if unknown:
        raise InputError(f"unknown tiny writer(s) {unknown}; registered: {', '.join(sorted(available))}.")
    lacking = {name: [pkg for pkg in WRITER_NEEDS.get(name, ()) if not _importable(pkg)] for name in available}
    left_out = {name: f"needs {', '.join(pkgs)} (pip install {' '.join(pkgs)})"
                for name, pkgs in lacking.items() if pkgs and writers is None}
    writers = {name: fn for name, fn in available.items()
               if name not in left_out and (writers is None or name in writers)}  # left_out: the default run only
    timings = {}
    for name, fn in writers.items():
        start = time.monotonic()
        try:
            options = {"versions": versions} if "versions" in inspect.signature(fn).parameters else {}
        except (TypeError, ValueError):  # no signature to read (a builtin)
            options = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(zlib.crc32(name.encode()) % (2**31))
            fn(root, **options)
        timings[name] = round(time.monotonic() - start, 3)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and p.name != TINY_MARKER and not p.name.startswith("."))
    marker = {"kind": "nbhelpers tiny random weights (not for real use)", "versions": list(versions),
              "writers": sorted(writers), "left_out": left_out, "files": files, "seconds": timings}
    _atomic_json(marker, root / TINY_MARKER)
    _same_modes(root)
    return root


def _importable(module: str) -> bool:
    """True when ``module`` can be imported (found and not blocked), without importing it."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _same_modes(root: Path) -> None:
    """Give every file of the tree :data:`FILE_MODE` less the umask (safetensors writes its files 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, FILE_MODE & ~umask)
