"""Does the mouth follow the voice? The lag between the inner-lip opening and the speech envelope (no weights)."""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Any

import numpy as np

from .. import gpu, media
from ..constants import FPS
from ..errors import InputError, NoFaceError, plural
from ..faces.track import track as track_faces
from ..framestore import expected_frames
from ..gpu import PlanWarning
from .clip import audio_samples, check_video, is_path
from .sync import SAMPLES_PER_FRAME

__all__ = ["MouthAudioLag", "mouth_audio_lag", "mouth_opening", "speech_envelope"]

MAX_LAG = 15  # frames searched either way (the same +-0.6 s as SyncNet's offsets)
HIGHPASS_FRAMES = 25  # frames: a centred moving average of this length (1 s) is subtracted from both signals
ENVELOPE_FLOOR_DB = 60.0  # the log envelope is floored this many dB below its loudest frame (silence)
SIDELOBE_GUARD = 2  # lags within this many frames of the peak are not sidelobes
Z_SIGNIFICANT = 3.5  # z score of the peak above which the lag is called reliable (about 0.05 over 31 lags)
INNER_UPPER = (61, 62, 63)  # iBUG 68 (0-based): upper inner lip, left to right
INNER_LOWER = (67, 66, 65)  # lower inner lip points facing them
EYE_CORNERS = (36, 45)  # outer eye corners: the face-size unit
LONG_TRACKING_S = 60.0  # face tracking expected to take longer than this on the CPU is announced before it starts


