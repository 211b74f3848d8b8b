"""Live avatar sessions: speech pushed in chunks as it arrives, finished frames out in order at 25 fps.

Frames are made in groups of ``hop``; a group is final once the audio reaches 80 ms (plus ``lookahead_ms``) past its
last frame, with the whisper tokens of one-clip generation on the audio prefix so far, so frames do not depend on
the chunking. ``docs/live.md`` says which frames equal one-clip generation, the latency, silence and pacing. Frames
are rendered by :func:`nbhelpers.engine.render`; the settings are a :class:`~nbhelpers.config.LiveConfig`.
"""

from __future__ import annotations

from ..config import LiveConfig
from .session import LiveSession, play
from .stats import LiveStats
from .thread import ModelThread, model_thread

__all__ = ["LiveConfig", "LiveSession", "LiveStats", "ModelThread", "model_thread", "play"]
