"""Whisper features, the audio tokens that drive the lips: whisper-tiny's 5 encoder hidden states of 30 s log-mel
segments, a window of 10 encoder frames per video frame (:func:`whisper_features`). The positional encoding is
added later, by :func:`nbhelpers.latents.unet_step`, as officially. Source: ``musetalk/utils/audio_processor.py:21-93``;
docs/official-behaviour.md §5.1-§5.3.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .constants import (
    AUDIO_TOKENS,
    AUDIO_WINDOW,
    SAMPLE_RATE,
    SEGMENT_SAMPLES,
    WHISPER_DIM,
    WHISPER_FPS,
    WHISPER_LAYERS,
)
from .errors import InputError, require
from .gpu import to_device
from .models import bundled_config

PAD_LEFT_STEPS = 2  # --audio_padding_length_left, video frames of context before the current one (inference.py:266)
PAD_RIGHT_STEPS = 2  # --audio_padding_length_right, video frames of context after it (inference.py:267)
SEGMENTS_PER_BATCH = 8  # 30 s segments sent through the encoder in one forward (4 minutes of audio)


@dataclass(frozen=True)
class FrameWindows:
    """Which whisper encoder frames (20 ms each) each of the ``n_frames`` = T = ``L * fps // 16000`` video frames
    reads: ``window`` (10, 200 ms) from ``starts`` (T,) int64, ``k * 50 // fps - pad_left`` (negative at the start);
    indices outside ``[0, n_encoder_frames)`` (``L * 50 // 16000``) are zero padding, ``pad_left`` =
    ``2 * ceil(50 / fps)`` (4 at 25 fps) in front and ``pad_right`` = ``6 * ceil(50 / fps)`` (12) behind."""

    n_frames: int
    n_encoder_frames: int
    starts: np.ndarray
    pad_left: int
    pad_right: int
    window: int

    def indices(self) -> np.ndarray:
        """(T, window) int64 unpadded encoder-frame indices per video frame; -1 marks a zero-padding frame."""
        idx = self.starts[:, None] + np.arange(self.window, dtype=np.int64)[None, :]
        return np.where((idx >= 0) & (idx < self.n_encoder_frames), idx, -1)


def frame_windows(n_samples: int, fps: int = 25) -> FrameWindows:
    """The :class:`FrameWindows` of ``n_samples`` (>= 0) 16 kHz samples at ``fps`` (a positive integer), T =
    ``n_samples * fps // 16000`` in exact integers (InputError otherwise): the official float
    ``floor(L / 16000 * fps)`` is one short for a few lengths (L = 18 560: 28 frames, not 29).
    Source: ``musetalk/utils/audio_processor.py:48,59-90``; docs/official-behaviour.md §5.1, §5.2."""
    fps = _check_fps(fps)
    if isinstance(n_samples, bool) or int(n_samples) != n_samples or n_samples < 0:
        raise InputError(f"n_samples must be a non-negative integer number of 16 kHz samples; got {n_samples!r}.")
    n_samples = int(n_samples)
    p = math.ceil(WHISPER_FPS / fps)  # ceil(ratio), ratio = 50 / fps encoder frames per video frame
    pad_left = p * PAD_LEFT_STEPS
    pad_right = p * 3 * PAD_RIGHT_STEPS
    n_frames = n_samples * fps // SAMPLE_RATE
    n_encoder_frames = n_samples * WHISPER_FPS // SAMPLE_RATE
    starts = np.arange(n_frames, dtype=np.int64) * WHISPER_FPS // fps - pad_left
    return FrameWindows(n_frames=n_frames, n_encoder_frames=n_encoder_frames, starts=starts, pad_left=pad_left,
                        pad_right=pad_right, window=AUDIO_WINDOW)


@functools.lru_cache(maxsize=1)
def default_feature_extractor():
    """The cached ``WhisperFeatureExtractor`` of openai/whisper-tiny's ``preprocessor_config.json`` (bundled in
    ``nbhelpers/configs``: 80 mel bins, n_fft 400, hop 160 samples, 30 s chunks at 16 kHz); raises
    MissingDependencyError without transformers. Source: ``musetalk/utils/audio_processor.py:12-13``."""
    transformers = require("transformers", "pip install transformers")
    return transformers.WhisperFeatureExtractor(**bundled_config("whisper-tiny-preprocessor.json"))


def whisper_features(waveform: np.ndarray, whisper: Any, fps: int = 25, feature_extractor: Any = None):
    """Per-video-frame whisper tokens of an (L,) float 16 kHz mono ``waveform`` (about [-1, 1]), as the official
    pipeline computes them (without the positional encoding): a (T, 50, 384) tensor, ``T = L * fps // 16000``, in
    the dtype and on the device of ``whisper`` (a transformers ``WhisperModel``, ``...ForConditionalGeneration`` or
    ``WhisperEncoder``). Token ``time_step * 5 + layer`` of frame ``k`` is hidden state ``layer`` (0 = embeddings,
    4 = final layer norm) of encoder frame ``k * 50 // fps - 2 * ceil(50 / fps) + time_step``, zeros outside the
    audio. :data:`SEGMENTS_PER_BATCH` 30 s segments go through the encoder at once; with whisper on CUDA the log-mel
    is computed there (:func:`log_mel_on_device`).

    Departures from the official code, all edge cases: padding always has its full length (quirk Q14), frame counts
    are exact integers (:func:`frame_windows`), too-short audio raises, batched segments differ by float rounding.
    InputError for a waveform that is not 1-D finite float or is under one frame, an fps not a positive integer, a
    ``whisper`` without parameters or not whisper-tiny (5 states of width 384).

    Source: ``musetalk/utils/audio_processor.py:21-93``, ``scripts/inference.py:65-68``;
    docs/official-behaviour.md §5.1, #q14."""
    import torch

    fps = _check_fps(fps)
    wave = _check_waveform(waveform, fps)
    encoder = encoder_of(whisper)
    extractor = feature_extractor if feature_extractor is not None else default_feature_extractor()
    windows = frame_windows(wave.shape[0], fps)

    pieces = []  # (n_kept, 5, 384) per batch of segments, in time order
    kept = 0
    step = SEGMENT_SAMPLES * SEGMENTS_PER_BATCH
    with torch.no_grad():
        for start in range(0, wave.shape[0], step):
            starts = range(start, min(start + step, wave.shape[0]), SEGMENT_SAMPLES)
            stacked = encoder_states(encoder, extractor, [wave[s:s + SEGMENT_SAMPLES] for s in starts])
            take = min(stacked.shape[0], windows.n_encoder_frames - kept)
            pieces.append(stacked[:take])
            kept += take
        features = torch.cat(pieces, dim=0) if len(pieces) > 1 else pieces[0]  # (n_encoder_frames, 5, 384)
        # Every index outside the audio reads one extra zero row, so padding has its full length (quirk Q14).
        zero = features.new_zeros((1, WHISPER_LAYERS, WHISPER_DIM))
        padded = torch.cat([features, zero], dim=0)
        idx = torch.from_numpy(windows.indices()).to(features.device)
        idx = torch.where(idx < 0, torch.full_like(idx, windows.n_encoder_frames), idx)
        tokens = padded[idx]  # (T, 10, 5, 384)
        return tokens.reshape(windows.n_frames, AUDIO_TOKENS, WHISPER_DIM)


