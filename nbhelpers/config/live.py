"""The settings of a live session (:class:`nbhelpers.live.LiveSession`)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ..constants import ENCODERS, FPS
from .fields import check, documented, setting

__all__ = ["CONTEXTS", "DEFAULT_DELAY_S", "DEFAULT_GUARD_S", "DEFAULT_HOP", "DEFAULT_SILENCE_DB", "SILENCE_MODES",
           "LiveConfig"]

DEFAULT_HOP = 2  # frames per whisper pass
DEFAULT_DELAY_S = 0.24  # play-out delay of the real-time mode: >= chunk interval - 80 ms + compute, for 200 ms chunks
DEFAULT_GUARD_S = 0.06  # how long before a frame's time the session gives up waiting for its audio
DEFAULT_SILENCE_DB = -60.0  # dBFS RMS over a frame's 200 ms token window
SILENCE_MODES = ("closed", "source", None)
CONTEXTS = ("sliding", "segment")


@documented
@dataclass(frozen=True)
class LiveConfig:
    """How a live session runs; each setting is checked when the config is made."""

    realtime: bool = setting(False, help=(
        "pace the output to the clock: frame n is handed out delay_s + n / 25 s after the first push, and silence "
        "fills in when the audio is late; off: frames as soon as they are final, no silence added"))
    delay_s: float = setting(DEFAULT_DELAY_S, unit="seconds", ge=0.0, help=(
        "play-out delay of the real-time mode: at least the interval between chunks minus 80 ms, plus the compute "
        "time of a group"))
    guard_s: float = setting(DEFAULT_GUARD_S, unit="seconds", ge=0.0, help=(
        "real-time mode: silence is added for a frame whose audio has not arrived this long before its time"))
    hop: int = setting(DEFAULT_HOP, unit="frames", ge=1, help=(
        "frames per whisper pass: latency grows by 40 ms per frame, the cost falls as 1 / hop"))
    lookahead_ms: float = setting(0.0, unit="milliseconds", ge=0.0, help=(
        "audio past each window's end that a group waits for (the window already reads 80 ms past the frame)"))
    context: str = setting("sliding", choices=CONTEXTS, help=(
        "sliding (bounded latency) or segment (a group waits for its whole 30 s segment: every frame equals "
        "one-clip generation, latency up to 30 s)"))
    silence: str | None = setting("closed", choices=SILENCE_MODES, none="every frame rendered from its audio",
                                  help="what a silent frame shows: closed (generated from the tokens of digital "
                                       "silence), source (the source frame as recorded) or none")
    silence_db: float = setting(DEFAULT_SILENCE_DB, unit="dBFS", le=0.0, help=(
        "speech threshold: RMS over a frame's 200 ms token window"))
    to: str | os.PathLike | None = setting(None, none="no file or stream", help=(
        "also write the frames with their audio to this file (.mp4, .mov, .mkv, .ts, .flv) or URL (rtmp://, srt://, "
        "udp://, rtp://, tcp://)"))
    encoder: str | None = setting(None, choices=ENCODERS, none="libx264 ultrafast, zerolatency", help=(
        "video encoder of `to` (nvenc with low-latency tuning when it works)"))
    iterate: bool | None = setting(None, none="when there is neither on_frame nor to", cli=False, help=(
        "keep frames for iterating over the session"))
    max_queue: int = setting(2 * FPS, unit="frames", ge=0, help=(
        "frames waiting for the reader in threaded mode; the session waits for the reader beyond that"))
    threaded: bool = setting(True, help=(
        "do the work on a background thread; off: inside push, poll and close, in the caller's thread (deterministic)"))
    batch_size: int | None = setting(None, unit="frames", ge=1, none="the avatar's, else 8",
                                     help="frames per engine batch")
    ahead_s: float = setting(1.0, unit="seconds", ge=0.0, help=(
        "real-time mode: frames are not rendered more than this far ahead of their time (bounds memory)"))
    warm_up: bool = setting(True, help=(
        "at construction, run one whisper pass and one render of each batch size the schedule uses, so that "
        "one-time costs are not paid inside the first frame's latency"))

    def __post_init__(self) -> None:
        check(self)
        if self.to is not None:
            object.__setattr__(self, "to", os.fspath(self.to))

    def replace(self, **changes: Any) -> LiveConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
