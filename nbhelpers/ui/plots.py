"""Charts and tables of a run; charts are matplotlib figures made without pyplot, shown as PNG anywhere."""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..display import table_html
from ..errors import InputError, plural
from ..faces.tracks import COLOURS as TRACK_COLOURS
from ..faces.tracks import FaceTracks
from ..media import VideoReader, frames_at

__all__ = ["Chart", "FpsTable", "compare_restore", "fps_table", "plot_faces", "plot_sync", "plot_timings"]


@dataclass(eq=False)
class Chart:
    """A matplotlib figure (``figure``) that shows itself as a PNG."""

    figure: Any

    def png(self) -> bytes:
        """The figure as PNG bytes at 100 dpi."""
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        return buffer.getvalue()

    def _repr_png_(self) -> bytes:
        return self.png()

    def __repr__(self) -> str:
        return f"Chart({len(self.figure.axes)} axes)"


def _figure(width_in: float, height_in: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def outline(ax: Any, box: Sequence[float], colour: str, linewidth: float = 2, **style: Any) -> None:
    """Draw ``box`` (x1, y1, x2, y2) on ``ax`` as an unfilled rectangle of ``colour`` (``style``: its label, ...)."""
    from matplotlib.patches import Rectangle

    x1, y1, x2, y2 = (float(v) for v in box)
    ax.add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor=colour, linewidth=linewidth, **style))


def compare_restore(before: Any, after: Any) -> Chart:
    """A 2x2 chart of one frame's generated crop and repainted mouth, ``before`` (a :class:`~nbhelpers.pipeline.Preview`
    with ``restore=None``) and ``after`` restoration; InputError when the previews differ in frame or crop box."""
    if tuple(before.crop_box) != tuple(after.crop_box) or before.frame.shape != after.frame.shape:
        raise InputError("compare_restore needs two previews of the same frame and crop box (the same video, "
                         "frame_index and settings apart from restore).")
    fig = _figure(8, 8)
    fig.suptitle("Face restoration: before and after")
    axes = fig.subplots(2, 2)
    x1, y1, x2, y2 = before.crop_box
    h, w = before.frame.shape[:2]
    pad = max(x2 - x1, y2 - y1) // 4
    for col, (preview, name) in enumerate(((before, "without restoration"), (after, "restored"))):
        axes[0, col].imshow(preview.face_256[:, :, ::-1])
        axes[0, col].set(title=f"generated crop, {name}", xticks=[], yticks=[])
        axes[1, col].imshow(preview.result[max(y1 - pad, 0):min(y2 + pad, h), max(x1 - pad, 0):min(x2 + pad, w), ::-1])
        axes[1, col].set(title=f"frame after paste-back, {name}", xticks=[], yticks=[])
    return Chart(fig)


def plot_timings(timings: Any) -> Chart:
    """A bar chart of seconds per stage with each stage's share, from a mapping or a result's ``timings``; InputError
    for no timings or a negative or non-numeric value."""
    timings = getattr(timings, "timings", timings)
    if not isinstance(timings, Mapping) or not timings:
        raise InputError(f"timings must be a non-empty mapping of stage -> seconds; got {timings!r}.")
    names = [str(k) for k in timings]
    try:
        seconds = np.array([float(v) for v in timings.values()])
    except (TypeError, ValueError):
        raise InputError(f"timings values must be seconds (numbers); got {dict(timings)!r}.") from None
    if (seconds < 0).any() or not np.isfinite(seconds).all():
        raise InputError(f"timings must be finite and >= 0 seconds; got {dict(timings)!r}.")
    total = float(seconds.sum())
    shares = 100 * seconds / total if total > 0 else 0 * seconds
    return bars(names, seconds, [f" {s:.2f} s ({p:.0f}%)" for s, p in zip(seconds, shares, strict=True)], "seconds",
                f"Time per stage (total {total:.2f} s)", max(total * 0.01, seconds.max() * 1.35, 1e-3))


