"""SyncNet's LSE-D and LSE-C of a clip, with the published evaluation protocol of ``syncnet_python``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import gpu
from ..constants import FPS, SAMPLE_RATE
from ..errors import InputError, plural
from .clip import audio_samples, check_video, frame_batches
from .crops import CROP_SIDE, detect_boxes, given_boxes, protocol_crops, smooth_face_boxes
from .mfcc import mfcc
from .syncnet import SyncEmbedder, load_syncnet

__all__ = ["VSHIFT", "SyncScore", "score_crops", "score_embeddings", "sync_score"]

VSHIFT = 15  # frames: offsets searched are -VSHIFT..+VSHIFT (run_syncnet.py --vshift 15)
STACK_FRAMES = 5  # video frames per SyncNet input window (0.2 s at 25 fps)
BATCH_WINDOWS = 20  # windows per SyncNet call (run_syncnet.py --batch_size 20)
PAIRWISE_EPS = 1e-6  # torch.nn.functional.pairwise_distance's eps, added to the difference
MFCC_PER_FRAME = 4  # MFCC steps per video frame (100 Hz / 25 fps)
MFCC_WINDOW = 20  # MFCC steps per SyncNet audio window (= STACK_FRAMES * MFCC_PER_FRAME)
SAMPLES_PER_FRAME = SAMPLE_RATE // FPS  # 640 samples of 16 kHz audio per 25 fps frame


@dataclasses.dataclass(frozen=True)
class SyncScore:
    """SyncNet's verdict on one clip.

    Attributes:
        lse_d: LSE-D, the smallest mean embedding distance over the offsets (lower = better sync).
        lse_c: LSE-C, median of the mean distances minus their minimum (higher = more confident; below about 2
            SyncNet sees no sync).
        offset_frames: syncnet_python's AV offset at the minimum, in 40 ms frames: video window ``i`` matches audio
            window ``i - offset``.
        offsets: (2 * vshift + 1,) int, ``+vshift`` down to ``-vshift`` (the order of ``mean_distances``).
        mean_distances: (2 * vshift + 1,) float64, mean distance at each offset.
        frame_distances: (W,) float64, per-window distance at the chosen offset.
        n_windows: W, 5-frame windows compared.
        detector: Where the face boxes came from (``"s3fd"``, ``"dlib"``, ``"boxes"``).
        notes: Departures from the published protocol in this run.
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