@dataclasses.dataclass(frozen=True)
class MouthAudioLag:
    """How the mouth opening follows the speech envelope, frame by frame.

    Attributes:
        lag_frames: Lag of the correlation peak in 40 ms video frames: ``mouth[t]`` pairs best with
            ``envelope[t + lag]``; positive = the sound comes later than the mouth.
        peak_correlation: Pearson correlation at that lag, in [-1, 1].
        peak_to_sidelobe: ``(peak - mean(sidelobes)) / std(sidelobes)`` over lags more than 2 frames from the peak.
        z_score: ``atanh(peak) * sqrt(n_eff - 3)``, ``n_eff`` reduced for autocorrelation (Bartlett).
        reliable: ``z_score >= 3.5`` and a positive peak.
        lags: (2 * max_lag + 1,) int, ascending.
        correlations: (2 * max_lag + 1,) float64, the correlation at each lag.
        mouth: (N,) float64 inner-lip opening / outer-eye-corner distance, NaN where no face was found.
        envelope: (N,) float64 speech envelope in dB, floored 60 dB below its loudest frame.
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
        """One line: the lag in frames and ms, and the confidence figures; a correlation equal at every lag (a
        silent track) is said to leave the lag undetermined."""
        tail = f"{self.n_frames} frames" + (f", landmarks from {self.backend}" if self.backend else "")
        if self.correlations.size and float(np.ptp(self.correlations)) == 0.0:
            return ("mouth-audio lag undetermined: the correlation is the same at every lag (a silent track or a "
                    f"still mouth; NOT reliable); {tail}")
        ms = 1000 * self.lag_frames / self.fps
        verdict = "reliable" if self.reliable else "NOT reliable: the mouth and the voice barely co-vary"
        return (f"mouth-audio lag {plural(self.lag_frames, 'frame', spec='+d')} ({ms:+.0f} ms; + = sound after "
                f"mouth): peak r {self.peak_correlation:.3f}, peak/sidelobe {self.peak_to_sidelobe:.1f}, z "
                f"{self.z_score:.1f} ({verdict}); {tail}")

    def __repr__(self) -> str:
        return self.summary()


def mouth_opening(landmarks: np.ndarray) -> np.ndarray:
    """Inner-lip opening per frame in face-size units, (N,) float64 from 0 (closed) to about 0.5 (wide open).

    The mean gap of inner-lip points 61-67, 62-66, 63-65 (iBUG 68, 0-based) over the outer-eye-corner distance (36-45),
    from (N, 68, 2) float ``(x, y)`` pixel ``landmarks`` (NaN rows, no face, stay NaN); InputError for another shape."""
    lm = np.asarray(landmarks, dtype=np.float64)
    if lm.ndim != 3 or lm.shape[1:] != (68, 2):
        raise InputError(f"landmarks must be (N, 68, 2); got shape {lm.shape}.")
    gap = np.mean([lm[:, lo, 1] - lm[:, up, 1] for up, lo in zip(INNER_UPPER, INNER_LOWER, strict=True)], axis=0)
    eyes = np.linalg.norm(lm[:, EYE_CORNERS[1]] - lm[:, EYE_CORNERS[0]], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.maximum(gap, 0.0) / eyes


def speech_envelope(waveform: np.ndarray, n_frames: int, *, start_frame: int = 0) -> np.ndarray:
    """The speech envelope per video frame: (N,) float64 log RMS in dB (0 dB = RMS 1), floored 60 dB below the
    loudest frame of the whole waveform.

    Frame ``t`` (from ``start_frame``, negative = before the sound starts, to ``start_frame + n_frames``) covers
    the 640 samples from ``640 t`` of the (L,) float 16 kHz ``waveform``, silence outside it. InputError when
    ``waveform`` is not 1-D or ``n_frames`` < 1."""
    x = np.asarray(waveform, dtype=np.float64)
    if x.ndim != 1 or n_frames < 1:
        raise InputError(f"waveform must be 1-D and n_frames >= 1; got shape {x.shape}, n_frames {n_frames}.")
    loudest = _frames_db(x, 0, -(-max(x.shape[0], 1) // SAMPLES_PER_FRAME)).max()  # over the whole sound
    return np.maximum(_frames_db(x, start_frame, n_frames), loudest - ENVELOPE_FLOOR_DB)


def _frames_db(x: np.ndarray, start_frame: int, n_frames: int) -> np.ndarray:
    """Log RMS in dB of ``n_frames`` 640-sample frames of ``x`` from frame ``start_frame`` (silence outside ``x``)."""
    buf = np.zeros(n_frames * SAMPLES_PER_FRAME)
    first = start_frame * SAMPLES_PER_FRAME  # sample index of buf[0]
    lo, hi = max(0, first), min(x.shape[0], first + buf.shape[0])
    if hi > lo:
        buf[lo - first:hi - first] = x[lo:hi]
    rms = np.sqrt(np.mean(buf.reshape(n_frames, SAMPLES_PER_FRAME) ** 2, axis=1))
    return 20.0 * np.log10(np.maximum(rms, 1e-10))


def _highpass(x: np.ndarray) -> np.ndarray:
    """``x`` minus its centred moving average over 25 frames (edges use the available frames; a clip shorter than
    that uses the longest odd window it holds)."""
    m = min(HIGHPASS_FRAMES, int(x.shape[0]))
    k = np.ones(max(1, m - (1 - m % 2)))
    num = np.convolve(x, k, mode="same")
    den = np.convolve(np.ones_like(x), k, mode="same")
    return x - num / den


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    den = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / den if den > 0 else 0.0


def _effective_n(a: np.ndarray, b: np.ndarray, max_k: int) -> float:
    """Bartlett's effective sample size of a correlation between two autocorrelated series."""
    n = a.shape[0]
    total = 1.0
    for k in range(1, min(max_k, n - 2) + 1):
        total += 2.0 * pearson(a[:-k], a[k:]) * pearson(b[:-k], b[k:])
    return max(3.0 + 1e-9, n / max(total, 1.0))


def announce_cpu_tracking(video: Any, backend: str = "auto", device: str | None = None) -> float | None:
    """Warn (:class:`~nbhelpers.gpu.PlanWarning`) before face tracking of a video file that will run on the CPU for
    more than :data:`LONG_TRACKING_S`, with the estimate (DWPose, the default, takes about a minute per 150 frames
    there); returns the estimate in seconds, or None on a GPU or for frames in memory."""
    if not is_path(video) or not isinstance(backend, str):
        return None
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not str(device).startswith("cpu"):
        return None
    info = media.probe(video)
    n = expected_frames(info, 0)
    figures = gpu.face_cpu_times(backend)
    seconds = figures.load_s + n * figures.seconds((int(info.height or 0), int(info.width or 0)))
    if seconds >= LONG_TRACKING_S:
        name = "dwpose (auto)" if backend == "auto" else backend
        took = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
        warnings.warn(f"Finding the face in {n} frames with the {name} landmark backend on the CPU takes about "
                      f"{took}; the dlib backend takes seconds where dlib is installed.", PlanWarning,
                      stacklevel=3)
    return seconds


