"""``track``: run a landmark backend over a clip, streamed in batches, and turn every frame into a crop box.

Frames with no face are kept, marked and counted, never dropped; a clip with no face at all raises
:class:`~nbhelpers.errors.NoFaceError`.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import media
from ..config import FaceChoice, InferenceConfig, parse_face
from ..constants import CROP_SIZE
from ..errors import InputError, NbHelpersWarning, NoFaceError, plural
from ..gpu import batched
from ..progress import bar
from .base import FaceResult, LandmarkBackend, check_frames
from .boxes import BBoxShiftRange, bbox_shift_range, crop_box_with_source, single_box, smooth_boxes, user_boxes
from .registry import get_backend
from .tracks import FaceChooser, FaceTracks

LARGE_FACE_RATIO = 3.0  # warn when the median crop side exceeds this many times CROP_SIZE (256 px)
DEFAULT_BATCH_FRAMES = 8  # frames decoded and handed to the backend at a time


class FaceSizeWarning(NbHelpersWarning):
    """The face is much larger than the 256-px crop, so the repainted mouth is upscaled a lot."""


@dataclass
class FaceTrack:
    """Per-frame face boxes, landmarks and crop boxes of one clip of N frames of ``frame_shape`` (H, W), none dropped.

    ``crop_boxes`` (N, 4) int32 ``(x1, y1, x2, y2)`` full-frame pixels, final (margin, clamp, smoothing), -1 rows
    for no face; ``face_boxes`` (N, 4) float64 detector boxes (the user's in boxes mode), NaN rows for no face;
    ``landmarks`` (N, 68, 2) float32 ``(x, y)`` pixels in iBUG 300-W order, NaN for no face and in boxes mode;
    ``has_face`` and ``used_face_box`` (crop box from the detector box) (N,) bool; ``scores`` (N,) float32 (NaN: none);
    ``backend`` (``"boxes"`` for user boxes) and why; ``bbox_shift_range``, the official adjustable range (None in
    boxes mode); the settings used (v1's margin is 0), ``notes`` for the summary, and the face ``tracks`` when a face
    was chosen among several."""

    crop_boxes: np.ndarray
    face_boxes: np.ndarray
    landmarks: np.ndarray
    has_face: np.ndarray
    frame_shape: tuple[int, int]
    backend: str
    backend_reason: str = ""
    bbox_shift_range: BBoxShiftRange | None = None
    scores: np.ndarray | None = None
    used_face_box: np.ndarray | None = None
    version: str = "v15"
    bbox_shift: int = 0
    extra_margin: int = 10
    smooth_boxes: int = 0
    notes: list[str] = field(default_factory=list)
    face: str = "largest"
    tracks: FaceTracks | None = None

    @property
    def n_frames(self) -> int:
        return int(self.has_face.shape[0])

    @property
    def n_no_face(self) -> int:
        """Number of frames with no face (passed through unchanged by the pipeline)."""
        return int((~self.has_face).sum())

    @property
    def n_faces(self) -> int:
        return int(self.has_face.sum())

    def __len__(self) -> int:
        return self.n_frames

    def no_face_ranges(self) -> list[tuple[int, int]]:
        """Runs of frames with no face as inclusive ``(first, last)`` frame indices."""
        edges = np.diff(np.concatenate([[1], self.has_face.astype(np.int8), [1]]))
        return list(zip(np.nonzero(edges == -1)[0].tolist(), (np.nonzero(edges == 1)[0] - 1).tolist(), strict=True))

    def summary(self) -> str:
        """A few lines: counts, backend and why, crop-box sizes, the bbox_shift range."""
        h, w = self.frame_shape
        runs = self.no_face_ranges()
        where = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:6]) + (", ..." if len(runs) > 6 else "")
        lines = [f"FaceTrack: {plural(self.n_frames, 'frame')} of {w}x{h} px, face in {self.n_faces}, no face in "
                 f"{self.n_no_face}" + (f" (frames {where})" if runs else "")]
        lines.append(f"  backend: {self.backend}" + (f" ({self.backend_reason})" if self.backend_reason else ""))
        faces = self.crop_boxes[self.has_face]
        if len(faces):
            size = f"median {np.median(faces[:, 2] - faces[:, 0]):.0f}x{np.median(faces[:, 3] - faces[:, 1]):.0f} px"
            fallback = int(self.used_face_box.sum()) if self.used_face_box is not None else 0
            smooth = f", smoothed over {self.smooth_boxes} frames" if self.smooth_boxes > 1 else ""
            lines.append(f"  crop boxes: given by the user, used as given ({size})" if self.backend == "boxes" else
                         f"  crop boxes: {self.version}, extra_margin {self.extra_margin}, bbox_shift "
                         f"{self.bbox_shift}, {size}, {fallback} from the detector box{smooth}")
        if self.bbox_shift_range is not None:
            lines.append(f"  bbox_shift range: {self.bbox_shift_range}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()


def _check_frame(frame: Any, index: int, shape: tuple[int, int] | None) -> np.ndarray:
    arr = np.asarray(frame)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise InputError(f"frames[{index}] must be an (H, W, 3) uint8 BGR image; got shape {arr.shape}, dtype "
                         f"{arr.dtype}. Read videos with nbhelpers.media.load_video.")
    if shape is not None and arr.shape[:2] != shape:
        raise InputError(f"frames[{index}] is {arr.shape[1]}x{arr.shape[0]} px but the first frame is "
                         f"{shape[1]}x{shape[0]} px; every frame of a clip must have the same size.")
    return arr


def _batches(frames: Any, batch_size: int, stack: ExitStack, exact: bool = False
             ) -> tuple[Iterator[np.ndarray], int | None]:
    """Validated (b, H, W, 3) uint8 batches of ``frames`` and the frame count when known up front: for a video
    reader its duration x fps, or with ``exact`` its exact ``frame_count`` (one counting decode)."""
    if isinstance(frames, (str, os.PathLike)):
        reader = media.load_video(frames)
        if hasattr(reader, "__exit__"):
            stack.enter_context(reader)
        frames = reader
    if isinstance(frames, np.ndarray):
        arr = check_frames(frames)
        return (arr[i:i + batch_size] for i in range(0, arr.shape[0], batch_size)), int(arr.shape[0])
    if callable(getattr(frames, "iter_batches", None)):  # a media.VideoReader: decode straight into batches
        count = getattr(frames, "frame_count", None) if exact else None
        total = int(count) if isinstance(count, (int, np.integer)) else _reader_total_hint(frames)
        return (np.asarray(b) for b in frames.iter_batches(batch_size)), total  # FaceTracker.add checks them
    if not isinstance(frames, Iterable):
        raise InputError(f"frames must be an (N, H, W, 3) uint8 array, an iterable of (H, W, 3) frames, a video "
                         f"reader or a video path; got {type(frames).__name__}.")
    try:
        total = len(frames)  # type: ignore[arg-type]
    except TypeError:
        count = getattr(frames, "frame_count", None)
        total = int(count) if isinstance(count, (int, np.integer)) else None

    def gen() -> Iterator[np.ndarray]:
        shape: tuple[int, int] | None = None
        pending: list[np.ndarray] = []
        for i, frame in enumerate(frames):
            arr = _check_frame(frame, i, shape)
            shape = arr.shape[:2]
            pending.append(arr)
            if len(pending) == batch_size:
                yield np.stack(pending)
                pending = []
        if pending:
            yield np.stack(pending)

    return gen(), total


def _reader_total_hint(reader: Any) -> int | None:
    """Frame count for the progress bar without a counting decode: 1 for a photo, else duration x fps."""
    info = getattr(reader, "info", None)
    if getattr(info, "is_image", False):
        return 1
    duration, fps = getattr(info, "duration_s", None), getattr(reader, "fps", None)
    return max(1, round(float(duration) * float(fps))) if duration and fps else None


def track(frames: Any, backend: str | LandmarkBackend = "auto", config: InferenceConfig | None = None,
          boxes: Any = None, weights_dir: str | os.PathLike | None = None,
          batch_size: int = DEFAULT_BATCH_FRAMES, device: str | None = None) -> FaceTrack:
    """The face, its 68 landmarks and the crop box in every frame of a clip, ``batch_size`` frames at a time (halved
    on CUDA out-of-memory). Frames with no face are kept and marked, never re-indexed (quirks Q6, Q7).

    ``frames``: (N, H, W, 3) uint8 BGR, one frame, an iterable of frames (a :class:`nbhelpers.media.VideoReader`) or
    a video/photo path (read at 25 fps). ``backend``: ``"auto"`` (then ``config.landmark_backend``), a name, or a
    backend object (left open); ``device`` None is ``config.device``, ``weights_dir`` None the default weights dir.
    With ``boxes`` (one ``(x1, y1, x2, y2)`` for the clip, or one entry per frame as :func:`user_boxes`, checked
    against a video's exact frame count first) no detector runs and the boxes are the crop boxes, as given.
    ``config.smooth_boxes`` (frames; 0: off, as officially) smooths the boxes.

    InputError for bad frames (not uint8 BGR, mixed sizes, empty), boxes or batch_size, or ``"boxes"`` without boxes;
    NoFaceError when no frame has a face; MissingDependencyError when the backend's packages are missing; a
    FaceSizeWarning when the median crop box is more than 3x the 256-px crop.

    Source: ``preprocessing.py:84-137``; ``inference.py:150-181``; docs/official-behaviour.md §3."""
    with FaceTracker(backend, config, boxes=boxes, weights_dir=weights_dir, batch_size=batch_size,
                     device=device) as tracker:
        tracker._feed(frames, exact=tracker.boxes is not None and not tracker._single_box)
        return tracker.finish()


class FaceTracker(AbstractContextManager):
    """:func:`track` one batch of frames at a time (the offline job's streamed pieces): :meth:`add` returns
    unsmoothed boxes, :meth:`finish` smooths them. Arguments as :func:`track`; ``schedule`` (for ``face="speaker"``)
    gives the track to repaint in each frame, -1 for none (:func:`nbhelpers.faces.speaker.speaker_schedule`).
    ``n_frames`` counts the frames added; ``total_hint``, the expected count or None, checks per-frame ``boxes`` early.
    InputError and MissingDependencyError as :func:`track`, at construction or at the first :meth:`add`."""

    def __init__(self, backend: str | LandmarkBackend = "auto", config: InferenceConfig | None = None,
                 boxes: Any = None, weights_dir: str | os.PathLike | None = None,
                 batch_size: int = DEFAULT_BATCH_FRAMES, device: str | None = None,
                 schedule: np.ndarray | None = None):
        config = config if config is not None else InferenceConfig()
        if not isinstance(config, InferenceConfig):
            raise InputError(f"config must be an nbhelpers.InferenceConfig or None; got {type(config).__name__}.")
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise InputError(f"batch_size must be a positive integer (frames); got {batch_size!r}.")
        name = backend
        if isinstance(backend, str) and backend == "auto" and config.landmark_backend != "auto":
            name = config.landmark_backend
        if boxes is None and name == "boxes":
            raise InputError("landmark_backend is 'boxes' but no boxes were given: pass boxes=(x1, y1, x2, y2) (one "
                             "box for the clip) or one box per frame, or choose a detector backend.")
        if boxes is not None and not isinstance(boxes, (np.ndarray, list, tuple)):
            boxes = list(boxes)  # e.g. a generator of per-frame boxes
        one = single_box(boxes)
        boxes = one if one is not None else boxes  # a list holding one box: that box for every frame
        self.config, self.boxes, self.batch_size = config, boxes, int(batch_size)
        self._name, self._backend, self._weights_dir = name, backend, weights_dir
        self._device = device if device is not None else config.device
        self._single_box = one is not None
        self.n_frames = 0
        self.total_hint: int | None = None
        self.frame_shape: tuple[int, int] | None = None
        self._used: Any = None
        self._stack = ExitStack()
        self._results: list[FaceResult | None] = []
        self._crop: list[np.ndarray] = []
        self._from_face_box: list[np.ndarray] = []
        choice = parse_face(config.face)
        if choice.kind != "largest" and boxes is not None:
            raise InputError(f"face={config.face!r} chooses among the faces a detector finds; with boxes given the "
                             "boxes say where the face is. Leave face='largest' or drop the boxes.")
        self.chooser = FaceChooser(choice, schedule=schedule) if choice.kind != "largest" else None

    def add(self, frames: np.ndarray, frames_device: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Track the next (b, H, W, 3) uint8 BGR ``frames`` of the clip; returns (b, 4) int32 unsmoothed crop boxes and
        (b,) bool ``has_face``. ``frames_device`` is the same frames on the GPU, for a backend that
        ``accepts_frames_device``. InputError for bad frames or boxes (see :func:`track`)."""
        batch = check_frames(frames)
        b, first = int(batch.shape[0]), self.n_frames
        if self.frame_shape is None:
            self.frame_shape = (int(batch.shape[1]), int(batch.shape[2]))
            if self.boxes is not None:  # validated now: per-frame boxes against their own count until it is known
                own = 1 if self._single_box else len(self.boxes)
                total = self.total_hint if self.total_hint is not None else own
                user_boxes(self.boxes, total, self.frame_shape)
            else:
                self._used = get_backend(self._name, weights_dir=self._weights_dir, device=self._device)
                if self._used is not self._backend:
                    self._stack.callback(self._used.close)
        elif batch.shape[1:3] != self.frame_shape:
            _check_frame(batch[0], first, self.frame_shape)
        if self.boxes is not None:
            if not self._single_box and first + b > len(self.boxes):  # the clip's length is known only once read
                raise InputError(
                    f"boxes has {len(self.boxes)} entries but the clip has more frames than that (at least "
                    f"{first + b} at 25 fps). Give one (x1, y1, x2, y2) (or a list holding that one box) for every "
                    "frame, or exactly one entry, a box or None (no face), per frame.")
            self.n_frames += b
            return user_boxes(self.boxes if self._single_box else list(self.boxes[first:first + b]), b,
                              self.frame_shape)
        found_all: list[FaceResult | None] = []
        extra: dict[str, Any] = {}
        if self.chooser is not None:
            if "choose" not in inspect.signature(self._used.detect).parameters:
                raise InputError(f"landmark backend {getattr(self._used, 'name', self._used)!r} gives one face per "
                                 f"frame, so face={self.config.face!r} cannot be chosen; use a built-in backend.")
            extra["choose"] = self.chooser
        on_device = frames_device is not None and getattr(self._used, "accepts_frames_device", False)

        def detect(s: slice, u: Any = self._used) -> Any:
            if self.chooser is not None:  # a batch run again (halved after out-of-memory) replaces its first try
                self.chooser.linker.mark(first + s.start)
            return u.detect(batch[s], **extra, **({"frames_device": frames_device[s]} if on_device else {}))
        for sl, found in batched(b, b, detect, stage="faces"):
            if len(found) != sl.stop - sl.start:
                raise RuntimeError(f"backend {getattr(self._used, 'name', self._used)!r} returned {len(found)} "
                                   f"results for {sl.stop - sl.start} frames; a backend must return one per frame.")
            found_all.extend(found)
        crop = np.full((b, 4), -1, dtype=np.int32)
        from_face_box = np.zeros(b, dtype=bool)
        for i, r in enumerate(found_all):
            if r is None:
                continue
            box, source = crop_box_with_source(np.asarray(r.landmarks, dtype=np.float32).reshape(68, 2),
                                               np.asarray(r.face_box, dtype=np.float64).reshape(4),
                                               self.frame_shape, self.config.version, self.config.bbox_shift,
                                               self.config.extra_margin)
            crop[i] = box
            from_face_box[i] = source == "face_box"
        self._results.extend(found_all)
        self._crop.append(crop)
        self._from_face_box.append(from_face_box)
        self.n_frames += b
        return crop.copy(), np.array([r is not None for r in found_all], dtype=bool)

    def _feed(self, frames: Any, exact: bool = False) -> None:
        """:meth:`add` every batch of ``frames`` (any input :func:`track` takes), with a progress bar."""
        with ExitStack() as stack:
            batches, self.total_hint = _batches(frames, self.batch_size, stack, exact)
            pbar = stack.enter_context(bar(total=self.total_hint, desc="faces", unit="frame"))
            for batch in batches:
                self.add(batch)
                pbar.update(int(batch.shape[0]))
            if pbar.total != pbar.n:  # the duration's estimate was off by a frame: end the bar full at the real count
                pbar.total = pbar.n
                pbar.refresh()

    def finish(self) -> FaceTrack:
        """The :class:`FaceTrack` of every frame added (smoothed when asked); releases a backend made here. InputError
        when no frame was added or per-frame ``boxes`` do not match the frame count; NoFaceError when no frame has a
        face."""
        config, n, frame_shape = self.config, self.n_frames, self.frame_shape
        self.close()
        if n == 0 or frame_shape is None:
            raise InputError("frames is empty: the clip has no frames. Check the file (nbhelpers.media.probe) or the "
                             "array you passed.")
        landmarks = np.full((n, 68, 2), np.nan, dtype=np.float32)
        scores = np.full(n, np.nan, dtype=np.float32)
        if self.boxes is not None:
            crop, has_face = user_boxes(self.boxes, n, frame_shape)
            face_boxes = np.where(has_face[:, None], crop.astype(np.float64), np.nan)
            from_face_box = np.zeros(n, dtype=bool)
            backend_name, reason = "boxes", "boxes given by the user; no detector ran"
            if not has_face.any():
                raise NoFaceError(f"no face found in the {plural(n, 'frame')}: every entry of boxes is None (no face). "
                                  "Give at least one (x1, y1, x2, y2) box.")
        else:
            used = self._used
            backend_name = str(getattr(used, "name", type(used).__name__))
            reason = str(getattr(used, "reason", "") or "")
            has_face = np.array([r is not None for r in self._results], dtype=bool)
            if self.chooser is not None:
                self.chooser.check()
            if not has_face.any():
                raise NoFaceError(
                    f"no face found in the {plural(n, 'frame')} (landmark backend {backend_name!r}"
                    + (f": {reason}" if reason else "") + "). Check that the clip shows an upright face turned "
                    "towards the camera (at least about 40 px tall; a face lying on its side is not found: turn the "
                    "video first, e.g. `ffmpeg -i in.mp4 -vf transpose=1 out.mp4` turns it a quarter turn clockwise, "
                    "transpose=2 anticlockwise), try another backend, or give the crop box yourself: "
                    "boxes=(x1, y1, x2, y2) in Python, --box=x1,y1,x2,y2 on the command line.")
            faces = [r for r in self._results if r is not None]
            face_boxes = np.full((n, 4), np.nan, dtype=np.float64)
            face_boxes[has_face] = [np.asarray(r.face_box, dtype=np.float64).reshape(4) for r in faces]
            landmarks[has_face] = [np.asarray(r.landmarks, dtype=np.float32).reshape(68, 2) for r in faces]
            scores[has_face] = [float(r.score) for r in faces]
            crop = np.concatenate(self._crop)
            from_face_box = np.concatenate(self._from_face_box)

        crop = smooth_boxes(crop, has_face, config.smooth_boxes, frame_shape)  # 0 or 1: unchanged
        shift_range = bbox_shift_range(landmarks) if self.boxes is None else None

        result = FaceTrack(crop_boxes=crop.astype(np.int32), face_boxes=face_boxes, landmarks=landmarks,
                           has_face=has_face, frame_shape=frame_shape, backend=backend_name, backend_reason=reason,
                           bbox_shift_range=shift_range, scores=scores, used_face_box=from_face_box,
                           version=config.version, bbox_shift=int(config.bbox_shift),
                           extra_margin=int(config.extra_margin) if config.version == "v15" else 0,
                           smooth_boxes=int(config.smooth_boxes), face=str(parse_face(config.face)),
                           tracks=self.chooser.linker.result() if self.chooser is not None else None)
        _warn_large(result)
        return result

    def close(self) -> None:
        """Release a backend this tracker made (an object you passed stays open)."""
        self._stack.close()

    def __exit__(self, *exc) -> None:
        self.close()


def find_tracks(frames: Any, backend: str | LandmarkBackend = "auto", config: InferenceConfig | None = None,
                weights_dir: str | os.PathLike | None = None) -> FaceTracks:
    """Every face of every frame, linked into numbered tracks (:class:`~nbhelpers.faces.tracks.FaceTracks`): the
    backend's face detector only, no landmarks. Arguments as :func:`track`. InputError for bad frames or a backend
    that gives one face per frame; NoFaceError when no frame has a face."""
    config = (config if config is not None else InferenceConfig()).replace(face="largest")
    with FaceTracker(backend, config, weights_dir=weights_dir) as tracker:
        tracker.chooser = FaceChooser(FaceChoice("list"))  # links tracks, keeps no face: no landmarks run
        tracker._feed(frames)
        if tracker.n_frames == 0:
            raise InputError("frames is empty: the clip has no frames.")
        tracker.chooser.check()
        return tracker.chooser.linker.result()


def _warn_large(result: FaceTrack) -> None:
    faces = result.crop_boxes[result.has_face]
    side = float(np.median(np.maximum(faces[:, 2] - faces[:, 0], faces[:, 3] - faces[:, 1])))
    if side > LARGE_FACE_RATIO * CROP_SIZE:
        note = (f"the crop box is about {side:.0f} px, {side / CROP_SIZE:.1f}x the {CROP_SIZE}-px crop MuseTalk "
                "works at: the repainted mouth is upscaled that much and will look soft. Downscale the video "
                "(e.g. to 720p) before lip-sync for a consistent look.")
        result.notes.append(note)
        warnings.warn(note, FaceSizeWarning, stacklevel=3)
