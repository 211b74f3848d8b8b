"""Figures of 06_inside_musetalk: one array of :mod:`nbhelpers.reference` per figure, BGR frames shown as RGB."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import faces, reference
from ..config import PARSING_MODES
from ..errors import plural
from ..media import cut_audio, load_audio, load_video
from .panel import widgets_available
from .plots import Chart, _figure, bars, outline

__all__ = ["Comparison", "compare_frames", "crop_box_explorer", "cut_speech", "first_frames", "plot_stage_ms",
           "show_crop", "show_face", "show_images", "show_latents", "show_parsing", "show_paste", "show_whisper"]


def _array(x: Any) -> np.ndarray:
    """A torch tensor or array as a float/uint8 NumPy array on the CPU."""
    return x.detach().float().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def show_images(images: Sequence[np.ndarray], titles: Sequence[str], title: str = "") -> Chart:
    """BGR images (or 2-D arrays, in grey) side by side, each with its title."""
    fig = _figure(3.2 * len(images), 3.6)
    fig.suptitle(title)
    for ax, image, name in zip(fig.subplots(1, len(images), squeeze=False)[0], images, titles, strict=True):
        image = _array(image)
        ax.imshow(image[:, :, ::-1] if image.ndim == 3 else image, cmap="gray")
        ax.set_title(name, fontsize=9)
        ax.set(xticks=[], yticks=[])
    return Chart(fig)


def show_face(frame: np.ndarray, found: Any, box: Sequence[int] | None) -> Chart:
    """The frame with the detector's box (blue), the 68 landmarks (landmark 29, the nose bridge, in red) and the
    crop box (green)."""
    fig = _figure(6, 6 * frame.shape[0] / frame.shape[1])
    ax = fig.add_subplot()
    ax.imshow(frame[:, :, ::-1])
    if found is not None:
        outline(ax, np.asarray(found.face_box).reshape(4), "#4c72b0", label="detector box")
        lms = np.asarray(found.landmarks).reshape(68, 2)
        ax.scatter(lms[:, 0], lms[:, 1], s=6, c="yellow", label="68 landmarks")
        ax.scatter(*lms[29], s=30, c="red", label="landmark 29")
    if box is not None:
        outline(ax, box, "#2ca02c", label="crop box")
    ax.set(title="no face found" if found is None else f"crop box {tuple(int(v) for v in box)}", xticks=[], yticks=[])
    ax.legend(loc="lower right", fontsize=8)
    return Chart(fig)


def crop_box_explorer(frame: np.ndarray, found: Any, config: Any) -> Any:
    """:func:`show_face` with ``bbox_shift`` and ``extra_margin`` sliders (ipywidgets); a plain figure without them."""
    def draw(bbox_shift: int = config.bbox_shift, extra_margin: int = config.extra_margin) -> Chart:
        box = None if found is None else faces.crop_box(np.asarray(found.landmarks).reshape(68, 2), found.face_box,
                                                        frame.shape, config.version, bbox_shift, extra_margin)
        return show_face(frame, found, box)

    if not widgets_available():
        return draw()
    import ipywidgets as w
    from IPython.display import display

    return w.interactive(lambda bbox_shift, extra_margin: display(draw(bbox_shift, extra_margin)),
                         bbox_shift=w.IntSlider(config.bbox_shift, -40, 40, description="bbox_shift"),
                         extra_margin=w.IntSlider(config.extra_margin, 0, 60, description="extra_margin"))


def show_crop(crop: np.ndarray) -> Chart:
    """The 256 x 256 crop and the masked copy the UNet gets, its lower half (the mouth) black."""
    masked = crop.copy()
    masked[crop.shape[0] // 2:] = 0
    return show_images([crop, masked], ["crop, 256 x 256 (reference)", "lower half masked"], "What the VAE encodes")


def show_latents(latent: Any, output: Any = None) -> Chart:
    """The 8 input channels (4 of the masked crop, 4 of the whole crop) and, when given, the UNet's 4 output
    channels, each a 32 x 32 image."""
    rows = [("masked crop", _array(latent)[0, :4]), ("whole crop", _array(latent)[0, 4:])]
    if output is not None:
        rows.append(("UNet output", _array(output)[0]))
    fig = _figure(8, 2.1 * len(rows))
    for r, (name, channels) in enumerate(rows):
        for c, channel in enumerate(channels):
            ax = fig.add_subplot(len(rows), 4, 4 * r + c + 1)
            ax.imshow(channel, cmap="coolwarm")
            ax.set_title(f"{name}, channel {c}", fontsize=8)
            ax.set(xticks=[], yticks=[])
    return Chart(fig)


def show_whisper(states: Any, t: int) -> Chart:
    """Whisper's last hidden state as a heat map (time across, 384 features down) with frame ``t``'s 10 encoder
    frames (its window) outlined."""
    last = _array(states)[:, -1].T
    fig = _figure(9, 3)
    ax = fig.add_subplot()
    ax.imshow(last, aspect="auto", cmap="magma", extent=(-0.5, last.shape[1] - 0.5, last.shape[0], 0))
    idx = reference.window_frames(t)
    ax.axvspan(idx[0] - 0.5, idx[-1] + 0.5, fill=False, edgecolor="cyan", linewidth=2, label=f"frame {t}'s window")
    ax.set(xlabel="encoder frame (20 ms each)", ylabel="feature",
           title=f"whisper features, {last.shape[1]} encoder frames; outside the speech the window reads zeros",
           xlim=(min(idx[0], 0) - 1, max(idx[-1], last.shape[1]) + 1))
    ax.legend(loc="upper right", fontsize=8)
    return Chart(fig)


def show_parsing(labels: np.ndarray, box: Sequence[int], config: Any) -> Chart:
    """BiSeNet's labels over the square around the face, and the blend mask of each ``parsing_mode``."""
    masks = [reference.blend_mask(labels, box, config.replace(parsing_mode=m)) for m in PARSING_MODES]
    fig = _figure(3.2 * (1 + len(masks)), 3.6)
    axes = fig.subplots(1, 1 + len(masks))
    axes[0].imshow(labels, cmap="tab20", interpolation="nearest")
    axes[0].set_title("parsing labels", fontsize=9)
    for ax, mode, mask in zip(axes[1:], PARSING_MODES, masks, strict=True):
        ax.imshow(mask, cmap="gray", vmin=0, vmax=255)
        ax.set_title(f"blend mask, parsing_mode={mode!r}", fontsize=9)
    for ax in axes:
        ax.set(xticks=[], yticks=[])
    return Chart(fig)


