"""Quality: is a clip in sync? SyncNet's LSE-D / LSE-C and a weight-free mouth-follows-voice check.

This module owns measuring the audio-visual sync of a finished (or source) clip; it renders nothing.

- :func:`sync_score`: the field's measure, SyncNet v2 (Chung & Zisserman, "Out of time", 2016) run with the
  published evaluation protocol of ``syncnet_python`` (the one Wav2Lip and LatentSync report LSE-D and LSE-C
  with): S3FD face boxes, smoothed, cropped with 40 % margin and resized to 224x224; stacks of 5 consecutive BGR
  frames; 13 MFCCs at 100 Hz (``python_speech_features`` defaults) in 20-step windows (0.2 s, 4 steps per video
  frame); Euclidean distances between the two 1024-d embeddings for every offset of +-15 frames. LSE-D is the
  smallest mean distance, LSE-C the median of the mean distances minus that minimum, the offset the one of the
  minimum. It needs the optional ``quality`` weight set (``syncnet/syncnet_v2.model``).
- :func:`mouth_audio_lag`: no weights. The inner-lip opening per frame (68 landmarks from a face backend, divided
  by the outer-eye-corner distance) against the speech envelope (log RMS per 40 ms video frame), both high-passed;
  the lag is the peak of their normalised cross-correlation, reported with its correlation, peak-to-sidelobe
  ratio and a z score that allows for the signals' autocorrelation.

Both take the embedding/landmark step as an argument (``model=``, ``track=``) so the protocol can be tested with
injected models, and both return a result dataclass that shows itself (``ui.plot_sync`` draws the curves).

Sign conventions (the two measures report opposite signs, as their sources do):

- ``SyncScore.offset_frames`` is syncnet_python's "AV offset": video window ``i`` matches audio window
  ``i - offset``; positive = the sound comes *earlier* than the picture.
- ``MouthAudioLag.lag_frames``: positive = the sound comes *later* than the mouth (the audio is delayed).
  ``SyncScore.audio_delay_frames`` (= -offset) is on this scale.

Importing this module imports numpy only; torch is imported when SyncNet is built.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .constants import FPS, SAMPLE_RATE
from .errors import CheckpointError, InputError, MissingDependencyError, WeightsError

__all__ = [
    "SYNCNET_FILE", "VSHIFT", "MouthAudioLag", "SyncScore", "SyncEmbedder", "SyncNetV2",  # noqa: F822 (lazy)
    "load_syncnet", "mfcc", "mouth_audio_lag", "mouth_opening", "protocol_crops", "score_embeddings",
    "smooth_face_boxes", "speech_envelope", "sync_score", "write_tiny_syncnet",
]

# --- SyncNet evaluation protocol (syncnet_python, run_pipeline.py / SyncNetInstance.py / run_syncnet.py) ---
SYNCNET_FILE = "syncnet/syncnet_v2.model"  # relative to a weights dir; manifest entry "syncnet-v2", set "quality"
VSHIFT = 15  # frames: offsets searched are -VSHIFT..+VSHIFT (run_syncnet.py --vshift 15)
STACK_FRAMES = 5  # video frames per SyncNet input window (0.2 s at 25 fps)
CROP_SIDE = 224  # pixels, side of the face crop SyncNet sees (run_pipeline.py crop_video, cv2.resize)
CROP_SCALE = 0.40  # margin of the crop around the face box (run_pipeline.py --crop_scale)
CROP_PAD_VALUE = 110  # grey level of the padding around the frame (run_pipeline.py np.pad constant 110)
SMOOTH_KERNEL = 13  # frames: median filter over box size and centre (run_pipeline.py signal.medfilt)
FACEDET_SCALE = 0.25  # S3FD runs on frames scaled by this (run_pipeline.py --facedet_scale)
FACEDET_MIN_SCORE = 0.9  # S3FD confidence kept (run_pipeline.py conf_th=0.9)
MAX_MISSED_FRAMES = 25  # frames without a face bridged by interpolation (run_pipeline.py --num_failed_det)
BATCH_WINDOWS = 20  # windows per SyncNet call (run_syncnet.py --batch_size 20)
PAIRWISE_EPS = 1e-6  # torch.nn.functional.pairwise_distance's eps, added to the difference

# --- MFCC (python_speech_features 0.6 defaults, as SyncNetInstance.py calls mfcc(audio, 16000)) ---
MFCC_COEFFS = 13  # cepstra kept; the first is replaced by the log frame energy (appendEnergy=True)
MFCC_WIN_S = 0.025  # seconds per analysis frame (400 samples at 16 kHz), rectangular window
MFCC_HOP_S = 0.010  # seconds between frames: 100 MFCC frames per second
MFCC_NFFT = 512
MFCC_FILTERS = 26  # mel filters, 0 Hz to sample_rate / 2
MFCC_PREEMPH = 0.97
MFCC_LIFTER = 22
MFCC_PER_FRAME = 4  # MFCC steps per video frame (100 Hz / 25 fps)
MFCC_WINDOW = 20  # MFCC steps per SyncNet audio window (= STACK_FRAMES * MFCC_PER_FRAME)
INT16_SCALE = 32768.0  # the protocol feeds int16 samples (ffmpeg pcm_s16le); a float waveform is scaled by this
SAMPLES_PER_FRAME = SAMPLE_RATE // FPS  # 640 samples of 16 kHz audio per 25 fps frame

# --- mouth_audio_lag ---
MAX_LAG = 15  # frames searched either way (the same +-0.6 s as SyncNet's offsets)
HIGHPASS_FRAMES = 25  # frames: a centred moving average of this length (1 s) is subtracted from both signals
ENVELOPE_FLOOR_DB = 60.0  # the log envelope is floored this many dB below its loudest frame (silence)
SIDELOBE_GUARD = 2  # lags within this many frames of the peak are not sidelobes
Z_SIGNIFICANT = 3.5  # z score of the peak above which the lag is called reliable (about 0.05 over 31 lags)
INNER_UPPER = (61, 62, 63)  # iBUG 68 (0-based): upper inner lip, left to right
INNER_LOWER = (67, 66, 65)  # lower inner lip points facing them
EYE_CORNERS = (36, 45)  # outer eye corners: the face-size unit
INSTALL_TORCH = "pip install torch  (on Colab it is preinstalled; never reinstall it there)"


# ---------------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SyncScore:
    """SyncNet's verdict on one clip (the published LSE protocol).

    Attributes:
        lse_d: LSE-D, the smallest mean embedding distance over the offsets (lower = better sync; published
            real videos are around 6-7, good lip-sync models 6.5-8).
        lse_c: LSE-C, median of the mean distances minus their minimum (higher = more confident; around 6-8 for
            real talking heads, below about 2 means SyncNet sees no sync).
        offset_frames: syncnet_python's AV offset at the minimum, in video frames (40 ms): video window ``i``
            matches audio window ``i - offset``; positive = the sound comes earlier than the picture.
        offsets: (2 * vshift + 1,) int, the offsets searched, ``+vshift`` down to ``-vshift`` (the order of
            ``mean_distances``).
        mean_distances: (2 * vshift + 1,) float64, the mean distance at each offset.
        frame_distances: (W,) float64, the per-window distance at the chosen offset.
        n_windows: W, the number of 5-frame windows compared.
        detector: Where the face boxes came from (``"s3fd"``, ``"dlib"``, ``"boxes"``).
        notes: Departures from the published protocol that apply to this run.
    """

    lse_d: float
    lse_c: float
    offset_frames: int
    offsets: np.ndarray
    mean_distances: np.ndarray
    frame_distances: np.ndarray
    n_windows: int
    detector: str = ""
    notes: tuple[str, ...] = ()

    @property
    def audio_delay_frames(self) -> int:
        """``-offset_frames``: positive = the sound comes later than the picture (the scale of
        :attr:`MouthAudioLag.lag_frames`)."""
        return -int(self.offset_frames)

    def summary(self) -> str:
        """One or two lines: LSE-D, LSE-C, the offset in frames and milliseconds."""
        ms = 1000 * self.offset_frames / FPS
        line = (f"SyncNet: LSE-D {self.lse_d:.3f}, LSE-C {self.lse_c:.3f}, AV offset {self.offset_frames:+d} "
                f"frames ({ms:+.0f} ms) over {self.n_windows} windows" + (f", faces from {self.detector}"
                                                                         if self.detector else ""))
        return "\n".join([line, *(f"  note: {n}" for n in self.notes)])

    def __repr__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())


@dataclasses.dataclass(frozen=True)
class MouthAudioLag:
    """How the mouth opening follows the speech envelope, frame by frame.

    Attributes:
        lag_frames: The lag of the correlation peak in video frames (40 ms); positive = the sound comes later
            than the mouth. ``mouth[t]`` pairs best with ``envelope[t + lag]``.
        peak_correlation: Pearson correlation at that lag, in [-1, 1] (of the high-passed signals).
        peak_to_sidelobe: ``(peak - mean(sidelobes)) / std(sidelobes)`` over the lags more than 2 frames from
            the peak: how much the peak stands out.
        z_score: ``atanh(peak) * sqrt(n_eff - 3)``, with ``n_eff`` the frame count reduced for the two signals'
            autocorrelation (Bartlett): about 0 for unrelated signals.
        reliable: ``z_score >= 3.5`` (a chance peak among 31 lags reaches it about 5 % of the time) and a
            positive peak.
        lags: (2 * max_lag + 1,) int, the lags searched, ascending.
        correlations: (2 * max_lag + 1,) float64, the correlation at each lag.
        mouth: (N,) float64, inner-lip opening per frame divided by the outer-eye-corner distance (NaN where no
            face was found).
        envelope: (N,) float64, the speech envelope per video frame in dB (log RMS, floored 60 dB below its
            loudest frame).
        fps: Frames per second of both curves (25).
        n_frames: N.
        backend: The landmark backend used.
    """

    lag_frames: int
    peak_correlation: float
    peak_to_sidelobe: float
    z_score: float
    reliable: bool
    lags: np.ndarray
    correlations: np.ndarray
    mouth: np.ndarray
    envelope: np.ndarray
    fps: int = FPS
    n_frames: int = 0
    backend: str = ""

    def summary(self) -> str:
        """One line: the lag in frames and ms, and the confidence figures."""
        ms = 1000 * self.lag_frames / self.fps
        verdict = "reliable" if self.reliable else "NOT reliable: the mouth and the voice barely co-vary"
        return (f"mouth-audio lag {self.lag_frames:+d} frames ({ms:+.0f} ms; + = sound after mouth): peak r "
                f"{self.peak_correlation:.3f}, peak/sidelobe {self.peak_to_sidelobe:.1f}, z {self.z_score:.1f} "
                f"({verdict}); {self.n_frames} frames" + (f", landmarks from {self.backend}" if self.backend else ""))

    def __repr__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())

    def _repr_png_(self) -> bytes:
        from .ui import plot_sync

        return plot_sync(self).png()


# ---------------------------------------------------------------------------------------------------------------
# Audio features (numpy only)
# ---------------------------------------------------------------------------------------------------------------

def _hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    return 2595.0 * np.log10(1.0 + np.asarray(hz, dtype=np.float64) / 700.0)


def _mel_to_hz(mel: np.ndarray | float) -> np.ndarray:
    return 700.0 * (10.0 ** (np.asarray(mel, dtype=np.float64) / 2595.0) - 1.0)


def _mel_filters(sample_rate: int) -> np.ndarray:
    """(26, 257) triangular filters on FFT bins ``floor((nfft + 1) * f / sr)`` of 26 + 2 mel-spaced edges."""
    edges = np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2.0), MFCC_FILTERS + 2)
    bins = np.floor((MFCC_NFFT + 1) * _mel_to_hz(edges) / sample_rate)
    fb = np.zeros((MFCC_FILTERS, MFCC_NFFT // 2 + 1))
    for j in range(MFCC_FILTERS):
        lo, mid, hi = bins[j], bins[j + 1], bins[j + 2]
        for i in range(int(lo), int(mid)):
            fb[j, i] = (i - lo) / (mid - lo)
        for i in range(int(mid), int(hi)):
            fb[j, i] = (hi - i) / (hi - mid)
    return fb


def _dct2_ortho(n: int, keep: int) -> np.ndarray:
    """(n, keep) matrix of the orthonormal DCT-II: ``x @ M`` = ``scipy.fft.dct(x, type=2, norm='ortho')[:keep]``."""
    k = np.arange(keep)[None, :]
    i = np.arange(n)[:, None]
    m = np.cos(np.pi * k * (2 * i + 1) / (2 * n)) * np.sqrt(2.0 / n)
    m[:, 0] /= np.sqrt(2.0)
    return m


def mfcc(waveform: np.ndarray, sample_rate: int = SAMPLE_RATE, *, int16_scale: bool = True) -> np.ndarray:
    """13 MFCCs at 100 Hz, as ``python_speech_features.mfcc(signal, sample_rate)`` computes them by default.

    Steps: pre-emphasis 0.97; frames of 25 ms every 10 ms, the last one zero-padded (``1 + ceil((L - 400) / 160)``
    frames at 16 kHz), rectangular window; power spectrum ``|rfft_512|^2 / 512``; 26 triangular mel filters from
    0 Hz to ``sr / 2``; log; orthonormal DCT-II, first 13; sinusoidal lifter 22; coefficient 0 replaced by the
    log of the frame's total power. Zero energies become float64 eps before the log.

    Args:
        waveform: (L,) mono samples. Float samples in [-1, 1] are multiplied by 32768 and rounded to int16 when
            ``int16_scale`` (the protocol reads 16-bit PCM: coefficient 0 depends on the scale, and digital silence
            must stay exactly 0); int16 arrays are used as they are.
        sample_rate: Hz (16000 in the protocol).
        int16_scale: Scale float input to the int16 range (default True).

    Returns:
        (13, T) float32, T = number of 10 ms frames.

    Raises:
        InputError: Not a 1-D array, empty, or a bad sample rate.

    Source: syncnet_python SyncNetInstance.py (``python_speech_features.mfcc(audio, sample_rate)`` on the
    ``wavfile.read`` int16 samples); python_speech_features 0.6 ``base.mfcc``/``fbank``, ``sigproc.framesig``.
    """
    x = np.asarray(waveform)
    if x.ndim != 1 or x.size == 0:
        raise InputError(f"waveform must be a non-empty 1-D array of samples; got shape {x.shape}.")
    if not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise InputError(f"sample_rate must be a positive integer in Hz; got {sample_rate!r}.")
    if np.issubdtype(x.dtype, np.floating) and int16_scale:  # quantised as ffmpeg's pcm_s16le: digital silence
        x = np.clip(np.round(x.astype(np.float64) * INT16_SCALE), -INT16_SCALE, INT16_SCALE - 1)  # stays 0
    else:
        x = x.astype(np.float64)
    x = np.append(x[0], x[1:] - MFCC_PREEMPH * x[:-1])
    win = int(math.floor(MFCC_WIN_S * sample_rate + 0.5))  # round half up, as sigproc.round_half_up
    hop = int(math.floor(MFCC_HOP_S * sample_rate + 0.5))
    n = x.shape[0]
    count = 1 if n <= win else 1 + int(math.ceil((n - win) / hop))
    padded = np.zeros((count - 1) * hop + win)
    padded[:n] = x
    idx = np.arange(win)[None, :] + hop * np.arange(count)[:, None]
    frames = padded[idx]
    power = np.abs(np.fft.rfft(frames, MFCC_NFFT)) ** 2 / MFCC_NFFT
    eps = np.finfo(float).eps
    energy = power.sum(axis=1)
    energy = np.where(energy == 0, eps, energy)
    feat = power @ _mel_filters(int(sample_rate)).T
    feat = np.where(feat == 0, eps, feat)
    cep = np.log(feat) @ _dct2_ortho(MFCC_FILTERS, MFCC_COEFFS)
    cep *= 1.0 + (MFCC_LIFTER / 2.0) * np.sin(np.pi * np.arange(MFCC_COEFFS) / MFCC_LIFTER)
    cep[:, 0] = np.log(energy)
    return np.ascontiguousarray(cep.T, dtype=np.float32)


# ---------------------------------------------------------------------------------------------------------------
# The offset search (numpy only): the heart of the protocol, testable with any embeddings
# ---------------------------------------------------------------------------------------------------------------

def score_embeddings(video_embeddings: np.ndarray, audio_embeddings: np.ndarray, vshift: int = VSHIFT, *,
                     detector: str = "", notes: Sequence[str] = ()) -> SyncScore:
    """LSE-D, LSE-C and the offset from per-window embeddings, exactly as syncnet_python computes them.

    For each video window ``i`` and each ``j`` in ``0..2*vshift``, the distance ``||v_i - a_{i+j-vshift} +
    1e-6||_2`` (torch's ``pairwise_distance``), where audio embeddings outside ``0..W-1`` are zero vectors (the
    published code zero-pads). The mean over ``i`` gives one distance per offset; LSE-D is its minimum at index
    ``j*``, the offset is ``vshift - j*``, LSE-C is ``median - minimum`` (torch's median: the lower middle value
    of the 2*vshift+1 values).

    Args:
        video_embeddings: (W, D) float, one per 5-frame window (window ``i`` starts at frame ``i``).
        audio_embeddings: (W, D) float, one per 20-step MFCC window (window ``i`` starts at MFCC step ``4 i``).
        vshift: Largest offset searched, frames (15 in the published evaluation).
        detector: Recorded in the result.
        notes: Recorded in the result.

    Returns:
        A :class:`SyncScore`.

    Raises:
        InputError: Shapes that differ or are not 2-D, no windows, or a negative vshift.

    Source: syncnet_python SyncNetInstance.py ``calc_pdist`` and ``evaluate`` (``mdist = mean(stack(dists, 1), 1)``,
    ``offset = vshift - minidx``, ``conf = median(mdist) - minval``); run_syncnet.py (vshift 15).
    """
    v = np.asarray(video_embeddings, dtype=np.float64)
    a = np.asarray(audio_embeddings, dtype=np.float64)
    if v.ndim != 2 or a.ndim != 2 or v.shape != a.shape:
        raise InputError(f"video and audio embeddings must both be (W, D) with the same shape; got {v.shape} and "
                         f"{a.shape}.")
    if v.shape[0] == 0:
        raise InputError("no windows to compare: the clip needs at least 6 frames (and 0.24 s of audio).")
    if not isinstance(vshift, (int, np.integer)) or vshift < 0:
        raise InputError(f"vshift must be a non-negative integer (frames); got {vshift!r}.")
    w = v.shape[0]
    padded = np.concatenate([np.zeros((vshift, a.shape[1])), a, np.zeros((vshift, a.shape[1]))])
    span = 2 * vshift + 1
    dists = np.empty((w, span))
    for i in range(w):
        dists[i] = np.linalg.norm(v[i][None, :] - padded[i:i + span] + PAIRWISE_EPS, axis=1)
    mean = dists.mean(axis=0)
    j = int(np.argmin(mean))  # the first minimum, as torch.min on CPU
    lower_median = float(np.sort(mean)[(span - 1) // 2])
    return SyncScore(lse_d=float(mean[j]), lse_c=lower_median - float(mean[j]), offset_frames=int(vshift - j),
                     offsets=vshift - np.arange(span), mean_distances=mean, frame_distances=dists[:, j].copy(),
                     n_windows=w, detector=detector, notes=tuple(notes))


# ---------------------------------------------------------------------------------------------------------------
# Face boxes and crops (numpy only)
# ---------------------------------------------------------------------------------------------------------------

def _medfilt(x: np.ndarray, kernel: int) -> np.ndarray:
    """``scipy.signal.medfilt``: centred median with zero padding at both ends (odd kernel)."""
    half = kernel // 2
    padded = np.concatenate([np.zeros(half), x, np.zeros(half)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel)
    return np.median(windows, axis=1)


def smooth_face_boxes(boxes: np.ndarray) -> np.ndarray:
    """Crop squares per frame from face boxes, as the published pipeline smooths them.

    Missing frames (NaN rows) are filled by linear interpolation between the nearest detections (runs of more
    than 25 frames cannot be bridged); then the half-size ``s = max(w, h) / 2`` and the centre ``(x, y)`` are
    median-filtered over 13 frames (zero padding at the ends, as ``scipy.signal.medfilt``).

    Args:
        boxes: (N, 4) float ``(x1, y1, x2, y2)`` pixels, NaN rows where no face was found.

    Returns:
        (N, 3) float64 ``(s, x, y)``: half-size and centre in pixels.

    Raises:
        InputError: Wrong shape, no face in any frame, or a gap of more than 25 frames without a face.

    Source: syncnet_python run_pipeline.py ``track_shot`` (``interp1d`` over the track, ``num_failed_det`` 25) and
    ``crop_video`` (``medfilt(kernel_size=13)``).
    """
    b = np.asarray(boxes, dtype=np.float64)
    if b.ndim != 2 or b.shape[1] != 4 or b.shape[0] == 0:
        raise InputError(f"boxes must be (N, 4) (x1, y1, x2, y2); got shape {b.shape}.")
    found = np.isfinite(b).all(axis=1)
    if not found.any():
        from .errors import NoFaceError

        raise NoFaceError(f"no face found in any of the {b.shape[0]} frames; SyncNet needs the face in view. Pass "
                          "boxes= (x1, y1, x2, y2) to give the face box yourself.")
    idx = np.flatnonzero(found)
    gaps = np.diff(np.concatenate([[-1], idx, [b.shape[0]]])) - 1
    if gaps.max() > MAX_MISSED_FRAMES:
        raise InputError(f"the face is missing for {int(gaps.max())} frames in a row (more than "
                         f"{MAX_MISSED_FRAMES}); the published protocol scores one continuous face track. Trim the "
                         "clip to the part with the face, or pass boxes=.")
    t = np.arange(b.shape[0])
    filled = np.stack([np.interp(t, idx, b[idx, k]) for k in range(4)], axis=1)
    s = np.maximum(filled[:, 3] - filled[:, 1], filled[:, 2] - filled[:, 0]) / 2.0
    cx = (filled[:, 0] + filled[:, 2]) / 2.0
    cy = (filled[:, 1] + filled[:, 3]) / 2.0
    return np.stack([_medfilt(s, SMOOTH_KERNEL), _medfilt(cx, SMOOTH_KERNEL), _medfilt(cy, SMOOTH_KERNEL)], axis=1)


def protocol_crops(frames: np.ndarray, squares: np.ndarray) -> np.ndarray:
    """Cut the 224x224 SyncNet face crops: the box widened by 40 % each side and 80 % below, grey-padded.

    For half-size ``s`` and centre ``(x, y)``: rows ``y - s`` to ``y + 1.8 s``, columns ``x - 1.4 s`` to
    ``x + 1.4 s`` of the frame padded with ``int(1.8 s)`` pixels of grey 110 (indices truncated to int as the
    published code does), resized to 224x224 with bilinear interpolation (cv2.INTER_LINEAR).

    Args:
        frames: (n, H, W, 3) uint8 BGR.
        squares: (n, 3) float ``(s, x, y)`` from :func:`smooth_face_boxes`.

    Returns:
        (n, 224, 224, 3) uint8 BGR.

    Raises:
        InputError: Shapes that do not match.

    Source: syncnet_python run_pipeline.py ``crop_video`` (crop_scale 0.4).
    """
    import cv2

    frames = np.asarray(frames)
    squares = np.asarray(squares, dtype=np.float64)
    if frames.ndim != 4 or frames.shape[-1] != 3 or squares.shape != (frames.shape[0], 3):
        raise InputError(f"frames must be (n, H, W, 3) and squares (n, 3); got {frames.shape} and {squares.shape}.")
    out = np.empty((frames.shape[0], CROP_SIDE, CROP_SIDE, 3), np.uint8)
    cs = CROP_SCALE
    for k, (frame, (s, x, y)) in enumerate(zip(frames, squares, strict=True)):
        pad = int(s * (1 + 2 * cs))
        padded = cv2.copyMakeBorder(frame, pad, pad, pad, pad, cv2.BORDER_CONSTANT,
                                    value=(CROP_PAD_VALUE,) * 3)
        my, mx = y + pad, x + pad
        face = padded[int(my - s):int(my + s * (1 + 2 * cs)), int(mx - s * (1 + cs)):int(mx + s * (1 + cs))]
        if face.size == 0:
            raise InputError(f"frame {k}: the face box (half-size {s:.1f} px at ({x:.0f}, {y:.0f})) gives an empty "
                             "crop; check the boxes.")
        out[k] = cv2.resize(face, (CROP_SIDE, CROP_SIDE), interpolation=cv2.INTER_LINEAR)
    return out


# ---------------------------------------------------------------------------------------------------------------
# SyncNet v2 (torch, built on first use)
# ---------------------------------------------------------------------------------------------------------------

@runtime_checkable
class SyncEmbedder(Protocol):
    """What :func:`sync_score` needs from a model: one embedding per video window and per audio window.

    ``embed_video(stacks)``: (B, 3, 5, 224, 224) float32 BGR 0..255 (channels, time, rows, columns) -> (B, D).
    ``embed_audio(windows)``: (B, 1, 13, 20) float32 MFCC windows -> (B, D). Both return numpy float arrays.
    """

    def embed_video(self, stacks: np.ndarray) -> np.ndarray: ...

    def embed_audio(self, windows: np.ndarray) -> np.ndarray: ...


_CLASSES: dict[str, Any] = {}


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a core dependency
        raise MissingDependencyError(f"SyncNet needs torch ({exc}). Install it with:\n    {INSTALL_TORCH}") from exc
    return torch


def _build_classes() -> dict[str, Any]:
    if _CLASSES:
        return _CLASSES
    torch = _import_torch()
    from torch import nn

    def conv_bn(conv: Any, channels: int, bn: Any, pool: Any = None) -> list[Any]:
        layers = [conv, bn(channels), nn.ReLU(inplace=True)]
        return layers + ([pool] if pool is not None else [])

    class SyncNetV2(nn.Module):
        """SyncNet v2, the model of ``syncnet_v2.model``: an audio and a lip stream, 1024-d embeddings each.

        Layer order and indices are those of the published ``SyncNetModel.S`` so the checkpoint's names
        (``netcnnaud.0.weight`` ... ``netcnnlip.19.running_var``) load unchanged:

        - ``netcnnaud`` (MFCC (B, 1, 13, 20) -> (B, 512, 1, 1)): conv 3x3 64, BN, ReLU, max-pool 1x1; conv 3x3 192,
          BN, ReLU, max-pool 3x3 stride (1, 2); conv 3x3 384, BN, ReLU; conv 3x3 256, BN, ReLU; conv 3x3 256, BN,
          ReLU, max-pool 3x3 stride 2; conv (5, 4) 512 no padding, BN, ReLU.
        - ``netfcaud`` / ``netfclip``: linear 512->512, BN1d, ReLU, linear 512->1024.
        - ``netcnnlip`` (frames (B, 3, 5, 224, 224) -> (B, 512, 1, 1, 1)): conv3d (5, 7, 7) 96 stride (1, 2, 2),
          BN, ReLU, max-pool (1, 3, 3) stride (1, 2, 2); conv3d (1, 5, 5) 256 stride (1, 2, 2) padding (0, 1, 1),
          BN, ReLU, max-pool (1, 3, 3) stride (1, 2, 2) padding (0, 1, 1); three conv3d (1, 3, 3) 256 padding
          (0, 1, 1) with BN and ReLU, max-pool (1, 3, 3) stride (1, 2, 2) after the third; conv3d (1, 6, 6) 512,
          BN, ReLU.

        Source: syncnet_python SyncNetModel.py (class ``S``, ``num_layers_in_fc_layers=1024``).
        """

        def __init__(self, embedding: int = 1024):
            super().__init__()
            c2, b2, p2 = nn.Conv2d, nn.BatchNorm2d, nn.MaxPool2d
            self.netcnnaud = nn.Sequential(
                *conv_bn(c2(1, 64, (3, 3), (1, 1), (1, 1)), 64, b2, p2((1, 1), (1, 1))),
                *conv_bn(c2(64, 192, (3, 3), (1, 1), (1, 1)), 192, b2, p2((3, 3), (1, 2))),
                *conv_bn(c2(192, 384, (3, 3), padding=(1, 1)), 384, b2),
                *conv_bn(c2(384, 256, (3, 3), padding=(1, 1)), 256, b2),
                *conv_bn(c2(256, 256, (3, 3), padding=(1, 1)), 256, b2, p2((3, 3), (2, 2))),
                *conv_bn(c2(256, 512, (5, 4), padding=(0, 0)), 512, b2),
            )
            self.netfcaud = nn.Sequential(nn.Linear(512, 512), nn.BatchNorm1d(512), nn.ReLU(),
                                          nn.Linear(512, embedding))
            self.netfclip = nn.Sequential(nn.Linear(512, 512), nn.BatchNorm1d(512), nn.ReLU(),
                                          nn.Linear(512, embedding))
            c3, b3, p3 = nn.Conv3d, nn.BatchNorm3d, nn.MaxPool3d
            self.netcnnlip = nn.Sequential(
                *conv_bn(c3(3, 96, (5, 7, 7), (1, 2, 2), 0), 96, b3, p3((1, 3, 3), (1, 2, 2))),
                *conv_bn(c3(96, 256, (1, 5, 5), (1, 2, 2), (0, 1, 1)), 256, b3, p3((1, 3, 3), (1, 2, 2), (0, 1, 1))),
                *conv_bn(c3(256, 256, (1, 3, 3), padding=(0, 1, 1)), 256, b3),
                *conv_bn(c3(256, 256, (1, 3, 3), padding=(0, 1, 1)), 256, b3),
                *conv_bn(c3(256, 256, (1, 3, 3), padding=(0, 1, 1)), 256, b3, p3((1, 3, 3), (1, 2, 2))),
                *conv_bn(c3(256, 512, (1, 6, 6), padding=0), 512, b3),
            )

        def forward_aud(self, x: Any) -> Any:
            """(B, 1, 13, 20) MFCC windows -> (B, 1024) audio embeddings."""
            mid = self.netcnnaud(x)
            return self.netfcaud(mid.reshape(mid.shape[0], -1))

        def forward_lip(self, x: Any) -> Any:
            """(B, 3, 5, 224, 224) BGR 0..255 -> (B, 1024) video embeddings."""
            mid = self.netcnnlip(x)
            return self.netfclip(mid.reshape(mid.shape[0], -1))

    class TorchEmbedder:
        """A :class:`SyncEmbedder` over a :class:`SyncNetV2` on one device, inference mode, eval BN."""

        def __init__(self, net: Any, device: Any):
            self.net = net.eval()
            self.device = device

        def _run(self, fn: Any, x: np.ndarray) -> np.ndarray:
            with torch.inference_mode():
                t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device)
                return fn(t).float().cpu().numpy()

        def embed_video(self, stacks: np.ndarray) -> np.ndarray:
            return self._run(self.net.forward_lip, stacks)

        def embed_audio(self, windows: np.ndarray) -> np.ndarray:
            return self._run(self.net.forward_aud, windows)

        def __repr__(self) -> str:
            return f"SyncNetV2 embedder on {self.device}"

    _CLASSES.update(SyncNetV2=SyncNetV2, TorchEmbedder=TorchEmbedder)
    return _CLASSES


def __getattr__(name: str) -> Any:
    if name == "SyncNetV2":
        return _build_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _download_hint() -> str:
    from .weights import DOWNLOAD_COMMAND

    return f"{DOWNLOAD_COMMAND} --sets quality"


def load_syncnet(weights_dir: str | os.PathLike | None = None, device: str | None = None) -> Any:
    """Build SyncNet v2 and load ``syncnet/syncnet_v2.model`` unchanged; returns a :class:`SyncEmbedder`.

    Loading goes through :func:`nbhelpers.models.load_checkpoint`: the file is inspected first (web pages, git-lfs
    pointers and cut-off files are refused) and read with ``torch.load(weights_only=True)``, which unpickles
    tensors and plain containers only. The published file is a state dict (syncnet_python's ``loadParameters``
    iterates ``loaded_state.items()`` and copies each tensor into the model; current syncnet_python and
    LatentSync load it with ``weights_only=True``), so no code is ever unpickled from it. Only if a file were a
    full pickle would ``load_checkpoint`` unpickle it, and then only when its sha256 equals the one the hub
    reported at download time; a non-state-dict result is refused. The checkpoint may come from torch < 0.4.1
    without BatchNorm ``num_batches_tracked`` entries (unused in eval mode); they are then kept at 0.

    Args:
        weights_dir: The weights dir; None = :func:`nbhelpers.weights.default_dir`.
        device: ``"cuda"``, ``"cpu"``...; None = CUDA when available.

    Returns:
        A :class:`SyncEmbedder` (``embed_video``, ``embed_audio``) wrapping the network in eval mode, float32.

    Raises:
        WeightsError: The file is missing (the message gives the download command) or unreadable.
        CheckpointError: Names or shapes differ from SyncNet v2's.

    Source: syncnet_python SyncNetInstance.py ``loadParameters``; download_model.sh (``syncnet_v2.model``).
    """
    torch = _import_torch()
    from . import models, weights

    root = Path(weights_dir).expanduser() if weights_dir is not None else weights.default_dir()
    path = root / SYNCNET_FILE
    if not path.is_file():
        raise WeightsError(f"the SyncNet weights are missing: {path}. LSE-D/LSE-C need the optional 'quality' "
                           f"weight set (about 52 MB): run `{_download_hint()}` (or pass weights_dir= the folder "
                           "that holds syncnet/syncnet_v2.model). mouth_audio_lag needs no weights.")
    exp = weights.expected_facts(root, "syncnet-v2")
    state = models.load_checkpoint(path, trusted_sha256=exp.sha256, expected_size=None, mmap=False)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict of SyncNet v2 parameters; "
                              f"delete it and run `{_download_hint()}`.")
    with torch.device("meta"):
        net = _build_classes()["SyncNetV2"]()
    state = dict(state)
    for key, value in net.state_dict().items():
        if key.endswith("num_batches_tracked") and key not in state:
            state[key] = torch.zeros((), dtype=value.dtype)
    models.check_state_dict(net, state, path, "SyncNet v2")
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    net = _build_classes()["SyncNetV2"]()
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=True)
    return _build_classes()["TorchEmbedder"](net.to(dev), dev)


def write_tiny_syncnet(directory: str | os.PathLike, *, seed: int = 0, legacy: bool = True) -> Path:
    """Write ``<directory>/syncnet/syncnet_v2.model``: random weights in the published architecture and format.

    SyncNet v2 is small (13.6 M parameters, about 52 MB), so this is the real network. The file is a plain state
    dict without ``num_batches_tracked`` (as a pre-0.4.1 torch saved it), in the legacy (non-zip) torch format by
    default, the format of a 2018 file.

    Args:
        directory: The weights dir.
        seed: Seed of the random weights.
        legacy: Write the legacy pickle format (``_use_new_zipfile_serialization=False``); False = zip format.

    Returns:
        The path written (under a temporary name, then renamed).

    Source: syncnet_python SyncNetModel.py (the architecture), download_model.sh (the file name).
    """
    torch = _import_torch()
    torch.manual_seed(int(seed))
    net = _build_classes()["SyncNetV2"]()
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    out = Path(directory) / SYNCNET_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    torch.save(state, str(tmp), _use_new_zipfile_serialization=not legacy)
    os.replace(tmp, out)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------

def _is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def _audio_samples(video: Any, audio: Any) -> np.ndarray:
    """16 kHz float32 mono samples from ``audio`` (a path or an array), else from the video file's sound."""
    from . import media

    if audio is None:
        if not _is_path(video):
            raise InputError("audio is None but video is an array of frames, which carries no sound: pass audio= "
                             "a speech file or a 16 kHz waveform.")
        return media.load_audio(video)
    if _is_path(audio):
        return media.load_audio(audio)
    arr = np.asarray(audio)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.number):
        raise InputError(f"audio must be a path or a 1-D 16 kHz waveform; got shape {arr.shape}, dtype {arr.dtype}.")
    return arr.astype(np.float32) if np.issubdtype(arr.dtype, np.floating) else arr.astype(np.float32) / INT16_SCALE


