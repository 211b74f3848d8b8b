"""The settings: one frozen dataclass per concern (:class:`InferenceConfig`, :class:`LiveConfig`,
:class:`BatchConfig`), which widgets, the command line and the Python API all make and read; the face choice
(:func:`parse_face`); and in :mod:`.fields` each field's facts and the check every config runs at construction.
"""

from __future__ import annotations

from .batch import BatchConfig
from .face import FaceChoice, parse_box, parse_face
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
           "FaceChoice", "InferenceConfig", "LiveConfig", "parse_box", "parse_face", "warn_licence"]
