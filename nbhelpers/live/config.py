"""The settings of a live session: one frozen dataclass, each field with its default, unit and help."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..constants import ENCODERS, FPS
from ..errors import InputError

DEFAULT_HOP = 2  # frames per whisper pass
DEFAULT_DELAY_S = 0.24  # play-out delay of the real-time mode: >= chunk interval - 80 ms + compute, for 200 ms chunks
DEFAULT_GUARD_S = 0.06  # how long before a frame's time the session gives up waiting for its audio
DEFAULT_SILENCE_DB = -60.0  # dBFS RMS over a frame's 200 ms token window
SILENCE_MODES = ("closed", "source", None)
CONTEXTS = ("sliding", "segment")


@dataclass(frozen=True)
class LiveConfig:
    """How a live session runs (:class:`nbhelpers.live.LiveSession`). Validated at construction.

    Each field's ``metadata["help"]`` says what it does, for a command line built from the fields.

    Raises:
        InputError: A field out of range (the message names it and shows the value).
    """

    realtime: bool = field(default=False, metadata={"help": (
        "pace the output to the clock: frame n is handed out delay_s + n / 25 s after the first push, and silence "
        "fills in when the audio is late; off: frames as soon as they are final, no silence added")})
    delay_s: float = field(default=DEFAULT_DELAY_S, metadata={"help": (
        "play-out delay of the real-time mode, seconds: at least the interval between chunks minus 80 ms, plus "
        "the compute time of a group")})
    guard_s: float = field(default=DEFAULT_GUARD_S, metadata={"help": (
        "real-time mode: silence is added for a frame whose audio has not arrived this many seconds before its "
        "time")})
    hop: int = field(default=DEFAULT_HOP, metadata={"help": (
        "frames per whisper pass, >= 1: latency grows by 40 ms per frame, the cost falls as 1 / hop")})
    lookahead_ms: float = field(default=0.0, metadata={"help": (
        "audio past each window's end that a group waits for, milliseconds (the window already reads 80 ms past "
        "the frame)")})
    context: str = field(default="sliding", metadata={"help": (
        "'sliding' (bounded latency) or 'segment' (a group waits for its whole 30 s segment: every frame equals "
        "one-clip generation, latency up to 30 s)"), "choices": CONTEXTS})
    silence: str | None = field(default="closed", metadata={"help": (
        "what a silent frame shows: 'closed' (generated from the tokens of digital silence), 'source' (the source "
        "frame as recorded) or None (every frame rendered from its audio)"), "choices": SILENCE_MODES})
    silence_db: float = field(default=DEFAULT_SILENCE_DB, metadata={"help": (
        "speech threshold, dBFS RMS over a frame's 200 ms token window")})
    to: str | None = field(default=None, metadata={"help": (
        "also write the frames with their audio to this file (.mp4, .mov, .mkv, .ts, .flv) or URL (rtmp://, "
        "srt://, udp://, rtp://, tcp://)")})
    encoder: str | None = field(default=None, metadata={"help": (
        "video encoder of `to`: None (libx264 ultrafast, zerolatency) or an encoder setting (nvenc with "
        "low-latency tuning when it works)"), "choices": (None, *ENCODERS)})
    iterate: bool | None = field(default=None, metadata={"help": (
        "keep frames for iterating over the session (default: when there is neither on_frame nor `to`)")})
    max_queue: int = field(default=2 * FPS, metadata={"help": (
        "frames waiting for the reader in threaded mode; the session waits for the reader beyond that")})
    threaded: bool = field(default=True, metadata={"help": (
        "do the work on a background thread; off: inside push, poll and close, in the caller's thread "
        "(deterministic)")})
    batch_size: int | None = field(default=None, metadata={"help": (
        "frames per engine batch (default the avatar's)")})
    ahead_s: float = field(default=1.0, metadata={"help": (
        "real-time mode: frames are not rendered more than this many seconds ahead of their time (bounds memory)")})
    warm_up: bool = field(default=True, metadata={"help": (
        "at construction, run one whisper pass and one render of each batch size the schedule uses, so that "
        "one-time costs are not paid inside the first frame's latency")})

    def __post_init__(self) -> None:
        if isinstance(self.hop, bool) or not isinstance(self.hop, int) or self.hop < 1:
            raise InputError(f"hop must be a whole number of frames >= 1; got {self.hop!r}.")
        if self.context not in CONTEXTS:
            raise InputError(f"context must be one of {CONTEXTS}; got {self.context!r}.")
        if self.silence not in SILENCE_MODES:
            raise InputError(f"silence must be 'closed', 'source' or None; got {self.silence!r}.")
        if self.encoder is not None and self.encoder not in ENCODERS:
            raise InputError(f"encoder must be None or one of {', '.join(map(repr, ENCODERS))}; got {self.encoder!r}.")
        for name in ("delay_s", "guard_s", "lookahead_ms", "ahead_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0 or math.isinf(v):
                raise InputError(f"{name} must be a finite number >= 0; got {v!r}.")
        for name, low in (("max_queue", 0), ("batch_size", 1)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise InputError(f"{name} must be a whole number >= {low}; got {v!r}.")
        if self.to is not None:
            object.__setattr__(self, "to", os.fspath(self.to))

    def replace(self, **changes: Any) -> LiveConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


__all__ = ["CONTEXTS", "DEFAULT_DELAY_S", "DEFAULT_GUARD_S", "DEFAULT_HOP", "DEFAULT_SILENCE_DB", "SILENCE_MODES",
           "LiveConfig"]