def _check_video(video: Any) -> None:
    if _is_path(video):
        if not Path(video).is_file():
            raise InputError(f"video {str(video)!r} does not exist; give the path of a clip with the face in view.")
        return
    arr = np.asarray(video) if not hasattr(video, "iter_batches") else None
    if arr is not None and (arr.ndim != 4 or arr.shape[-1] != 3 or arr.dtype != np.uint8):
        raise InputError(f"video must be a path or (N, H, W, 3) uint8 BGR frames; got shape {arr.shape}, dtype "
                         f"{arr.dtype}.")


def _frame_batches(video: Any, batch: int = 32):
    """Yield (n, H, W, 3) uint8 BGR batches of a path (at 25 fps) or an array."""
    from . import media

    if _is_path(video):
        with media.load_video(video) as reader:
            yield from reader.iter_batches(batch)
        return
    arr = np.asarray(video)
    for i in range(0, arr.shape[0], batch):
        yield arr[i:i + batch]


# ---------------------------------------------------------------------------------------------------------------
# sync_score
# ---------------------------------------------------------------------------------------------------------------

def _detect_boxes(video: Any, detector: str, weights_dir: Any, device: Any) -> tuple[np.ndarray, str, list[str]]:
    """(N, 4) face boxes (NaN rows for none) from S3FD at scale 0.25 (score > 0.9) or a landmark backend."""
    notes: list[str] = []
    rows: list[np.ndarray] = []
    from . import weights

    root = Path(weights_dir).expanduser() if weights_dir is not None else weights.default_dir()
    if detector == "auto":
        from .faces.registry import S3FD_FILE

        detector = "s3fd" if (root / S3FD_FILE).is_file() else "dlib"
        if detector == "dlib":
            notes.append(f"face boxes from dlib because {root / S3FD_FILE} is missing (the protocol uses S3FD; "
                         "LSE values can differ slightly): `python -m nbhelpers download --sets s3fd`")
    if detector == "s3fd":
        from .faces.registry import S3FD_FILE
        from .faces.s3fd import S3FD

        net = S3FD(root / S3FD_FILE, device=device)
        try:
            for batch in _frame_batches(video, 16):
                side = max(1, round(max(batch.shape[1:3]) * FACEDET_SCALE))
                for dets in net.detections(batch, max_side=max(64, side)):
                    keep = dets[dets[:, 4] > FACEDET_MIN_SCORE]
                    rows.append(keep[0, :4] if len(keep) else np.full(4, np.nan))
        finally:
            net.close()
        return np.asarray(rows, dtype=np.float64).reshape(-1, 4), "s3fd", notes
    from .faces import get_backend

    backend = get_backend(detector, weights_dir=weights_dir, device=device)
    try:
        for batch in _frame_batches(video, 16):
            for found in backend.detect(batch):
                rows.append(np.full(4, np.nan) if found is None else np.asarray(found.face_box, dtype=np.float64))
    finally:
        backend.close()
    if getattr(backend, "name", detector) != "s3fd":
        notes.append(f"face boxes from {backend.name}, not S3FD: LSE values may differ slightly from published ones")
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4), str(getattr(backend, "name", detector)), notes