def bars(names: Sequence[str], values: np.ndarray, labels: Sequence[str], xlabel: str, title: str,
         right: float) -> Chart:
    """A horizontal bar per name, top to bottom, each annotated with its label; the x axis from 0 to ``right``."""
    fig = _figure(7, 0.45 * len(names) + 1.2)
    ax = fig.add_subplot()
    y = np.arange(len(names))[::-1]
    ax.barh(y, values, color="#4c72b0")
    ax.set_yticks(y, names)
    ax.set(xlabel=xlabel, title=title, xlim=(0, right))
    for yi, v, text in zip(y, values, labels, strict=True):
        ax.annotate(text, (v, yi), va="center", fontsize=9)
    return Chart(fig)


def _zscore(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    ok = np.isfinite(x)
    if not ok.any():
        return x
    sd = x[ok].std()
    return (x - x[ok].mean()) / (sd if sd > 0 else 1.0)


def plot_sync(lag: Any, score: Any = None, *, turns: Any = None) -> Chart:
    """Chart a :class:`nbhelpers.quality.MouthAudioLag` ``lag``: both curves over time (z scores), and the correlation
    per lag with, given a :class:`~nbhelpers.quality.SyncScore` ``score``, its mean distance per offset on the same
    scale (audio delay = -offset). ``turns`` (a ``face="speaker"`` result or its ``turns``) shade each speaker's
    output frames in the track's colour with its number. InputError when ``lag`` lacks a MouthAudioLag's fields."""
    try:
        mouth, env = np.asarray(lag.mouth, float), np.asarray(lag.envelope, float)
        lags, corr, best, fps = np.asarray(lag.lags), np.asarray(lag.correlations), int(lag.lag_frames), lag.fps
    except AttributeError as exc:
        raise InputError(f"plot_sync needs a quality.mouth_audio_lag result; got {type(lag).__name__} ({exc}).") \
            from None
    fig = _figure(8, 5)
    top, bottom = fig.subplots(2, 1, height_ratios=(3, 2))
    t = np.arange(mouth.shape[0]) / float(fps)
    top.plot(t, _zscore(mouth), color="#c44e52", lw=1.0, label="mouth opening (inner lips / eye width)")
    top.plot(t, _zscore(env), color="#4c72b0", lw=1.0, alpha=0.8, label="speech envelope (log RMS)")
    top.set(xlabel="seconds", ylabel="z score", title="Does the mouth follow the voice?")
    top.legend(loc="upper right", fontsize=8)
    for turn in getattr(turns, "turns", turns) or ():
        colour = TRACK_COLOURS[turn.track % len(TRACK_COLOURS)] if turn.track >= 0 else "0.6"
        top.axvspan(turn.first / fps, (turn.last + 1) / fps, color=colour, alpha=0.2, lw=0)
        top.text(turn.first / fps, 1.0, f" {turn.track}" if turn.track >= 0 else " -", color=colour, va="top",
                 fontsize=8, fontweight="bold", transform=top.get_xaxis_transform())
    bottom.plot(lags, corr, color="#55a868", marker=".", label="correlation r")
    bottom.axvline(best, color="#55a868", ls="--", lw=0.8)
    peak = float(np.max(corr))
    bottom.annotate(f" lag {plural(best, 'frame', spec='+d')}, r {peak:.2f}", (best, peak), fontsize=8, va="bottom")
    bottom.axhline(0, color="0.6", lw=0.5)
    bottom.set(xlabel="lag, frames (+ = sound after mouth)", ylabel="r")
    if callable(getattr(lag, "summary", None)):
        bottom.set_title(lag.summary(), fontsize=7, wrap=True)
    if score is not None:
        twin = bottom.twinx()
        twin.plot(-np.asarray(score.offsets), np.asarray(score.mean_distances), color="#8172b2", lw=1.0,
                  label="SyncNet mean distance")
        twin.set_ylabel("SyncNet distance", color="#8172b2")
    return Chart(fig)


@dataclass(frozen=True, repr=False)
class FpsTable:
    """Speed of several generated clips, one row per clip:
    ``(name, n_frames, wall_s, generation_fps, end_to_end_fps, realtime_factor)``."""

    rows: tuple[tuple[str, int, float, float, float, float], ...]

    HEADERS = ("clip", "frames", "wall (s)", "generation fps", "end-to-end fps", "x real time")

    def __len__(self) -> int:
        return len(self.rows)

    def _cells(self) -> list[list[str]]:
        return [[name, str(n), f"{wall:.2f}", f"{gen:.1f}", f"{e2e:.1f}", f"{rt:.2f}"]
                for name, n, wall, gen, e2e, rt in self.rows]

    def __repr__(self) -> str:
        widths = [max(len(h), *(len(c[i]) for c in self._cells())) for i, h in enumerate(self.HEADERS)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(self.HEADERS, widths, strict=True))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) for cells in self._cells()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return (f"{table_html(self._cells(), self.HEADERS)}<i>Generation fps counts the UNet and VAE decoding only; "
                "end-to-end fps counts the wall clock from audio in to file closed. Real time is 25 fps.</i>")


