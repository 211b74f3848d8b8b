"""Live avatar sessions: speech pushed in chunks as it arrives, finished frames out in order at 25 fps.

- :mod:`nbhelpers.live.config`: :class:`LiveConfig`, the session's settings.
- :mod:`nbhelpers.live.session`: :class:`LiveSession` (the audio timeline, the schedule, idle frames, pacing and
  the sinks: Python, a file or any ffmpeg URL through :class:`nbhelpers.media.stream.FFmpegSink`) and :func:`play`.
- :mod:`nbhelpers.live.tokens`: the whisper tokens of each group from its audio prefix.
- :mod:`nbhelpers.live.thread`: the avatar's :class:`ModelThread`. :mod:`nbhelpers.live.stats`: :class:`LiveStats`.

Frames are rendered by :func:`nbhelpers.engine.render`; nothing here is a second generation loop.

What each frame's tokens depend on (:mod:`nbhelpers.audio`). Frame ``k`` (audio
``[640k, 640k + 640)`` samples at 16 kHz) reads encoder frames ``2k-4 .. 2k+5``, i.e. audio up to sample
``640 (k + 3)``: 80 ms past its own end. But whisper-tiny's encoder runs on whole 30 s segments
(``[480000 s, 480000 (s + 1))``) with *global* self-attention in all 4 layers, and the log-mel is clamped at
``max - 8`` of the whole segment; so every token of frame ``k`` depends on all the audio of its 30 s segment
(and the segment before, when the window straddles a border). No finite look-ahead short of the segment's end
makes a frame exactly equal to one-clip generation; waiting for it would mean up to 30 s of latency.

The design, so that latency is bounded and frames never depend on how the audio was chunked:

- Frames are made in groups of ``hop`` (group ``g`` = frames ``g*hop .. g*hop + hop - 1``). A group is final as
  soon as the timeline holds ``E_g = 640 (g*hop + hop + 2) + lookahead`` samples: its windows are then inside the
  audio. Its tokens are computed by exactly the one-clip code path (same log-mel, same encoder, same trimming and
  zero padding) on the audio prefix ``[0, E_g)``, whatever more audio has arrived. A complete 30 s segment is
  encoded once and kept; only the open segment is re-encoded, once per group: the re-computation cost is one
  whisper-tiny forward (fixed 30 s input) per ``hop`` frames, whatever the session's length.
- Hence the exact law, tested: frame ``k`` of a live session equals frame ``k`` of ``avatar.generate`` on the
  audio prefix ``[0, min(E_g, L))``, where ``L`` is all the audio pushed before :meth:`LiveSession.close`. It
  does not depend on chunk sizes (1 ms or 2 s chunks give the same frames), so there is no seam at chunk borders.
  (Bit for bit under the batch condition below.)
- Latency: a frame is final ``80 ms + (hop - 1) x 40 ms + lookahead`` after its own audio ends, then takes one
  whisper pass (a 30 s log-mel, computed on the device when the whisper is on CUDA, and the encoder) and the
  render of its group. One-time costs (first forwards, kernel loading, pinned buffers) are paid by a warm-up when
  the session is made (``warm_up``), not by frame 0; ``stats`` splits frame 0's latency into its parts.
- One thread per avatar runs all the model work of its sessions (:class:`ModelThread`): the warm-up, every
  whisper pass and every render, in every session, threaded or not. PyTorch keeps some of its one-time set-up per
  thread: the cuDNN execution plans of the convolutions (UNet, VAE decoder, whisper's conv front-end) are cached in
  ``thread_local`` storage (``aten/src/ATen/native/cudnn/Conv_v8.cpp``), one plan per shape. A warm-up in the
  constructor's thread followed by the work in a new per-session thread rebuilt every plan inside frame 0.
- Batches: the session cuts its engine batches at multiples of the batch size, as one-clip generation does. In
  real time each group is rendered as soon as it is final; otherwise every group already final up to the end of
  the current aligned batch is rendered with it (audio pushed faster than real time gives whole batches), each
  group's tokens still from its own prefix.

Which frames equal one ``avatar.generate`` of the whole audio (``L`` samples, ``T = L // 640`` frames) and why:

- Equal: every frame whose group prefix reaches the end of its 30 s segment's audio, i.e. ``E_g >= min(L,
  480000 (s + 1))``: the groups whose last frame is at most ``2 + lookahead / 40 ms`` frames before the clip's
  end (always the last group, made at :meth:`LiveSession.close` with the whole audio; 1 to ``hop + 2`` frames)
  and likewise the groups ending at most that far before each 30 s border. "Equal" is bit for bit when the
  frame's engine batch holds the frames one-clip generation's does (batches are aligned alike, see above): always
  when ``hop`` is a multiple of the engine batch size, and for the batches whose groups were final at once;
  a batch cut short (by the group rule or the clip's end) runs the UNet and VAE on another batch shape, which
  changes results by float rounding only (seen on the CPU: 1 level in 1 of 27 648 values). For
  clips longer than 30 s, whole-clip generation encodes up to 8 segments per forward and live encodes one:
  float rounding again (about 1e-6 relative in fp32).
- Can differ: every other frame, because audio that arrived after its group was made (later in the same 30 s
  segment) changes its tokens through the encoder's attention and the segment's log-mel clamp. For such a frame
  the encoder saw the segment's future as silence; the effect is small for audio far from the frame, but it is
  not zero, and no bounded-latency design can make it zero.
- Always differ by design: idle frames (see below), and frames near silence the session added because the feed
  ran dry in real-time mode (``starved_frames`` in the report).
- ``context="segment"`` trades latency for exact equality: a group waits for its whole 30 s segment (or
  :meth:`LiveSession.close`), so every frame equals one-clip generation; the latency is then up to 30 s.

Silence. A frame whose 200 ms token window (``[640k - 1280, 640k + 1920)``) is below ``silence_db`` dBFS RMS
is an idle frame: the avatar's source frame as recorded (``silence="source"``) or a closed-mouth generation from
the tokens of digital silence (``silence="closed"``); ``silence=None`` renders every frame from its audio. In
real-time mode the session emits a frame every 40 ms from ``delay_s`` after the first push; when the audio for
the next frame has not arrived ``guard_s`` before its time, the timeline gets silence for it (and the sink gets
silent audio), so frames never stop. Output frame ``n`` always uses source frame ``cycle_index(n, N)`` (engine
rule), idle or not, so speech resumes without a jump in the source-frame cycle.
"""

from __future__ import annotations

from .config import LiveConfig
from .session import LiveSession, play
from .stats import LiveStats
from .thread import ModelThread, model_thread

__all__ = ["LiveConfig", "LiveSession", "LiveStats", "ModelThread", "model_thread", "play"]