def _given_boxes(boxes: Any, n_frames: int | None) -> np.ndarray:
    """(N, 4) float boxes from ``boxes=``: one box repeated over the ``n_frames`` frames, or one row per frame
    (rows of -1 become NaN, no face)."""
    b = np.asarray(boxes, dtype=np.float64)
    if b.shape == (4,):
        if n_frames is None:
            raise InputError("one box for the clip needs the frame count; pass one box per frame instead.")
        return np.tile(b, (n_frames, 1))
    if b.ndim != 2 or b.shape[1] != 4:
        raise InputError(f"boxes must be one (x1, y1, x2, y2) or (N, 4) per frame; got shape {b.shape}.")
    b = b.copy()
    b[(b < 0).all(axis=1)] = np.nan  # rows of -1 mean "no face", as in FaceTrack
    return b


def _frame_count(video: Any) -> int:
    if _is_path(video):
        from . import media

        with media.load_video(video) as reader:
            return int(reader.frame_count)
    return int(np.asarray(video).shape[0])


def sync_score(video: Any, audio: Any = None, *, model: SyncEmbedder | None = None,
               weights_dir: str | os.PathLike | None = None, detector: str = "auto", boxes: Any = None,
               device: str | None = None, vshift: int = VSHIFT, batch_size: int = BATCH_WINDOWS) -> SyncScore:
    """LSE-D, LSE-C and the AV offset of a clip with SyncNet v2, following the published evaluation protocol.

    Steps (syncnet_python run_pipeline.py + SyncNetInstance.py, as Wav2Lip and LatentSync evaluate):

    1. Face boxes: S3FD on each frame scaled by 0.25, the best face with score > 0.9 (or ``boxes=``, or a
       landmark backend's face box); gaps of up to 25 frames interpolated; size and centre median-filtered over
       13 frames (:func:`smooth_face_boxes`).
    2. Crops: 224x224 BGR with 40 % margin, more below the chin (:func:`protocol_crops`).
    3. Audio: 16 kHz mono at int16 scale, 13 MFCCs at 100 Hz (:func:`mfcc`).
    4. ``min(N, floor(L / 640)) - 5`` windows (the published count, one short of what would fit): window ``i``
       holds frames ``i..i+4`` and MFCC steps ``4i..4i+19``; each gets a 1024-d embedding from ``model``.
    5. :func:`score_embeddings` over offsets -vshift..+vshift.

    Departures from the published pipeline (none changes the maths): frames are decoded straight from the
    video at 25 fps instead of through JPEG files and an XVID/MP4V re-encode of the crops; there is no scene
    cut detection or multi-person tracking (the clip is one shot of one face, as lip-sync output is); the
    100-frame minimum track length is not enforced (short clips are scored, with fewer windows).

    Args:
        video: A video path (decoded at 25 fps) or (N, H, W, 3) uint8 BGR frames at 25 fps.
        audio: A speech file, a (L,) 16 kHz waveform (float in [-1, 1], or int16), or None for the video's sound.
        model: A :class:`SyncEmbedder`; None loads SyncNet v2 from ``weights_dir`` (:func:`load_syncnet`).
        weights_dir: The weights dir (SyncNet and S3FD files); None = the default.
        detector: ``"auto"`` (S3FD when its weights are present, else dlib with a note), ``"s3fd"``, or a landmark
            backend name (``"dlib"``, ``"dwpose-onnx"``...). Ignored when ``boxes`` is given.
        boxes: Face boxes instead of detection: one ``(x1, y1, x2, y2)`` for the clip (bare, or a list holding
            just it) or (N, 4) per frame (rows of NaN or -1 = no face), full-frame pixels.
        device: Device of the models; None = CUDA when available.
        vshift: Largest offset searched, frames (15 published).
        batch_size: Windows per model call (20 published).

    Returns:
        A :class:`SyncScore`.

    Raises:
        InputError: A bad video, audio, boxes or argument, or a clip shorter than 6 frames / 0.24 s of audio.
        NoFaceError: No face in any frame.
        WeightsError: ``model`` is None and the SyncNet (or S3FD) weights are missing: the message names
            ``python -m nbhelpers download --sets quality``.

    Source: syncnet_python run_pipeline.py, SyncNetInstance.py ``evaluate``, run_syncnet.py; Wav2Lip
    evaluation/README.md and LatentSync eval/syncnet (LSE-D = min distance, LSE-C = confidence).
    """
    _check_video(video)
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InputError(f"batch_size must be a positive integer (windows); got {batch_size!r}.")
    if not isinstance(vshift, (int, np.integer)) or vshift < 0:
        raise InputError(f"vshift must be a non-negative integer (frames); got {vshift!r}.")
    samples = _audio_samples(video, audio)  # checked before any model loads
    embedder = model if model is not None else load_syncnet(weights_dir, device)
    if not isinstance(embedder, SyncEmbedder):
        raise InputError(f"model must have embed_video(stacks) and embed_audio(windows); got {type(model).__name__}.")

    notes: list[str] = []
    if boxes is not None:
        from .faces.boxes import single_box

        # one box for the clip: bare, or a list or (1, 4) array holding just it, as for the lip-sync jobs
        one = single_box(boxes)
        face_boxes = _given_boxes(boxes, None) if one is None else _given_boxes(one, _frame_count(video))
        used = "boxes"
    else:
        face_boxes, used, notes = _detect_boxes(video, detector, weights_dir, device)
    squares = smooth_face_boxes(face_boxes)
    n_frames = squares.shape[0]

    cc = mfcc(samples, SAMPLE_RATE)
    n = min(n_frames, samples.shape[0] // SAMPLES_PER_FRAME)
    n_windows = n - STACK_FRAMES
    if n_windows < 1:
        raise InputError(f"the clip is too short to score: {n_frames} frames and {samples.shape[0] / SAMPLE_RATE:.2f}"
                         f" s of audio give {max(0, n_windows)} windows; SyncNet needs at least 6 frames and 0.24 s.")
    if abs(n_frames / FPS - samples.shape[0] / SAMPLE_RATE) > 1.0 / FPS:
        notes.append(f"video ({n_frames / FPS:.2f} s) and audio ({samples.shape[0] / SAMPLE_RATE:.2f} s) lengths "
                     f"differ; the first {n / FPS:.2f} s are scored")
    need = MFCC_PER_FRAME * (n_windows - 1) + MFCC_WINDOW
    if cc.shape[1] < need:  # cannot happen for L >= 640 n samples; kept as a guard
        cc = np.pad(cc, ((0, 0), (0, need - cc.shape[1])))

    # Crops for frames 0..n-1, kept as uint8 (224*224*3 bytes a frame), then windows in batches.
    crops = np.empty((n, CROP_SIDE, CROP_SIDE, 3), np.uint8)
    start = 0
    for batch in _frame_batches(video, 32):
        if start >= n:
            break
        take = batch[: n - start]
        crops[start:start + take.shape[0]] = protocol_crops(take, squares[start:start + take.shape[0]])
        start += take.shape[0]
    if start < n:
        raise InputError(f"the video gave {start} frames, fewer than the {n} counted; it may be damaged.")

    video_emb, audio_emb = [], []
    for i in range(0, n_windows, batch_size):
        idx = range(i, min(n_windows, i + batch_size))
        stacks = np.stack([crops[v:v + STACK_FRAMES] for v in idx]).astype(np.float32)  # (B, 5, 224, 224, 3)
        stacks = stacks.transpose(0, 4, 1, 2, 3)  # (B, 3, 5, 224, 224), BGR channels as cv2 reads them
        windows = np.stack([cc[:, MFCC_PER_FRAME * v:MFCC_PER_FRAME * v + MFCC_WINDOW] for v in idx])[:, None]
        video_emb.append(np.asarray(embedder.embed_video(stacks), dtype=np.float64))
        audio_emb.append(np.asarray(embedder.embed_audio(windows), dtype=np.float64))
    return score_embeddings(np.concatenate(video_emb), np.concatenate(audio_emb), vshift, detector=used, notes=notes)


# ---------------------------------------------------------------------------------------------------------------
# mouth_audio_lag (no weights)
# ---------------------------------------------------------------------------------------------------------------

def mouth_opening(landmarks: np.ndarray) -> np.ndarray:
    """Inner-lip opening per frame in face-size units.

    The mean vertical gap between the three upper and lower inner-lip points (iBUG 68, 0-based: 61-67, 62-66,
    63-65) divided by the distance between the outer eye corners (36, 45), which does not change as the mouth
    opens and scales with the face.

    Args:
        landmarks: (N, 68, 2) float ``(x, y)`` pixels, NaN for frames with no face.

    Returns:
        (N,) float64, typically 0 (closed) to about 0.5 (wide open); NaN where the landmarks are NaN.

    Raises:
        InputError: Not (N, 68, 2).

    Source: none in MuseTalk; the iBUG 300-W point order (inner lip 60-67).
    """
    lm = np.asarray(landmarks, dtype=np.float64)
    if lm.ndim != 3 or lm.shape[1:] != (68, 2):
        raise InputError(f"landmarks must be (N, 68, 2); got shape {lm.shape}.")
    gap = np.mean([lm[:, lo, 1] - lm[:, up, 1] for up, lo in zip(INNER_UPPER, INNER_LOWER, strict=True)], axis=0)
    eyes = np.linalg.norm(lm[:, EYE_CORNERS[1]] - lm[:, EYE_CORNERS[0]], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.maximum(gap, 0.0) / eyes


def speech_envelope(waveform: np.ndarray, n_frames: int, sample_rate: int = SAMPLE_RATE, fps: int = FPS, *,
                    start_frame: int = 0) -> np.ndarray:
    """The speech envelope per video frame: log RMS in dB of each frame's 40 ms of samples.

    Frame ``t`` covers samples ``[t * sr / fps, (t + 1) * sr / fps)``; samples before the start or past the end
    of the waveform count as silence. The result is floored 60 dB below the loudest frame, so pauses do not
    dominate.

    Args:
        waveform: (L,) float samples.
        n_frames: N, the number of frames wanted.
        sample_rate: Hz.
        fps: Video frames per second.
        start_frame: Index of the first frame wanted (negative = before the sound starts, silence).

    Returns:
        (N,) float64 dB (0 dB = full-scale RMS 1), frames ``start_frame .. start_frame + N - 1``.

    Raises:
        InputError: Bad shapes or rates.
    """
    x = np.asarray(waveform, dtype=np.float64)
    if x.ndim != 1 or n_frames < 1 or sample_rate % fps:
        raise InputError(f"waveform must be 1-D, n_frames >= 1 and sample_rate a multiple of fps; got shape "
                         f"{x.shape}, n_frames {n_frames}, {sample_rate} Hz, {fps} fps.")
    hop = sample_rate // fps
    buf = np.zeros(n_frames * hop)
    first = start_frame * hop  # sample index of buf[0]
    lo, hi = max(0, first), min(x.shape[0], first + buf.shape[0])
    if hi > lo:
        buf[lo - first:hi - first] = x[lo:hi]
    rms = np.sqrt(np.mean(buf.reshape(n_frames, hop) ** 2, axis=1))
    db = 20.0 * np.log10(np.maximum(rms, 1e-10))
    whole = np.zeros(-(-max(x.shape[0], 1) // hop) * hop)  # the floor follows the loudest frame of the whole sound
    whole[:x.shape[0]] = x
    loudest = 20.0 * np.log10(max(float(np.sqrt(np.mean(whole.reshape(-1, hop) ** 2, axis=1)).max()), 1e-10))
    return np.maximum(db, loudest - ENVELOPE_FLOOR_DB)


def _highpass(x: np.ndarray, frames: int = HIGHPASS_FRAMES) -> np.ndarray:
    """``x`` minus its centred moving average over ``frames`` (edges use the available frames; a clip shorter than
    ``frames`` uses the longest odd window it holds)."""
    m = min(int(frames), int(x.shape[0]))
    k = np.ones(max(1, m - (1 - m % 2)))
    num = np.convolve(x, k, mode="same")
    den = np.convolve(np.ones_like(x), k, mode="same")
    return x - num / den


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    den = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / den if den > 0 else 0.0


def _effective_n(a: np.ndarray, b: np.ndarray, max_k: int) -> float:
    """Bartlett's effective sample size of a correlation between two autocorrelated series."""
    n = a.shape[0]
    total = 1.0
    for k in range(1, min(max_k, n - 2) + 1):
        total += 2.0 * _pearson(a[:-k], a[k:]) * _pearson(b[:-k], b[k:])
    return max(3.0 + 1e-9, n / max(total, 1.0))


def mouth_audio_lag(video: Any, audio: Any = None, *, track: Any = None, backend: str = "auto",
                    weights_dir: str | os.PathLike | None = None, max_lag: int | None = None,
                    device: str | None = None) -> MouthAudioLag:
    """The lag between the mouth opening and the speech envelope, from their cross-correlation (no weights).

    1. Landmarks per frame (``track`` if given, else :func:`nbhelpers.faces.track` with ``backend``); the mouth
       curve is :func:`mouth_opening` (inner-lip gap / eye-corner distance); frames with no face are filled by
       linear interpolation.
    2. The voice curve is :func:`speech_envelope` (log RMS dB per 40 ms frame).
    3. Both are high-passed (a centred 1 s moving average subtracted: head motion, phrase loudness and slow drift
       carry no sync information) and correlated (Pearson over all N frames) at each lag ``-max_lag..max_lag``:
       ``r(L) = corr(mouth[t], envelope[t + L])``, the envelope reaching past the clip's ends as silence, so each
       lag uses the same mouth frames and shifting the sound by d frames moves the lag by exactly d.
    4. The lag is the maximum of ``r``. Confidence: the peak ``r``, its peak-to-sidelobe ratio, and a z score
       ``atanh(r) * sqrt(n_eff - 3)`` with ``n_eff`` reduced for the curves' autocorrelation (Bartlett); the lag is
       ``reliable`` when z >= 3.5 and r > 0. A mouth that does not move with the voice gives a lag at the noise
       level: read ``reliable`` before the lag.

    Args:
        video: A video path (25 fps) or (N, H, W, 3) uint8 BGR frames; only used for landmarks when ``track`` is
            None, and for the sound when ``audio`` is None.
        audio: A speech file, a (L,) 16 kHz waveform, or None for the video's sound.
        track: A :class:`nbhelpers.faces.FaceTrack` or (N, 68, 2) landmarks already computed for ``video``.
        backend: Landmark backend when ``track`` is None (``"auto"``, ``"dlib"``, ``"dwpose-onnx"``, ...).
        weights_dir: Weights dir for the landmark backend.
        max_lag: Largest lag searched, frames; None = 15 (+-0.6 s), or less for a clip under 40 frames
            (``(N - 10) // 2``, so a short clip still gets a lag).
        device: Device of the landmark backend.

    Returns:
        A :class:`MouthAudioLag` (displays as a plot in notebooks).

    Raises:
        InputError: Bad inputs, fewer than ``2 * max_lag + 10`` frames, or landmarks of the wrong shape.
        NoFaceError: No face in any frame.

    Source: none in MuseTalk; the idea that mouth opening follows the acoustic envelope with a short lead is from
    Chandrasekaran et al., "The natural statistics of audiovisual speech" (PLoS Comput Biol 2009).
    """
    if max_lag is not None and (not isinstance(max_lag, (int, np.integer)) or max_lag < 1):
        raise InputError(f"max_lag must be a positive integer (frames); got {max_lag!r}.")
    if track is None:
        _check_video(video)
    samples = _audio_samples(video, audio)
    name = ""
    if track is None:
        from .faces import track as run_track

        track = run_track(video, backend=backend, weights_dir=weights_dir, device=device)
    if hasattr(track, "landmarks"):
        name = str(getattr(track, "backend", ""))
        landmarks = np.asarray(track.landmarks)
    else:
        landmarks = np.asarray(track)
    mouth = mouth_opening(landmarks)
    n = mouth.shape[0]
    if max_lag is None:
        max_lag = max(1, min(MAX_LAG, (n - 10) // 2))
    if n < 2 * max_lag + 10:
        raise InputError(f"{n} frames are too few to search lags of +-{max_lag} frames; give at least "
                         f"{2 * max_lag + 10} frames ({(2 * max_lag + 10) / FPS:.1f} s) or a smaller max_lag.")
    ok = np.isfinite(mouth)
    if not ok.any():
        from .errors import NoFaceError

        raise NoFaceError(f"no face (landmarks) in any of the {n} frames: the mouth cannot be followed.")
    filled = np.interp(np.arange(n), np.flatnonzero(ok), mouth[ok])
    # The envelope reaches max_lag frames beyond both ends of the clip (silence outside the sound), so every lag
    # pairs the same N mouth frames with N envelope frames: shifting the sound shifts r(L) exactly.
    margin = max_lag + HIGHPASS_FRAMES  # the high-pass sees whole windows inside the frames correlated
    env_ext = speech_envelope(samples, n + 2 * margin, start_frame=-margin)
    a, b = _highpass(filled), _highpass(env_ext)[HIGHPASS_FRAMES:-HIGHPASS_FRAMES]
    env_ext = env_ext[HIGHPASS_FRAMES:-HIGHPASS_FRAMES]
    lags = np.arange(-max_lag, max_lag + 1)
    corr = np.array([_pearson(a, b[max_lag + int(L):max_lag + int(L) + n]) for L in lags])
    k = int(np.argmax(corr))
    peak = float(corr[k])
    side = corr[np.abs(lags - lags[k]) > SIDELOBE_GUARD]
    psr = float((peak - side.mean()) / side.std()) if side.size > 1 and side.std() > 0 else float("inf")
    n_eff = _effective_n(a, b[max_lag + int(lags[k]):max_lag + int(lags[k]) + n], max_k=2 * HIGHPASS_FRAMES)
    z = float(np.arctanh(np.clip(peak, -0.999999, 0.999999)) * math.sqrt(n_eff - 3.0))
    env = env_ext[max_lag:max_lag + n]
    return MouthAudioLag(lag_frames=int(lags[k]), peak_correlation=peak, peak_to_sidelobe=psr, z_score=z,
                         reliable=bool(peak > 0 and z >= Z_SIGNIFICANT), lags=lags, correlations=corr,
                         mouth=mouth, envelope=env, fps=FPS, n_frames=n, backend=name)