def show_paste(frame: np.ndarray, pasted: np.ndarray, box: Sequence[int]) -> Chart:
    """Around the crop box: the original, the pasted frame, and their difference (x4, so small changes show)."""
    x1, y1, x2, y2 = box
    pad = max(x2 - x1, y2 - y1) // 3
    h, w = frame.shape[:2]
    cut = np.s_[max(y1 - pad, 0):min(y2 + pad, h), max(x1 - pad, 0):min(x2 + pad, w)]
    diff = np.abs(pasted.astype(np.int16) - frame.astype(np.int16)).max(axis=2)
    return show_images([frame[cut], pasted[cut], np.minimum(diff[cut] * 4, 255)],
                       ["original", "pasted", f"difference x4 (max {int(diff.max())} levels)"])


@dataclass(frozen=True)
class Comparison:
    """The reference loop's frames against the engine's: the largest difference and the seconds per frame."""

    frames: int
    max_levels: int
    reference_s: float
    engine_s: float

    def __repr__(self) -> str:
        speed = self.reference_s / max(self.engine_s, 1e-9)
        verdict = "equal within 1 level" if self.max_levels <= 1 else "DIFFERENT"
        return (f"{plural(self.frames, 'frame')}, {verdict} (largest difference {plural(self.max_levels, 'level')}); "
                f"reference loop {1000 * self.reference_s / self.frames:.0f} ms per frame, engine "
                f"{1000 * self.engine_s / self.frames:.0f} ms per frame: the engine is {speed:.1f}x as fast")


def compare_frames(reference_frames: Sequence[np.ndarray], engine_frames: Mapping[int, np.ndarray],
                   reference_s: float, engine_s: float) -> Comparison:
    """:class:`Comparison` of the loop's frames and the engine's (``{t: frame}``, as a frame callback collects)."""
    worst = max(int(np.abs(a.astype(np.int16) - engine_frames[t].astype(np.int16)).max())
                for t, a in enumerate(reference_frames))
    return Comparison(len(reference_frames), worst, reference_s, engine_s)


def plot_stage_ms(timings: Mapping[str, float], n_frames: int) -> Chart:
    """Milliseconds per output frame of each stage of the reference loop (``timings`` of ``reference.lipsync``)."""
    ms = np.array([1000 * timings[k] / n_frames for k in timings])
    return bars(list(timings), ms, [f" {v:.0f}" for v in ms], "ms per frame",
                f"Reference loop, ms per frame per stage (total {ms.sum():.0f})", max(ms.max() * 1.2, 1e-3))


def cut_speech(audio: str | Path, seconds: float, path: str | Path) -> tuple[np.ndarray, Path]:
    """The first ``seconds`` of ``audio`` written as a 16-bit WAV at ``path`` (:func:`nbhelpers.media.cut_audio`),
    and that file's 16 kHz waveform (what the engine reads from it)."""
    path = cut_audio(audio, seconds, path)
    return load_audio(path), path


def first_frames(video: str | Path, n: int) -> list[np.ndarray]:
    """The first ``n`` frames of ``video`` at 25 fps (fewer when it is shorter): all that ``n`` output frames use."""
    return list(itertools.islice(load_video(video), n))
