"""``tracks``: every face of every frame linked over time into numbered tracks, and the choice of one of them.

The detector boxes the job computes anyway are linked frame to frame: a face continues the track whose last box it
overlaps, the one it resembles most first (an 8x8 colour signature of the crop, compared by correlation). At a cut
(the whole frame changes at once) or after a gap, overlap is ignored and appearance alone decides, so two faces
that swap places keep their numbers. Tracks are numbered in order of first appearance (left to right within a
frame), online, so the first frames of a clip get the same numbers whether or not the rest is read."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import FaceChoice, parse_face
from ..errors import InputError, NoFaceError, plural

MIN_FACE_SIDE = 16  # pixels: smaller detections are not tracked
THUMB = 8  # side of the appearance signature, cells (each the mean of 8x8 samples)
THUMB_SHOW = 64  # side of the thumbnail shown in a notebook, pixels
APPEARANCE_MAX = 0.35  # largest signature distance (1 - correlation) that continues a track over a cut or a gap
IOU_MIN = 0.1  # smallest box overlap that continues a track into the next frame (no cut)
IOU_WEIGHT = 0.3  # weight of (1 - IoU) against the appearance distance in the link cost
CUT_DIFF = 0.05  # mean absolute change of a 1/8-scale grey frame (0..1) that marks a cut
MAX_GAP = 50  # frames a track may be missing and still be continued (by appearance)
COLOURS = ("#00e000", "#ff4040", "#40a0ff", "#ffc000", "#e040ff", "#00e0e0", "#ff8000", "#a0a0a0")


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two ``(x1, y1, x2, y2)`` boxes."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    return float(inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter))


def thumbnail(frame: np.ndarray, box: np.ndarray, side: int = THUMB, pad: float = 0.15) -> np.ndarray:
    """A (side, side, 3) uint8 crop of ``box`` widened by ``pad`` on each side, sampled at nearest pixels."""
    x1, y1, x2, y2 = (float(v) for v in box[:4])
    w, h = x2 - x1, y2 - y1
    xs = np.clip(np.linspace(x1 - pad * w, x2 + pad * w, side).round().astype(int), 0, frame.shape[1] - 1)
    ys = np.clip(np.linspace(y1 - pad * h, y2 + pad * h, side).round().astype(int), 0, frame.shape[0] - 1)
    return frame[ys][:, xs]


def signature(frame: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The appearance of a face: its crop averaged down to THUMB x THUMB x 3, zero mean, unit length."""
    v = thumbnail(frame, box, THUMB * 8).astype(np.float32).reshape(THUMB, 8, THUMB, 8, 3).mean(axis=(1, 3))
    return _unit(v)


def mouth_patch(frame: np.ndarray, box: np.ndarray) -> np.ndarray:
    """(64,) float32 grey 8x8 of the mouth region of a face box (middle half across, 60-95 % down)."""
    x1, y1, x2, y2 = (float(v) for v in box[:4])
    w, h = x2 - x1, y2 - y1
    region = np.array([x1 + 0.25 * w, y1 + 0.6 * h, x2 - 0.25 * w, y1 + 0.95 * h])
    return thumbnail(frame, region, 32, pad=0.0).mean(axis=2).reshape(8, 4, 8, 4).mean(axis=(1, 3)).ravel()


def _unit(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float32)
    v -= v.mean(axis=(0, 1))
    return (v / (np.linalg.norm(v) + 1e-6)).ravel()


@dataclass
class Track:
    """One face over time: ``frames`` (M,) frame indices, ``boxes`` (M, 4) detector boxes ``(x1, y1, x2, y2)``
    in pixels, ``scores`` (M,), a ``thumbnail`` (64, 64, 3) uint8 BGR of its largest detection, and ``mouths``
    (M, 64) grey 8x8 patches of the mouth region (for ``face="speaker"``)."""

    number: int
    frames: np.ndarray
    boxes: np.ndarray
    scores: np.ndarray
    thumbnail: np.ndarray
    mouths: np.ndarray | None = None

    def __len__(self) -> int:
        return int(len(self.frames))

    def box_at(self, frame: int) -> np.ndarray | None:
        """The box in ``frame``, or None where the track is absent."""
        hit = np.nonzero(self.frames == frame)[0]
        return self.boxes[hit[0]] if len(hit) else None

    def describe(self) -> str:
        side = np.median(np.maximum(self.boxes[:, 2] - self.boxes[:, 0], self.boxes[:, 3] - self.boxes[:, 1]))
        frames = plural(len(self), "frame")
        return f"track {self.number}: frames {self.frames[0]}-{self.frames[-1]} ({frames}), about {side:.0f} px"


