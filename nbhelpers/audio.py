"""Whisper features: the audio tokens that drive the lips (reference §5.1).

The path, for a 16 kHz mono waveform of ``L`` samples and ``fps`` video frames per second:

1. cut the waveform into 30 s segments (480 000 samples; the last may be shorter);
2. log-mel of each segment with a ``WhisperFeatureExtractor`` (it pads each segment to 30 s with digital silence and
   clamps to ``max - 8`` *per segment*), giving ``[80, 3000]``; with the whisper on CUDA the same log-mel is
   computed there in torch (:func:`log_mel_on_device`: no CPU STFT of 30 s per segment, float rounding apart);
3. whisper-tiny's encoder with all 5 hidden states (conv + positions, after layers 1-3, and the final layer norm of
   layer 4's output), stacked to ``[1500, 5, 384]`` per segment and joined on time: 50 encoder frames per second;
4. trimmed to ``floor(L / 16000 * 50)`` encoder frames;
5. for video frame ``k`` a window of 10 encoder frames starting at ``floor(k * 50 / fps) - 2 * ceil(50 / fps)``
   (2 video frames before, the current one, 2 after at 25 fps), with zeros outside the audio;
6. flattened time-major: token ``time_step * 5 + layer``, giving ``[T, 50, 384]`` with ``T = floor(L / 16000 * fps)``.

The sinusoidal positional encoding is **not** added here: the official code adds it right before the UNet
(``scripts/inference.py:200``), and so does :func:`nbhelpers.latents.unet_step`.

torch and transformers are imported inside the functions, so importing this module stays light.
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

PAD_LEFT_STEPS = 2  # --audio_padding_length_left, video frames of context before the current one (inference.py:266)
PAD_RIGHT_STEPS = 2  # --audio_padding_length_right, video frames of context after it (inference.py:267)
ENCODER_FRAMES_PER_SEGMENT = 1500  # whisper encoder frames per 30 s segment (20 ms each)
SEGMENTS_PER_BATCH = 8  # 30 s segments sent through the encoder in one forward (4 minutes of audio)

# The fields of openai/whisper-tiny's preprocessor_config.json that shape the log-mel
# (shared/reference/configs/whisper-tiny-preprocessor.json); transformers computes the mel filters from them.
WHISPER_TINY_PREPROCESSOR = {
    "feature_size": 80,  # mel bins
    "sampling_rate": SAMPLE_RATE,  # Hz
    "hop_length": 160,  # samples (10 ms)
    "chunk_length": 30,  # seconds
    "n_fft": 400,  # samples (25 ms)
    "padding_value": 0.0,
    "return_attention_mask": False,
}


@dataclass(frozen=True)
class FrameWindows:
    """Which whisper encoder frames each video frame reads (pure integer bookkeeping of reference §5.1 steps 5-7).

    Encoder frame ``j`` covers audio ``[j * 20 ms, (j + 1) * 20 ms)``. Video frame ``k`` reads encoder frames
    ``starts[k] .. starts[k] + window - 1``; indices outside ``[0, n_encoder_frames)`` are zero padding.

    Attributes:
        n_frames: T, number of video frames, ``L * fps // 16000`` (exact integer arithmetic).
        n_encoder_frames: Encoder frames kept after trimming, ``L * 50 // 16000``.
        starts: (T,) int64, first encoder frame of each window in *unpadded* coordinates
            (``k * 50 // fps - pad_left``; negative at the start of the audio).
        pad_left: Zero frames the official code prepends, ``2 * ceil(50 / fps)`` (4 at 25 fps).
        pad_right: Zero frames the official code appends, ``6 * ceil(50 / fps)`` (12 at 25 fps).
        window: Encoder frames per video frame, 10 (200 ms).
        fps: Video frames per second the windows were made for.
    """

    n_frames: int
    n_encoder_frames: int
    starts: np.ndarray
    pad_left: int
    pad_right: int
    window: int
    fps: int

    def indices(self) -> np.ndarray:
        """(T, window) int64 unpadded encoder-frame indices per video frame; -1 marks a zero-padding frame."""
        idx = self.starts[:, None] + np.arange(self.window, dtype=np.int64)[None, :]
        return np.where((idx >= 0) & (idx < self.n_encoder_frames), idx, -1)


def frame_windows(n_samples: int, fps: int = 25) -> FrameWindows:
    """The encoder frames each video frame uses, computed with integers only.

    Args:
        n_samples: L, number of 16 kHz audio samples, >= 0.
        fps: Video frames per second, a positive integer (the pipeline always uses 25).

    Returns:
        A :class:`FrameWindows` with T = ``n_samples * fps // 16000`` windows of 10 encoder frames.

    Raises:
        InputError: ``n_samples`` is negative or ``fps`` is not a positive integer.

    Notes:
        The official code computes ``T`` and the trim length with floats, ``floor(L / 16000 * fps)``, which for a few
        lengths gives one less than the exact value (for example L = 18 560 samples: 28.999... -> 28 frames instead
        of 29). The integer form here is the intended count. At 25 fps the window starts agree exactly.

    Source: ``musetalk/utils/audio_processor.py:48,59-90`` (reference §5.1 steps 5-7, §5.2).
    """
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
                        pad_right=pad_right, window=AUDIO_WINDOW, fps=fps)


@functools.lru_cache(maxsize=1)
def default_feature_extractor():
    """A ``WhisperFeatureExtractor`` with openai/whisper-tiny's preprocessor values, built offline.

    Returns:
        ``transformers.WhisperFeatureExtractor`` (80 mel bins, 16 kHz, hop 160, n_fft 400, 30 s chunks). The same
        object is returned on every call.

    Raises:
        MissingDependencyError: transformers is not installed.

    Source: ``musetalk/utils/audio_processor.py:12-13`` (reads ``models/whisper/preprocessor_config.json``).
    """
    transformers = require("transformers", "pip install transformers")
    return transformers.WhisperFeatureExtractor(**WHISPER_TINY_PREPROCESSOR)


def whisper_features(waveform: np.ndarray, whisper: Any, fps: int = 25, feature_extractor: Any = None, *,
                     segments_per_batch: int = SEGMENTS_PER_BATCH):
    """Per-video-frame whisper tokens, ``(T, 50, 384)``, as the official pipeline computes them.

    Each 30 s segment of the waveform gets its own log-mel (padded to 30 s with silence, so the ``max - 8`` clamp
    is per segment); the encoder runs on several segments in one forward (``segments_per_batch``) with
    ``output_hidden_states=True``, and its 5 hidden states are stacked, joined on time, trimmed to
    ``n_samples * 50 // 16000`` encoder frames, windowed (10 encoder frames per video frame, zero padding outside
    the audio) and flattened time-major.

    The positional encoding is NOT applied here. The official code adds it right before the UNet
    (``scripts/inference.py:200``); :func:`nbhelpers.latents.unet_step` does the same.

    The log-mel is the extractor's on the CPU; with the whisper on CUDA it is computed on the device by
    :func:`log_mel_on_device` (the same steps and mel filters; float rounding differs, within 1e-4 in log-mel units).

    Attention runs with whatever implementation ``whisper`` was loaded with; transformers picks
    ``attn_implementation="sdpa"`` (torch scaled-dot-product attention) by default, as the official transformers
    4.39.2 did. Eager attention rounds differently in the last bits.

    Differences from the official code, all fixes of edge cases:
        - Zero padding always has its intended length (``2 * ceil(50 / fps)`` frames before, any needed after).
          The official builds it with ``zeros_like`` of a slice, so audio under 12 encoder frames (< 0.24 s) got
          shorter padding, shifted windows or an ``exit()`` (quirk Q14).
        - Frame counts use exact integer arithmetic (see :func:`frame_windows`).
        - Empty audio, and audio shorter than one video frame, raise :class:`InputError` (the official fails in
          ``torch.cat([])``).
        - Batching segments through the encoder changes results only by float rounding (about 1e-6 relative in
          fp32) against the official one-segment-at-a-time loop.

    Args:
        waveform: (L,) float32 (or float64) numpy array, mono, 16 kHz, values in about [-1, 1]. Use
            ``nbhelpers.media.load_audio`` to get one from any file.
        whisper: A transformers ``WhisperModel`` (its ``.encoder`` is used), a ``WhisperForConditionalGeneration``,
            or a ``WhisperEncoder``; whisper-tiny (4 layers, d_model 384) for MuseTalk. Its parameters' dtype and
            device decide the output's.
        fps: Video frames per second, a positive integer; 25 for MuseTalk.
        feature_extractor: A ``WhisperFeatureExtractor``; default :func:`default_feature_extractor` (whisper-tiny's
            values, no network).
        segments_per_batch: 30 s segments per encoder forward, >= 1 (memory grows about 60 MB per segment in fp32).

    Returns:
        torch.Tensor (T, 50, 384) in the whisper's dtype on its device, ``T = L * fps // 16000``. Token
        ``j = time_step * 5 + layer`` of frame ``k`` is hidden state ``layer`` (0 = conv + positions, 4 = final
        layer norm) of encoder frame ``k * 50 // fps - 2 * ceil(50 / fps) + time_step``, or zeros when that frame is
        outside the audio.

    Raises:
        InputError: ``waveform`` is not a 1-D finite float array, is empty, or is shorter than one video frame
            (``16000 / fps`` samples); ``fps`` is not a positive integer; ``segments_per_batch`` < 1; ``whisper``
            has no parameters; or the encoder returns other than 5 hidden states of width 384.

    Source: ``musetalk/utils/audio_processor.py:21-93``, ``scripts/inference.py:65-68,122-127`` (reference §5.1).
    """
    import torch

    fps = _check_fps(fps)
    wave = _check_waveform(waveform, fps)
    if isinstance(segments_per_batch, bool) or int(segments_per_batch) < 1:
        raise InputError(f"segments_per_batch must be an integer >= 1; got {segments_per_batch!r}.")
    encoder = _encoder_of(whisper)
    try:
        first = next(encoder.parameters())
    except (StopIteration, AttributeError, TypeError):
        raise InputError(f"whisper must be a torch module with parameters (a transformers WhisperModel or "
                         f"WhisperEncoder); got {type(whisper).__name__}. Load it with "
                         "nbhelpers.models.load_whisper(weights_dir).") from None
    device, dtype = first.device, first.dtype
    extractor = feature_extractor if feature_extractor is not None else default_feature_extractor()
    windows = frame_windows(wave.shape[0], fps)

    pieces = []  # (n_kept, 5, 384) per batch of segments, in time order
    kept = 0
    seg_starts = list(range(0, wave.shape[0], SEGMENT_SAMPLES))
    per = int(segments_per_batch)
    batches = [seg_starts[i:i + per] for i in range(0, len(seg_starts), per)]
    with torch.no_grad():
        for batch in batches:
            mels = [_log_mel(extractor, wave[s:s + SEGMENT_SAMPLES], device) for s in batch]
            mel = torch.cat(mels, dim=0).to(device=device, dtype=dtype)  # (S, 80, 3000)
            hidden = encoder(mel, output_hidden_states=True).hidden_states
            if len(hidden) != WHISPER_LAYERS or hidden[0].shape[-1] != WHISPER_DIM:
                raise InputError(f"whisper must be whisper-tiny (5 hidden states of width {WHISPER_DIM}); its "
                                 f"encoder returned {len(hidden)} hidden states of shape {tuple(hidden[0].shape)}. "
                                 "MuseTalk's UNet was trained on whisper-tiny features.")
            stacked = torch.stack(tuple(hidden), dim=2)  # (S, 1500, 5, 384)
            stacked = stacked.reshape(-1, WHISPER_LAYERS, WHISPER_DIM)  # segments joined on time
            take = min(stacked.shape[0], windows.n_encoder_frames - kept)
            pieces.append(stacked[:take])
            kept += take
        features = torch.cat(pieces, dim=0) if len(pieces) > 1 else pieces[0]  # (n_encoder_frames, 5, 384)
        # Windows read a virtual zero-padded sequence: every index outside the audio points at one extra zero row,
        # so the padding always has its intended length (fixes Q14).
        zero = features.new_zeros((1, WHISPER_LAYERS, WHISPER_DIM))
        padded = torch.cat([features, zero], dim=0)
        idx = torch.from_numpy(windows.indices()).to(device)
        idx = torch.where(idx < 0, torch.full_like(idx, windows.n_encoder_frames), idx)
        tokens = padded[idx]  # (T, 10, 5, 384)
        return tokens.reshape(windows.n_frames, AUDIO_TOKENS, WHISPER_DIM)


def _log_mel(extractor: Any, segment: np.ndarray, device: Any = None):
    """[1, 80, 3000] float32 log-mel of one <= 30 s segment (the extractor pads it to 30 s with zeros).

    On a CUDA ``device`` it is computed there by :func:`log_mel_on_device` (same maths, float rounding apart)
    when the extractor allows it, and returned on that device; otherwise by the extractor on the CPU.
    """
    if device is not None and _device_type(device) == "cuda" and _device_log_mel_ok(extractor):
        return log_mel_on_device(segment, extractor, device)
    out = extractor(segment, sampling_rate=SAMPLE_RATE, return_tensors="pt")
    return out["input_features"]


def _device_type(device: Any) -> str:
    return getattr(device, "type", None) or str(device).split(":")[0]


def _device_log_mel_ok(extractor: Any) -> bool:
    """True when the extractor is whisper's log-mel with no dither (what :func:`log_mel_on_device` computes)."""
    names = ("n_fft", "hop_length", "n_samples", "nb_max_frames", "mel_filters", "sampling_rate")
    return all(hasattr(extractor, n) for n in names) and float(getattr(extractor, "dither", 0.0) or 0.0) == 0.0 \
        and int(extractor.sampling_rate) == SAMPLE_RATE and float(getattr(extractor, "padding_value", 0.0)) == 0.0