def _log_mel(extractor: Any, segment: np.ndarray, device: Any = None):
    """(1, 80, 3000) float32 log-mel of one <= 30 s segment: on a CUDA ``device`` when possible, else the CPU."""
    if device is not None and "cuda" in str(device) and _device_log_mel_ok(extractor):
        return log_mel_on_device(segment, extractor, device)
    out = extractor(segment, sampling_rate=SAMPLE_RATE, return_tensors="pt")
    return out["input_features"]


def _device_log_mel_ok(extractor: Any) -> bool:
    """True when the extractor is whisper's log-mel with no dither (what :func:`log_mel_on_device` computes)."""
    names = ("n_fft", "hop_length", "n_samples", "nb_max_frames", "mel_filters", "sampling_rate")
    return all(hasattr(extractor, n) for n in names) and float(getattr(extractor, "dither", 0.0) or 0.0) == 0.0 \
        and int(extractor.sampling_rate) == SAMPLE_RATE and float(getattr(extractor, "padding_value", 0.0)) == 0.0


def log_mel_on_device(segment: Any, extractor: Any, device: Any):
    """Whisper's (1, 80, 3000) float32 log-mel of one (L,) float32 16 kHz ``segment`` (numpy or a tensor; over 30 s:
    InputError), with torch on ``device`` by ``extractor``'s steps and filters: zero-pad to 30 s, centred STFT
    (periodic Hann, n_fft 400, hop 160, reflect), power without the last frame, mel filters, ``log10`` clamped at
    1e-10 and at the maximum minus 8, then ``(x + 4) / 4``; within 1e-4 of the extractor.
    Source: transformers ``models/whisper/feature_extraction_whisper.py:63-132``; docs/official-behaviour.md §5.1."""
    import torch

    device = torch.device(device)
    n = int(extractor.n_samples)
    wave = segment if isinstance(segment, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(segment, np.float32))
    if wave.shape[-1] > n:
        raise InputError(f"a log-mel segment holds at most {n} samples (30 s); got {wave.shape[-1]}.")
    wave = to_device(wave.reshape(-1).float(), device) if wave.device != device else wave.reshape(-1).float()
    padded = torch.nn.functional.pad(wave, (0, n - wave.shape[0]))
    window, filters = _mel_constants(extractor, device)
    stft = torch.stft(padded, int(extractor.n_fft), int(extractor.hop_length), window=window, center=True,
                      pad_mode="reflect", return_complex=True)
    power = (stft[:, :-1].abs() ** 2).contiguous()  # (201, 3000)
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()  # (80, 3000)
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).unsqueeze(0)