@dataclass
class FaceTracks:
    """Every face track of a clip (see :func:`nbhelpers.faces.tracks` module docs): ``tracks`` in number order,
    ``n_frames`` frames of ``frame_shape`` (H, W), and the frames where a cut was found."""

    tracks: list[Track]
    n_frames: int
    frame_shape: tuple[int, int]
    cuts: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tracks)

    def __iter__(self):
        return iter(self.tracks)

    def __getitem__(self, number: int) -> Track:
        for t in self.tracks:
            if t.number == number:
                return t
        raise InputError(f"there is no face track {number!r}; {self.listing()}")

    def listing(self) -> str:
        """One line naming the tracks there are."""
        if not self.tracks:
            return "no face was found in any frame."
        return "the tracks are " + "; ".join(t.describe() for t in self.tracks) + "."

    def at(self, frame: int) -> list[tuple[int, np.ndarray]]:
        """``(track number, box)`` of every face in ``frame``."""
        return [(t.number, box) for t in self.tracks if (box := t.box_at(frame)) is not None]

    def select(self, face: Any) -> int:
        """The track number a face choice (:func:`nbhelpers.config.parse_face`) names. InputError for an unknown track
        (lists the tracks), a point or box on no face (names the nearest face and its distance), or ``"largest"``."""
        choice = face if isinstance(face, FaceChoice) else parse_face(face)
        if choice.kind == "track":
            return self[int(choice.track)].number
        if choice.kind in ("point", "box"):
            return pick_at(choice, self.at(choice.frame), choice.frame, self.listing())
        raise InputError(f"face={choice} is not one track: give a track number, a point or a box.")

    def summary(self) -> str:
        h, w = self.frame_shape
        lines = [f"FaceTracks: {plural(len(self.tracks), 'track')} over {plural(self.n_frames, 'frame')} of {w}x{h} px"
                 + (f", cuts at frames {', '.join(map(str, self.cuts))}" if self.cuts else "")]
        lines.extend("  " + t.describe() for t in self.tracks)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        import cv2

        cells = []
        for t in self.tracks:
            colour = COLOURS[t.number % len(COLOURS)]
            src = "data:image/png;base64," + base64.b64encode(cv2.imencode(".png", t.thumbnail)[1]).decode()
            cells.append(f'<figure style="display:inline-block;margin:4px;text-align:center">'
                         f'<img src="{src}" width="{THUMB_SHOW}" style="border:3px solid {colour}">'
                         f'<figcaption>{html.escape(t.describe())}</figcaption></figure>')
        return f"<div><pre>{html.escape(self.summary().splitlines()[0])}</pre>{''.join(cells)}</div>"


def pick_at(choice: FaceChoice, faces: list[tuple[int, np.ndarray]], frame: int, listing: str) -> int:
    """The track number among ``faces`` ((number, box) in ``frame``) that a point or box choice names; InputError
    naming the nearest face and its distance when the point or box lies on no face."""
    if not faces:
        raise InputError(f"face: {choice} lies on no face (frame {frame} has none); {listing}")
    if choice.kind == "box":
        overlap, best = max((iou(np.asarray(choice.box), box), n) for n, box in faces)
        if overlap > 0:
            return best
        px, py = (choice.box[0] + choice.box[2]) / 2, (choice.box[1] + choice.box[3]) / 2
    else:
        px, py = choice.point
        inside = [(float((b[2] - b[0]) * (b[3] - b[1])), n) for n, b in faces
                  if b[0] <= px <= b[2] and b[1] <= py <= b[3]]
        if inside:
            return min(inside)[1]
    dist = [(float(np.hypot(max(b[0] - px, 0, px - b[2]), max(b[1] - py, 0, py - b[3]))), n, b) for n, b in faces]
    d, n, b = min(dist, key=lambda x: x[0])
    raise InputError(f"face: {choice} lies on no face; the nearest is track {n} at ({b[0]:.0f}, {b[1]:.0f}, "
                     f"{b[2]:.0f}, {b[3]:.0f}), {d:.0f} px away. Use face={n} or a point inside its box.")