def score_embeddings(video_embeddings: np.ndarray, audio_embeddings: np.ndarray, *, detector: str = "",
                     notes: Sequence[str] = ()) -> SyncScore:
    """The :class:`SyncScore` of per-window embeddings, as syncnet_python computes it.

    Distance ``||v_i - a_{i+j-15} + 1e-6||_2`` for ``j`` in ``0..30`` (:data:`VSHIFT` = 15; zero audio embeddings
    outside the clip), averaged over ``i``; LSE-D is the minimum at ``j*``, the offset ``15 - j*``, LSE-C the lower
    median minus the minimum. ``video_embeddings`` (one per 5-frame window) and ``audio_embeddings`` (one per 20-step
    MFCC window starting at step ``4 i``) are (W, D) floats; ``detector`` and ``notes`` are recorded. InputError for
    shapes that differ or are not 2-D, or no windows.
    Source: syncnet_python ``SyncNetInstance.py`` ``calc_pdist`` and ``evaluate``."""
    v = np.asarray(video_embeddings, dtype=np.float64)
    a = np.asarray(audio_embeddings, dtype=np.float64)
    if v.ndim != 2 or a.ndim != 2 or v.shape != a.shape:
        raise InputError(f"video and audio embeddings must both be (W, D) with the same shape; got {v.shape} and "
                         f"{a.shape}.")
    if v.shape[0] == 0:
        raise InputError("no windows to compare: the clip needs at least 6 frames (and 0.24 s of audio).")
    w, vshift = v.shape[0], VSHIFT
    padded = np.pad(a, ((vshift, vshift), (0, 0)))
    span = 2 * vshift + 1
    dists = np.stack([np.linalg.norm(v[i][None, :] - padded[i:i + span] + PAIRWISE_EPS, axis=1) for i in range(w)])
    mean = dists.mean(axis=0)
    j = int(np.argmin(mean))  # the first minimum, as torch.min on CPU
    lower_median = float(np.sort(mean)[(span - 1) // 2])
    return SyncScore(lse_d=float(mean[j]), lse_c=lower_median - float(mean[j]), offset_frames=int(vshift - j),
                     offsets=vshift - np.arange(span), mean_distances=mean, frame_distances=dists[:, j].copy(),
                     n_windows=w, detector=detector, notes=tuple(notes))


def sync_score(video: Any, audio: Any = None, *, model: SyncEmbedder | None = None,
               weights_dir: str | os.PathLike | None = None, boxes: Any = None, device: str | None = None) -> SyncScore:
    """The :class:`SyncScore` (LSE-D, LSE-C, AV offset) of a clip with SyncNet v2, by the published protocol.

    Face boxes (S3FD at scale 0.25, score > 0.9, or ``boxes``) smoothed (:func:`smooth_face_boxes`), 224x224 crops
    (:func:`protocol_crops`), 13 MFCCs at 100 Hz (:func:`mfcc`); ``min(N, floor(L / 640)) - 5`` windows of 5 frames
    and 20 MFCC steps embedded by ``model``, then :func:`score_embeddings`. Frames are decoded directly; there is no
    shot detection or person tracking (one shot of one face).

    ``video`` is a path (decoded at 25 fps) or (N, H, W, 3) uint8 BGR frames at 25 fps; ``audio`` a speech file, a
    (L,) 16 kHz waveform (float in [-1, 1], or int16), or None for the video's sound. ``model`` is a
    :class:`SyncEmbedder` (None: SyncNet v2 from ``weights_dir``). Face boxes come from the S3FD file in
    ``weights_dir`` when present, else dlib, unless ``boxes`` in frame pixels are given: one ``(x1, y1, x2, y2)``, or
    (N, 4) (rows of NaN or -1 = no face). ``device`` None = CUDA when available. InputError for a bad video, audio,
    boxes or model, or under 6 frames / 0.24 s of audio; NoFaceError for no face in any frame; WeightsError when
    ``model`` is None and the SyncNet (or S3FD) weights are missing; NoGpuError when ``device`` names a CUDA device
    this runtime does not have.
    Source: syncnet_python ``run_pipeline.py``, ``SyncNetInstance.py``, ``run_syncnet.py``."""
    gpu.check_device(device)
    check_video(video)
    samples = audio_samples(video, audio)  # checked before any model loads
    embedder = model if model is not None else load_syncnet(weights_dir, device)
    if not isinstance(embedder, SyncEmbedder):
        raise InputError(f"model must have embed_video(stacks) and embed_audio(windows); got {type(model).__name__}.")

    face_boxes, used, notes = (given_boxes(boxes, video), "boxes", []) if boxes is not None else detect_boxes(
        video, weights_dir, device)
    squares = smooth_face_boxes(face_boxes)
    n_frames = squares.shape[0]

    n = min(n_frames, samples.shape[0] // SAMPLES_PER_FRAME)
    if n - STACK_FRAMES < 1:
        raise InputError(f"the clip is too short to score: {plural(n_frames, 'frame')} and "
                         f"{samples.shape[0] / SAMPLE_RATE:.2f} s of audio give {max(0, n - STACK_FRAMES)} windows; "
                         "SyncNet needs at least 6 frames and 0.24 s.")
    if abs(n_frames / FPS - samples.shape[0] / SAMPLE_RATE) > 1.0 / FPS:
        notes.append(f"video ({n_frames / FPS:.2f} s) and audio ({samples.shape[0] / SAMPLE_RATE:.2f} s) lengths "
                     f"differ; the first {n / FPS:.2f} s are scored")
    crops, start = np.empty((n, CROP_SIDE, CROP_SIDE, 3), np.uint8), 0  # uint8: 224*224*3 bytes a frame
    for batch in frame_batches(video, 32):
        take = batch[: n - start]
        crops[start:start + take.shape[0]] = protocol_crops(take, squares[start:start + take.shape[0]])
        start += take.shape[0]
        if start >= n:
            break
    if start < n:
        raise InputError(f"the video gave {start} frames, fewer than the {n} counted; it may be damaged.")
    return score_crops(crops, mfcc(samples, SAMPLE_RATE), embedder, detector=used, notes=notes)


def score_crops(crops: np.ndarray, cc: np.ndarray, embedder: SyncEmbedder, **recorded: Any) -> SyncScore:
    """The :class:`SyncScore` of (n, 224, 224, 3) uint8 BGR protocol crops and the (13, T) MFCCs of their audio
    (step ``4 i`` = frame ``i``): ``n - 5`` windows of 5 frames and 20 steps embedded 20 at a time, then
    :func:`score_embeddings` (``recorded``: its ``detector`` and ``notes``)."""
    n_windows = crops.shape[0] - STACK_FRAMES
    if n_windows < 1:
        raise InputError(f"SyncNet needs at least 6 frames to score; got {crops.shape[0]}.")
    need = MFCC_PER_FRAME * (n_windows - 1) + MFCC_WINDOW
    cc = np.pad(cc, ((0, 0), (0, max(0, need - cc.shape[1]))))  # zero steps past the audio's end
    video_emb, audio_emb = [], []
    for i in range(0, n_windows, BATCH_WINDOWS):
        idx = range(i, min(n_windows, i + BATCH_WINDOWS))
        stacks = np.stack([crops[v:v + STACK_FRAMES] for v in idx]).astype(np.float32)  # (B, 5, 224, 224, 3)
        stacks = stacks.transpose(0, 4, 1, 2, 3)  # (B, 3, 5, 224, 224), BGR channels as cv2 reads them
        windows = np.stack([cc[:, MFCC_PER_FRAME * v:MFCC_PER_FRAME * v + MFCC_WINDOW] for v in idx])[:, None]
        video_emb.append(np.asarray(embedder.embed_video(stacks), dtype=np.float64))
        audio_emb.append(np.asarray(embedder.embed_audio(windows), dtype=np.float64))
    return score_embeddings(np.concatenate(video_emb), np.concatenate(audio_emb), **recorded)