@functools.cache
def _mel_constants(extractor: Any, device: Any):
    """(Hann window, (80, 201) mel filters) of ``extractor`` on the torch ``device``, made once per pair."""
    import torch

    window = torch.hann_window(int(extractor.n_fft), periodic=True, dtype=torch.float32).to(device)
    filters = torch.from_numpy(np.ascontiguousarray(np.asarray(extractor.mel_filters, np.float32).T)).to(device)
    return window, filters


def encoder_of(whisper: Any):
    """The encoder module of a WhisperModel / WhisperForConditionalGeneration, or ``whisper`` itself; InputError
    unless it is a torch module with parameters."""
    encoder = getattr(whisper, "encoder", None)
    if encoder is None and getattr(whisper, "model", None) is not None:
        encoder = getattr(whisper.model, "encoder", None)
    encoder = whisper if encoder is None else encoder
    try:
        has_parameters = callable(encoder) and next(encoder.parameters(), None) is not None
    except (AttributeError, TypeError):
        has_parameters = False
    if not has_parameters:
        raise InputError(f"whisper must be a torch module with parameters (a transformers WhisperModel or "
                         f"WhisperEncoder); got {type(whisper).__name__}. Load it with "
                         "nbhelpers.models.load_whisper(weights_dir).")
    return encoder


def encoder_states(encoder: Any, extractor: Any, segments: list[np.ndarray]):
    """(S * 1500, 5, 384) hidden states (embeddings, then each layer) of S <= 30 s float32 16 kHz ``segments``
    joined on time, in the dtype and on the device of ``encoder`` (:func:`encoder_of`), the log-mel there on CUDA.
    Run under ``torch.no_grad()``. InputError unless the encoder is whisper-tiny's."""
    import torch

    first = next(encoder.parameters())
    mels = [_log_mel(extractor, segment, first.device) for segment in segments]
    mel = torch.cat(mels, dim=0).to(device=first.device, dtype=first.dtype)  # (S, 80, 3000)
    hidden = encoder(mel, output_hidden_states=True).hidden_states
    if len(hidden) != WHISPER_LAYERS or hidden[0].shape[-1] != WHISPER_DIM:
        raise InputError(f"whisper must be whisper-tiny (5 hidden states of width {WHISPER_DIM}); its "
                         f"encoder returned {len(hidden)} hidden states of shape {tuple(hidden[0].shape)}. "
                         "MuseTalk's UNet was trained on whisper-tiny features.")
    return torch.stack(tuple(hidden), dim=2).reshape(-1, WHISPER_LAYERS, WHISPER_DIM)  # (S, 1500, 5, 384) joined


def _check_fps(fps: Any) -> int:
    if isinstance(fps, bool) or not isinstance(fps, (int, float, np.integer, np.floating)) or fps != fps \
            or fps < 1 or int(fps) != fps:
        raise InputError(f"fps must be a positive whole number of video frames per second (25 for MuseTalk); got "
                         f"{fps!r}. Convert the video to a constant 25 fps first (nbhelpers.media.load_video does).")
    return int(fps)


def _check_waveform(waveform: Any, fps: int) -> np.ndarray:
    if hasattr(waveform, "detach"):  # a CPU torch tensor
        waveform = waveform.detach().cpu().numpy()
    if not isinstance(waveform, np.ndarray):
        raise InputError(f"waveform must be a numpy array of 16 kHz mono samples; got {type(waveform).__name__}. "
                         "Load audio with nbhelpers.media.load_audio(path).")
    if waveform.ndim != 1:
        raise InputError(f"waveform must be 1-D (mono), shape (L,); got shape {waveform.shape}. Mix the channels "
                         "to mono (nbhelpers.media.load_audio does).")
    if not np.issubdtype(waveform.dtype, np.floating):
        raise InputError(f"waveform must hold float samples in about [-1, 1]; got dtype {waveform.dtype}. Divide "
                         "16-bit integers by 32768, or load with nbhelpers.media.load_audio(path).")
    n = waveform.shape[0]
    if n == 0:
        raise InputError("waveform is empty (0 samples): the audio has no sound to drive the lips. Check the audio "
                         "file (nbhelpers.media.probe(path)) and pass one with speech.")
    min_samples = -(-SAMPLE_RATE // fps)  # ceil(16000 / fps): one video frame
    if n * fps // SAMPLE_RATE < 1:
        raise InputError(f"waveform has {n} samples ({n / SAMPLE_RATE * 1000:.1f} ms), shorter than one video frame "
                         f"at {fps} fps; at least {min_samples} samples ({1000 / fps:.0f} ms) are needed. Pass "
                         "longer audio.")
    wave = np.ascontiguousarray(waveform, dtype=np.float32)
    if not np.isfinite(wave).all():
        bad = int((~np.isfinite(wave)).sum())
        raise InputError(f"waveform has {bad} non-finite samples (NaN or inf) out of {n}; the audio decode is "
                         "broken. Re-encode the audio file or load it with nbhelpers.media.load_audio(path).")
    return wave
