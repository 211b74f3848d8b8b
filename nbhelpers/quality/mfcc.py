"""MFCCs as the SyncNet evaluation feeds them: ``python_speech_features.mfcc`` defaults, in numpy alone.

Source: syncnet_python SyncNetInstance.py (``python_speech_features.mfcc(audio, sample_rate)`` on 16-bit samples);
python_speech_features 0.6 ``base.mfcc``/``fbank``, ``sigproc.framesig``.
"""

from __future__ import annotations

import math

import numpy as np

from ..constants import SAMPLE_RATE
from ..errors import InputError

__all__ = ["mfcc"]

MFCC_COEFFS = 13  # cepstra kept; the first is replaced by the log frame energy (appendEnergy=True)
MFCC_WIN_S = 0.025  # seconds per analysis frame (400 samples at 16 kHz), rectangular window
MFCC_HOP_S = 0.010  # seconds between frames: 100 MFCC frames per second
MFCC_NFFT = 512
MFCC_FILTERS = 26  # mel filters, 0 Hz to sample_rate / 2
MFCC_PREEMPH = 0.97
MFCC_LIFTER = 22
INT16_SCALE = 32768.0  # the protocol feeds int16 samples (ffmpeg pcm_s16le); a float waveform is scaled by this


def _mel_filters(sample_rate: int) -> np.ndarray:
    """(26, 257) triangular filters on FFT bins ``floor((nfft + 1) * f / sr)`` of 26 + 2 mel-spaced edges."""
    edges = np.linspace(0.0, 2595.0 * np.log10(1.0 + sample_rate / 2.0 / 700.0), MFCC_FILTERS + 2)  # mel
    bins = np.floor((MFCC_NFFT + 1) * 700.0 * (10.0 ** (edges / 2595.0) - 1.0) / sample_rate)
    fb = np.zeros((MFCC_FILTERS, MFCC_NFFT // 2 + 1))
    for j in range(MFCC_FILTERS):
        lo, mid, hi = bins[j], bins[j + 1], bins[j + 2]
        for i in range(int(lo), int(mid)):
            fb[j, i] = (i - lo) / (mid - lo)
        for i in range(int(mid), int(hi)):
            fb[j, i] = (hi - i) / (hi - mid)
    return fb


def mfcc(waveform: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """(13, T) float32 MFCCs at 100 Hz of (L,) mono samples at ``sample_rate`` Hz (16000 in the protocol), as
    ``python_speech_features.mfcc(signal, sample_rate)`` computes them on the 16-bit PCM the protocol reads: float
    samples in [-1, 1] are scaled by 32768 and rounded, int16 ones used as they are.

    Pre-emphasis 0.97; 25 ms frames every 10 ms, the last zero-padded, rectangular window; ``|rfft_512|^2 / 512``; 26
    mel filters from 0 Hz to ``sr / 2``; log (zeros become eps); orthonormal DCT-II, first 13; lifter 22; coefficient 0
    replaced by the log frame energy. InputError for anything but a non-empty 1-D array, or a bad sample rate.
    Source: syncnet_python ``SyncNetInstance.py``; python_speech_features 0.6 ``base.mfcc``, ``sigproc.framesig``."""
    import scipy.fft

    x = np.asarray(waveform)
    if x.ndim != 1 or x.size == 0:
        raise InputError(f"waveform must be a non-empty 1-D array of samples; got shape {x.shape}.")
    if not isinstance(sample_rate, (int, np.integer)) or sample_rate <= 0:
        raise InputError(f"sample_rate must be a positive integer in Hz; got {sample_rate!r}.")
    if np.issubdtype(x.dtype, np.floating):  # quantised as ffmpeg's pcm_s16le: digital silence
        x = np.clip(np.round(x.astype(np.float64) * INT16_SCALE), -INT16_SCALE, INT16_SCALE - 1)  # stays 0
    else:
        x = x.astype(np.float64)
    x = np.append(x[0], x[1:] - MFCC_PREEMPH * x[:-1])
    win = int(math.floor(MFCC_WIN_S * sample_rate + 0.5))  # round half up, as sigproc.round_half_up
    hop = int(math.floor(MFCC_HOP_S * sample_rate + 0.5))
    n = x.shape[0]
    count = 1 if n <= win else 1 + int(math.ceil((n - win) / hop))
    padded = np.pad(x, (0, (count - 1) * hop + win - n))  # the last frame zero-padded
    frames = padded[np.arange(win)[None, :] + hop * np.arange(count)[:, None]]
    power = np.abs(np.fft.rfft(frames, MFCC_NFFT)) ** 2 / MFCC_NFFT
    eps = np.finfo(float).eps
    energy = power.sum(axis=1)
    energy = np.where(energy == 0, eps, energy)
    feat = power @ _mel_filters(int(sample_rate)).T
    feat = np.where(feat == 0, eps, feat)
    cep = scipy.fft.dct(np.log(feat), type=2, norm="ortho", axis=1)[:, :MFCC_COEFFS]
    cep *= 1.0 + (MFCC_LIFTER / 2.0) * np.sin(np.pi * np.arange(MFCC_COEFFS) / MFCC_LIFTER)
    cep[:, 0] = np.log(energy)
    return np.ascontiguousarray(cep.T, dtype=np.float32)