@dataclass
class _Live:  # a track being linked; its last box and frame are the ends of boxes and frames
    number: int
    signature: np.ndarray
    frames: list[int] = field(default_factory=list)
    boxes: list[np.ndarray] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    mouths: list[np.ndarray] = field(default_factory=list)
    thumb: np.ndarray | None = None
    thumb_side: float = 0.0


class TrackLinker:
    """Link each frame's detections into tracks, one frame at a time (:meth:`add`); :meth:`result` gives the
    :class:`FaceTracks`; a detection under :data:`MIN_FACE_SIDE` is not tracked. :meth:`mark` before a batch lets a
    batch that is run again (after an out-of-memory halving) replace its first attempt."""

    def __init__(self):
        self.n_frames = 0
        self.frame_shape: tuple[int, int] | None = None
        self._tracks: list[_Live] = []
        self._grey: np.ndarray | None = None
        self._cuts: list[int] = []
        self._marks: dict[int, tuple] = {}

    def mark(self, frame: int) -> None:
        """Remember the state before ``frame``, or go back to it when that frame was already added (the per-frame
        history is cut back; only the few running values are copied)."""
        if frame in self._marks and frame < self.n_frames:
            n_frames, grey, n_cuts, live = self._marks[frame]
            self.n_frames, self._grey, self._cuts = n_frames, grey, self._cuts[:n_cuts]
            self._tracks = self._tracks[:len(live)]
            for t, (signature, n, thumb, thumb_side) in zip(self._tracks, live, strict=True):
                t.signature, t.thumb, t.thumb_side = signature, thumb, thumb_side
                del t.frames[n:], t.boxes[n:], t.scores[n:], t.mouths[n:]
        elif frame == self.n_frames:
            live = [(t.signature, len(t.frames), t.thumb, t.thumb_side) for t in self._tracks]
            self._marks = {frame: (self.n_frames, self._grey, len(self._cuts), live)}

    def add(self, frame: np.ndarray, dets: np.ndarray) -> np.ndarray:
        """Link the (K, 5) ``(x1, y1, x2, y2, score)`` detections of the next frame; returns their (K,) track
        numbers (-1 for one under the floors)."""
        index = self.n_frames
        self.n_frames += 1
        self.frame_shape = frame.shape[:2]
        dets = np.asarray(dets, dtype=np.float64).reshape(-1, 5)
        grey = frame[::8, ::8].mean(axis=2, dtype=np.float32) / 255.0
        cut = self._grey is not None and float(np.abs(grey - self._grey).mean()) > CUT_DIFF
        self._grey = grey
        if cut:
            self._cuts.append(index)
        numbers = np.full(len(dets), -1, dtype=np.int64)
        keep = [k for k, d in enumerate(dets) if min(d[2] - d[0], d[3] - d[1]) >= MIN_FACE_SIDE]
        sigs = {k: signature(frame, dets[k]) for k in keep}
        pairs = []
        for t in self._tracks:
            gap = index - t.frames[-1]
            if gap > MAX_GAP:
                continue
            for k in keep:
                distance = 1.0 - float(t.signature @ sigs[k])
                overlap = iou(t.boxes[-1], dets[k])
                if (overlap < IOU_MIN if gap == 1 and not cut else distance > APPEARANCE_MAX):
                    continue  # next frame: boxes overlap; over a cut or a gap: faces look alike
                pairs.append((distance + (0.0 if cut else IOU_WEIGHT * (1.0 - overlap)), t.number, k))
        for _, number, k in sorted(pairs):  # the closest pairs first, each track and detection once
            if numbers[k] < 0 and number not in numbers:
                numbers[k] = number
        for k in sorted(keep, key=lambda k: (dets[k, 0], dets[k, 1])):  # new tracks numbered left to right
            if numbers[k] < 0:
                numbers[k] = len(self._tracks)
                self._tracks.append(_Live(number=len(self._tracks), signature=sigs[k]))
            t = self._tracks[numbers[k]]
            t.signature = _unit((t.signature + sigs[k]).reshape(THUMB, THUMB, 3))
            t.frames.append(index)
            t.boxes.append(dets[k, :4].copy())
            t.scores.append(float(dets[k, 4]))
            t.mouths.append(mouth_patch(frame, dets[k]).astype(np.float32))
            side = float(min(dets[k, 2] - dets[k, 0], dets[k, 3] - dets[k, 1]))
            if side > t.thumb_side:
                t.thumb, t.thumb_side = thumbnail(frame, dets[k], THUMB_SHOW, pad=0.1), side
        return numbers

    def result(self) -> FaceTracks:
        tracks = [Track(number=t.number, frames=np.asarray(t.frames, dtype=np.int64),
                        boxes=np.asarray(t.boxes, dtype=np.float64).reshape(-1, 4),
                        scores=np.asarray(t.scores, dtype=np.float32), thumbnail=t.thumb,
                        mouths=np.asarray(t.mouths, dtype=np.float32).reshape(-1, 64))
                  for t in self._tracks]
        return FaceTracks(tracks=tracks, n_frames=self.n_frames, frame_shape=self.frame_shape or (0, 0),
                          cuts=list(self._cuts))