def log_mel_on_device(segment: Any, extractor: Any, device: Any):
    """Whisper's log-mel of one <= 30 s segment, computed with torch on ``device`` (no copy back to the host).

    The same steps as ``WhisperFeatureExtractor`` (transformers ``feature_extraction_whisper.py``, after OpenAI
    whisper's ``log_mel_spectrogram``): the segment zero-padded to ``n_samples`` (30 s), a centred STFT with a
    periodic Hann window of ``n_fft`` (400) samples, hop ``hop_length`` (160), reflect padding; the power spectrum
    without its last frame; the extractor's own mel filter bank (``mel_filters``, (201, 80)); ``log10`` of it
    clamped at 1e-10; clamped again at the segment's maximum minus 8; then ``(x + 4) / 4``. Only float rounding
    can differ from the extractor: on the CPU it is within 1e-5 of the extractor's torch path (transformers 5) and
    1e-4 of its numpy path; on CUDA (cuFFT) within 1e-4 in log-mel units (values span about [-1.5, 1.5]); tested.

    Args:
        segment: (L,) float32 samples at 16 kHz, L <= ``n_samples`` (numpy or a tensor on any device).
        extractor: A ``WhisperFeatureExtractor`` (its parameters and mel filters are used).
        device: Where to compute (CUDA in the pipeline; the CPU works too).

    Returns:
        torch.Tensor (1, 80, 3000) float32 on ``device``.

    Raises:
        InputError: The segment is longer than 30 s.
    """
    import torch

    device = torch.device(device)
    n = int(extractor.n_samples)
    wave = segment if isinstance(segment, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(segment,
                                                                                                 np.float32))
    if wave.shape[-1] > n:
        raise InputError(f"a log-mel segment holds at most {n} samples (30 s); got {wave.shape[-1]}.")
    wave = to_device(wave.reshape(-1).float(), device) if wave.device != device else wave.reshape(-1).float()
    padded = torch.nn.functional.pad(wave, (0, n - wave.shape[0]))
    cache = _mel_constants(extractor, device)
    window, filters = cache
    stft = torch.stft(padded, int(extractor.n_fft), int(extractor.hop_length), window=window, center=True,
                      pad_mode="reflect", return_complex=True)
    power = (stft[:, :-1].abs() ** 2).contiguous()  # (201, 3000)
    log_spec = torch.clamp(filters @ power, min=1e-10).log10()  # (80, 3000)
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).unsqueeze(0)


