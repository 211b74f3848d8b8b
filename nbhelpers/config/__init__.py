"""The settings: one frozen dataclass per concern, which widgets, the command line and the Python API all make and
read.

- :mod:`.inference`: :class:`InferenceConfig`, how one lip-sync job or avatar runs.
- :mod:`.live`: :class:`LiveConfig`, how a live session runs.
- :mod:`.batch`: :class:`BatchConfig`, how a batch runs.
- :mod:`.face`: the face choice (:func:`parse_face`).
- :mod:`.fields`: what each field's metadata holds (help, unit, choices, range, official source, flag) and the
  check every config runs at construction.
"""

from __future__ import annotations

from .batch import BatchConfig
from .face import FaceChoice, parse_face
from .inference import (
    LANDMARK_BACKENDS,
    LATENT_MODES,
    NONCOMMERCIAL_NOTE,
    PARSING_MODES,
    RESTORERS,
    InferenceConfig,
    warn_licence,
)
from .live import LiveConfig

__all__ = ["LANDMARK_BACKENDS", "LATENT_MODES", "NONCOMMERCIAL_NOTE", "PARSING_MODES", "RESTORERS", "BatchConfig",
           "FaceChoice", "InferenceConfig", "LiveConfig", "parse_face", "warn_licence"]
