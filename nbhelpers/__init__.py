"""nbhelpers: the engine of the MuseTalk Workbook.

MuseTalk v1.5 lip-sync (a face video or photo + speech -> the same video at 25 fps, the lower face repainted to
follow the speech) from the official weight files. ``import nbhelpers`` loads no torch, diffusers, onnxruntime or
network client, sets no seed and touches no network; the main entry points are re-exported lazily:

>>> import nbhelpers as nbh
>>> pipe = nbh.MuseTalkPipeline.from_pretrained()  # doctest: +SKIP  (models load on first use)
>>> pipe.lipsync("face.mp4", "speech.wav")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> module that defines it, imported on first attribute access (PEP 562).
_LAZY = {
    "MuseTalkPipeline": "nbhelpers.pipeline", "lipsync": "nbhelpers.pipeline", "preview": "nbhelpers.pipeline",
    "ClipResult": "nbhelpers.result", "InferenceConfig": "nbhelpers.config",
    "prepare_avatar": "nbhelpers.avatar", "Avatar": "nbhelpers.avatar", "NbHelpersError": "nbhelpers.errors",
    "setup": "nbhelpers.env",
}

__all__ = sorted(_LAZY) + ["__version__"]


# Submodules reachable as attributes (``nbh.weights.download(...)``), imported on first access like the names above.
_SUBMODULES = ("audio", "avatar", "batch", "blending", "engine", "env", "faces", "gpu", "latents", "live", "media",
               "models", "parsing", "pipeline", "quality", "reference", "restore", "result", "testing", "ui",
               "weights", "workbook")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"nbhelpers.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nbhelpers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