_MEL_CONSTANTS: dict[Any, Any] = {}


def _mel_constants(extractor: Any, device: Any):
    """(Hann window, (80, 201) mel filters) of ``extractor`` on ``device``, made once per extractor and device."""
    import torch

    key = (id(extractor), str(device))
    found = _MEL_CONSTANTS.get(key)
    if found is None or found[0] is not extractor:
        window = torch.hann_window(int(extractor.n_fft), periodic=True, dtype=torch.float32).to(device)
        filters = torch.from_numpy(np.ascontiguousarray(np.asarray(extractor.mel_filters, np.float32).T)).to(device)
        found = (extractor, (window, filters))
        _MEL_CONSTANTS[key] = found
    return found[1]


def _encoder_of(whisper: Any):
    """The encoder module of a WhisperModel / WhisperForConditionalGeneration, or ``whisper`` itself."""
    encoder = getattr(whisper, "encoder", None)
    if encoder is None and getattr(whisper, "model", None) is not None:
        encoder = getattr(whisper.model, "encoder", None)
    encoder = whisper if encoder is None else encoder
    if not callable(encoder):
        raise InputError(f"whisper must be a transformers WhisperModel or WhisperEncoder; got "
                         f"{type(whisper).__name__}. Load it with nbhelpers.models.load_whisper(weights_dir).")
    return encoder


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