def mouth_audio_lag(video: Any, audio: Any = None, *, track: Any = None, backend: str = "auto",
                    weights_dir: str | os.PathLike | None = None, max_lag: int | None = None,
                    device: str | None = None) -> MouthAudioLag:
    """The lag between the mouth opening and the speech envelope, from their cross-correlation (no weights).

    Both curves (:func:`mouth_opening`, gaps interpolated; :func:`speech_envelope`) lose a centred 1 s moving average,
    then ``r(L) = corr(mouth[t], envelope[t + L])`` over all N frames for ``|L| <= max_lag``, the envelope reaching past
    the clip as silence. Read ``reliable`` before the lag.

    ``video`` is a path (25 fps) or (N, H, W, 3) uint8 BGR frames, for landmarks when ``track`` (a
    :class:`nbhelpers.faces.FaceTrack` or (N, 68, 2) landmarks) is None (found by ``backend`` on ``device`` with
    ``weights_dir``) and for the sound when ``audio`` (a speech file or a (L,) 16 kHz waveform) is None. ``max_lag``
    is the largest lag searched, frames; None = 15, or ``(N - 10) // 2`` for a clip under 40 frames. InputError for
    bad inputs, fewer than ``2 * max_lag + 10`` frames or landmarks of the wrong shape; NoFaceError for no face;
    NoGpuError when ``device`` names a CUDA device this runtime does not have.
    Source: Chandrasekaran et al., "The natural statistics of audiovisual speech", PLoS Comput Biol 2009."""
    if max_lag is not None and (not isinstance(max_lag, (int, np.integer)) or max_lag < 1):
        raise InputError(f"max_lag must be a positive integer (frames); got {max_lag!r}.")
    if track is None:
        gpu.check_device(device)  # a CUDA device this runtime lacks stops here, not at the tracker's CPU fallback
        check_video(video)
    samples = audio_samples(video, audio)
    if track is None:
        announce_cpu_tracking(video, backend, device)
        track = track_faces(video, backend=backend, weights_dir=weights_dir, device=device)
    name = str(getattr(track, "backend", "")) if hasattr(track, "landmarks") else ""
    mouth = mouth_opening(np.asarray(getattr(track, "landmarks", track)))
    n = mouth.shape[0]
    max_lag = max(1, min(MAX_LAG, (n - 10) // 2)) if max_lag is None else max_lag
    if n < 2 * max_lag + 10:
        raise InputError(f"{n} frames are too few to search lags of +-{max_lag} frames; give at least "
                         f"{2 * max_lag + 10} frames ({(2 * max_lag + 10) / FPS:.1f} s) or a smaller max_lag.")
    ok = np.isfinite(mouth)
    if not ok.any():
        raise NoFaceError(f"no face (landmarks) in any of the {n} frames: the mouth cannot be followed.")
    filled = np.interp(np.arange(n), np.flatnonzero(ok), mouth[ok])
    margin = max_lag + HIGHPASS_FRAMES  # the high-pass sees whole windows inside the frames correlated
    env_ext = speech_envelope(samples, n + 2 * margin, start_frame=-margin)
    a, b = _highpass(filled), _highpass(env_ext)[HIGHPASS_FRAMES:-HIGHPASS_FRAMES]
    lags = np.arange(-max_lag, max_lag + 1)
    corr = np.array([pearson(a, b[max_lag + int(L):max_lag + int(L) + n]) for L in lags])
    k = int(np.argmax(corr))
    peak = float(corr[k])
    side = corr[np.abs(lags - lags[k]) > SIDELOBE_GUARD]
    psr = float((peak - side.mean()) / side.std()) if side.size > 1 and side.std() > 0 else 0.0  # flat: no peak
    n_eff = _effective_n(a, b[max_lag + int(lags[k]):max_lag + int(lags[k]) + n], max_k=2 * HIGHPASS_FRAMES)
    z = float(np.arctanh(np.clip(peak, -0.999999, 0.999999)) * math.sqrt(n_eff - 3.0))
    env = env_ext[margin:margin + n]  # the clip's own frames
    return MouthAudioLag(lag_frames=int(lags[k]), peak_correlation=peak, peak_to_sidelobe=psr, z_score=z,
                         reliable=bool(peak > 0 and z >= Z_SIGNIFICANT), lags=lags, correlations=corr,
                         mouth=mouth, envelope=env, fps=FPS, n_frames=n, backend=name)