def fps_table(results: Sequence[Any]) -> FpsTable:
    """A table of the speed of generated clips: ``results`` with ``n_frames``, ``wall_s``, ``generation_fps``,
    ``end_to_end_fps`` and optionally ``output``; InputError when empty or an item lacks them."""
    if not results:
        raise InputError("fps_table needs at least one result (a list of Avatar.generate results).")
    rows = []
    for i, r in enumerate(results):
        try:
            e2e = float(r.end_to_end_fps)
            name = Path(r.output).name if getattr(r, "output", None) else f"clip {i}"
            rows.append((name, int(r.n_frames), float(r.wall_s), float(r.generation_fps), e2e, e2e / 25.0))
        except AttributeError as exc:
            raise InputError(f"results[{i}] is not a generation result ({exc}); pass Avatar.generate "
                             "results.") from None
    return FpsTable(tuple(rows))


def _frames_at(frames: Any, indices: Sequence[int]) -> list[np.ndarray]:
    if isinstance(frames, (str, os.PathLike)):  # a file: decode only the frames shown
        return list(frames_at(frames, indices))
    if isinstance(frames, np.ndarray) and frames.ndim == 3:
        frames = frames[None]
    if hasattr(frames, "__getitem__") and hasattr(frames, "__len__"):
        return [np.asarray(frames[i]) for i in indices]
    wanted = set(indices)  # a streaming reader: read up to the last wanted frame
    out = {i: np.asarray(f) for i, f in enumerate(itertools.islice(frames, max(indices) + 1)) if i in wanted}
    missing = [i for i in indices if i not in out]
    if missing:
        raise InputError(f"frames has fewer frames than asked; missing indices {missing}.")
    return [out[i] for i in indices]


def _track_array(track: Any, names: Sequence[str]) -> np.ndarray | None:
    for name in names:
        value = getattr(track, name, None)
        if value is not None and not callable(value):
            return np.asarray(value)
    return None


def _blend_masks(track: Any, has_face: np.ndarray | None) -> list[Any] | None:
    """An avatar's blend ``(mask, square)`` per frame, None on frames without a face; None without ``masks``."""
    masks, squares = getattr(track, "masks", None), getattr(track, "squares", None)
    if masks is None or squares is None:
        return None
    masks = list(zip(masks, squares, strict=True))
    if has_face is not None and len(masks) == int(has_face.sum()) != len(has_face):
        it = iter(masks)  # one mask per frame with a face: spread them over the frames
        masks = [next(it) if face else None for face in has_face]
    return masks


def _full_mask(mask: Any, square: Sequence[int], shape: tuple[int, int]) -> np.ndarray:
    """A (H, W) float mask in [0, 1]: a blend mask (0..1 or 0..255) placed on its square of the frame."""
    mask = np.asarray(mask, dtype=np.float32)
    if mask.max(initial=0) > 1:
        mask = mask / 255.0
    xs, ys, xe, ye = (int(v) for v in square)
    canvas = np.zeros(shape, np.float32)
    x0, y0, x1, y1 = max(xs, 0), max(ys, 0), min(xe, shape[1]), min(ye, shape[0])
    if x1 > x0 and y1 > y0:
        canvas[y0:y1, x0:x1] = mask[y0 - ys:y1 - ys, x0 - xs:x1 - xs]
    return canvas