class FaceChooser:
    """The ``choose(frame, dets)`` callback a backend calls once per frame with all its detections (K, 5): links
    them (:class:`TrackLinker`) and returns the row of the chosen face, or None (the frame passes through).
    InputError at the choice's frame for a point or box on no face (the nearest face named)."""

    def __init__(self, face: Any, schedule: np.ndarray | None = None):
        self.choice = face if isinstance(face, FaceChoice) else parse_face(face)
        self.linker = TrackLinker()
        self.track = self.choice.track
        self.schedule = None if schedule is None else np.asarray(schedule, dtype=np.int64)
        if self.choice.kind == "speaker" and self.schedule is None:
            raise InputError("face='speaker' follows the voice, so it needs the audio: it works in lipsync (one "
                             "clip), not when a face is prepared without audio (an avatar). Choose a track there.")
        if self.choice.kind in ("point", "box") and self.choice.frame > 0 and self.track is None:
            raise InputError(f"face={self.choice} is in a later frame: resolve it first with "
                             "pipe.faces(video).select(face) (the pipeline does so) and pass the track number.")

    def __call__(self, frame: np.ndarray, dets: np.ndarray) -> int | None:
        index = self.linker.n_frames
        numbers = self.linker.add(frame, dets)
        if self.choice.kind == "list":
            return None
        if self.track is None and self.choice.kind in ("point", "box") and index == self.choice.frame:
            faces = [(int(n), np.asarray(dets[k, :4])) for k, n in enumerate(numbers) if n >= 0]
            self.track = pick_at(self.choice, faces, index, self.linker.result().listing())
        track = self.track
        if self.schedule is not None:  # the speaker of this frame (-1: none)
            track = int(self.schedule[index]) if index < len(self.schedule) else -1
        hit = np.nonzero(numbers == track)[0] if track is not None and track >= 0 else []
        return int(hit[0]) if len(hit) else None

    def check(self) -> None:
        """After the last frame: InputError (listing the tracks) when the chosen track does not exist, NoFaceError
        when there is no face at all."""
        tracks = self.linker.result()
        if not len(tracks):
            raise NoFaceError(f"no face found in the {plural(tracks.n_frames, 'frame')}, so face={self.choice} "
                              "cannot be chosen.")
        if self.track is not None and self.choice.kind != "list":
            tracks[self.track]  # raises with the list of tracks

