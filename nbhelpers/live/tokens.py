"""Whisper tokens of a live session's frames, each group's exactly as one-clip generation gives them on its prefix.

Frame ``k`` reads encoder frames ``2k-4 .. 2k+5`` (50 tokens: 10 encoder frames of 5 layers). Whisper-tiny encodes
30 s segments with global attention and a per-segment log-mel clamp, so the open segment is encoded again for each
group and a complete one once (docs/official-behaviour.md §5.1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import audio as audio_mod
from .. import gpu
from ..constants import FPS, SAMPLE_RATE, SEGMENT_SAMPLES, WHISPER_DIM, WHISPER_LAYERS
from ..errors import NbHelpersError

SAMPLES_PER_FRAME = SAMPLE_RATE // FPS  # 640 samples = 40 ms
SAMPLES_PER_ENCODER_FRAME = SAMPLE_RATE // 50  # 320 samples = 20 ms
ENCODER_FRAMES = SEGMENT_SAMPLES // SAMPLES_PER_ENCODER_FRAME  # 1500 encoder frames per 30 s segment


class PrefixTokens:
    """The tokens of frames from audio prefixes, with the encoder output of complete 30 s segments kept: ``pipe``'s
    ``whisper`` and ``feature_extractor`` encode ``audio(start, stop)``, the session's 16 kHz float32 samples
    ``[start, stop)``, counting ``stats.whisper_passes``."""

    def __init__(self, pipe: Any, audio: Callable[[int, int], np.ndarray], stats: Any):
        self.pipe, self.audio, self.stats = pipe, audio, stats
        self.segments: dict[int, Any] = {}  # complete segments' encoder output, (1500, 5, 384)

    def tokens(self, a: int, b: int, e: int):
        """(b - a, 50, 384) tokens of frames a..b-1 exactly as whisper_features(audio[:e]) gives them."""
        import torch

        n_enc = e // SAMPLES_PER_ENCODER_FRAME
        idx = (np.arange(a, b, dtype=np.int64) * 2 - 4)[:, None] + np.arange(10, dtype=np.int64)[None, :]
        valid = (idx >= 0) & (idx < n_enc)
        segs = [int(s) for s in np.unique(idx[valid] // ENCODER_FRAMES)]  # consecutive, all but the last complete
        first = next(self.pipe.whisper.parameters())
        padding = torch.zeros((1, WHISPER_LAYERS, WHISPER_DIM), dtype=first.dtype, device=first.device)
        table = torch.cat([*(self.segment(s, e) for s in segs), padding])  # the segments end to end, a zero row
        rows = np.where(valid, idx - ENCODER_FRAMES * (segs[0] if segs else 0), len(table) - 1)
        tokens = table[gpu.to_device(rows, table.device)]  # (b - a, 10, 5, 384); pinned copy: no wait for the GPU
        return tokens.reshape(b - a, 10 * WHISPER_LAYERS, WHISPER_DIM)

    def segment(self, s: int, e: int):
        """Encoder output (kept frames, 5, 384) of 30 s segment s as whisper_features(audio[:e]) computes it."""
        start = s * SEGMENT_SAMPLES
        complete = e >= start + SEGMENT_SAMPLES
        if complete and s in self.segments:
            return self.segments[s]
        stop = min(e, start + SEGMENT_SAMPLES)
        wave = self.audio(start, stop)
        if wave.size != stop - start:
            raise NbHelpersError(f"internal: audio {start}..{stop} is no longer held")
        stacked = self.encode(wave)
        self.stats.whisper_passes += 1
        kept = min(ENCODER_FRAMES, e // SAMPLES_PER_ENCODER_FRAME - ENCODER_FRAMES * s)
        out = stacked[:kept]
        if complete:
            self.segments[s] = out
            for old in [k for k in self.segments if k < s - 1]:
                del self.segments[old]
        return out

    def encode(self, wave: np.ndarray):
        """(1500, 5, 384) encoder hidden states of one <= 30 s segment, as one-clip generation computes them."""
        import torch

        with torch.no_grad():
            return audio_mod.encoder_states(audio_mod.encoder_of(self.pipe.whisper), self.pipe.feature_extractor,
                                            [wave])