def plot_faces(frames: Any, track: Any = None, *, indices: Sequence[int] | None = None, max_frames: int = 4) -> Chart:
    """Frames with their crop boxes, landmarks and blend masks drawn over them, one panel per frame: ``indices``, or
    ``max_frames`` evenly spaced ones.

    ``frames`` is a video or photo path (only the frames shown are decoded), (N, H, W, 3) uint8 BGR frames, a list of
    them, or a frame reader. ``track`` is a face track or an avatar: its ``crop_boxes`` or ``boxes`` (N, 4)
    ``(x1, y1, x2, y2)`` pixels, ``landmarks`` (N, 68, 2) ``(x, y)``, ``has_face`` (N,) and an avatar's blend ``masks``
    over its ``squares`` are drawn when present; face tracks (``pipe.faces(video)``, or a face track's ``tracks``) draw
    every track's detector box in its colour with its number. InputError for no frames or an index out of range."""
    every, track = (track, None) if isinstance(track, FaceTracks) else (getattr(track, "tracks", None), track)
    boxes = _track_array(track, ("crop_boxes", "boxes"))
    landmarks = _track_array(track, ("landmarks",))
    has_face = _track_array(track, ("has_face",))
    masks = _blend_masks(track, has_face)
    n_known = next((len(a) for a in (boxes, landmarks, has_face, masks) if a is not None), None)
    if n_known is None and every is not None:
        n_known = every.n_frames
    elif n_known is None and isinstance(frames, (str, os.PathLike)):
        with VideoReader(frames) as reader:  # frames at 25 fps, as frames_at numbers them
            n_known = reader.frame_count
    elif n_known is None:
        n_known = len(frames) if hasattr(frames, "__len__") else max_frames
    if indices is None:
        count = max(1, min(int(max_frames), n_known))
        indices = sorted({int(round(i)) for i in np.linspace(0, n_known - 1, count)})
    indices = [int(i) for i in indices]
    if not indices or min(indices) < 0 or (n_known and max(indices) >= n_known):
        raise InputError(f"indices must be frame numbers in 0..{n_known - 1}; got {indices}.")
    images = _frames_at(frames, indices)
    aspect = images[0].shape[0] / images[0].shape[1]
    fig = _figure(3.2 * len(images), 3.2 * aspect + 0.5)  # 3.2 inches a frame
    for k, (i, frame) in enumerate(zip(indices, images, strict=True)):
        ax = fig.add_subplot(1, len(images), k + 1)
        ax.imshow(frame[:, :, ::-1])  # BGR -> RGB for display
        face = True if has_face is None else bool(has_face[i])
        material = masks[i] if masks is not None and i < len(masks) else None
        if material is not None:  # red, 45 % opaque where the mask is 1
            mask = _full_mask(*material, frame.shape[:2])
            ax.imshow(np.dstack([np.ones_like(mask), np.zeros_like(mask), np.zeros_like(mask), 0.45 * mask]))
        if face and boxes is not None:
            outline(ax, boxes[i], "#00e000", 1.5)
        for number, box in every.at(i) if every is not None else ():
            colour = TRACK_COLOURS[number % len(TRACK_COLOURS)]
            outline(ax, box, colour, 1.5, linestyle="--")
            ax.text(box[0], box[1] - 2, str(number), color=colour, fontsize=9, fontweight="bold")
        if face and landmarks is not None and np.isfinite(landmarks[i]).all():
            ax.scatter(landmarks[i][:, 0], landmarks[i][:, 1], s=4, c="#00c0ff")
        ax.set_title(f"frame {i}" + ("" if face else " (no face)"), fontsize=9)
        ax.set_axis_off()
    return Chart(fig)
