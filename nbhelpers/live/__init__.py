"""Live avatar sessions: speech pushed in chunks as it arrives, finished frames out in order at 25 fps.

Frames are made in groups of ``hop``; a group is final once the audio reaches 80 ms (plus ``lookahead_ms``) past
its last frame, and its whisper tokens are those of one-clip generation on the audio prefix received so far, so
frames do not depend on how the audio was chunked. ``docs/live.md`` says which frames equal one-clip generation,
the latency, and how silence and real-time pacing work.

- :class:`LiveConfig` (from :mod:`nbhelpers.config`): the session's settings.
- :mod:`nbhelpers.live.session`: :class:`LiveSession` (the audio timeline, the schedule, idle frames, pacing and
  the sinks: Python, a file or any ffmpeg URL through :class:`nbhelpers.media.stream.FFmpegSink`) and :func:`play`.
- :mod:`nbhelpers.live.tokens`: the whisper tokens of each group from its audio prefix.
- :mod:`nbhelpers.live.thread`: the avatar's :class:`ModelThread`. :mod:`nbhelpers.live.stats`: :class:`LiveStats`.

Frames are rendered by :func:`nbhelpers.engine.render`; nothing here is a second generation loop.
"""

from __future__ import annotations

from ..config import LiveConfig
from .session import LiveSession, play
from .stats import LiveStats
from .thread import ModelThread, model_thread

__all__ = ["LiveConfig", "LiveSession", "LiveStats", "ModelThread", "model_thread", "play"]
