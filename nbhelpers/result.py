"""The one result type of every clip the package writes (offline job, avatar clip, stream), shown in notebooks."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .constants import FPS
from .display import table_html, video_html
from .errors import plural


@dataclass(frozen=True)
class ClipResult:
    """What one clip produced, how and how fast; in a notebook it shows a summary line, the timings and the video.

    Attributes:
        output: The finished MP4 (25 fps, source resolution, the input audio muxed in), or None when nothing was
            written (an avatar clip with ``output=False``, a stream).
        n_frames: Output frames, ``floor(audio seconds x 25)``, the last included.
        source_frames: 25 fps source frames the clip cycled over (1 for a photo; the offline job decodes only
            ``min(n_frames, frames in the video)``).
        no_face_frames: Source frames without a face; they pass through unchanged.
        fps, duration_s: Output frame rate (25) and audio duration in seconds (a live session: its frames' seconds,
            ``n_frames / 25``).
        config: The settings used, with the planner's reasons in ``config.reasons``.
        backend: Landmark backend that found the faces (``"boxes"`` when boxes were given).
        timings: Seconds per stage, in the order they ran (media, faces, models, audio, latents, parsing, generate,
            blend, encode_wait...).
        wall_s: Wall-clock seconds from the call to the closed file.
        kind: ``"lipsync"``, ``"avatar"``, ``"stream"`` or ``"preview"``.
        notes: Lines for the user (e.g. that the weights are random test weights).
        stats: For a stream: first_frame_latency_s, sustained_fps, late_frames, max_late_s, idle_frames,
            starved_frames, whisper_passes. For the offline job on a GPU with ``NBHELPERS_STAGE_MEMORY=1``:
            ``peak_gib_<stage>``, peak GPU memory per stage in GiB. Else empty.
        turns: With ``face="speaker"``: which track spoke in which output frames (``faces.speaker.Turn``), for
            :func:`nbhelpers.ui.plot_sync`.
    """

    output: Path | None
    n_frames: int
    source_frames: int
    no_face_frames: int
    fps: int
    duration_s: float
    config: Any
    backend: str
    timings: dict[str, float]
    wall_s: float
    kind: str = "lipsync"
    notes: tuple[str, ...] = field(default=())
    stats: dict[str, float] = field(default_factory=dict)
    turns: tuple[Any, ...] = ()

    @property
    def end_to_end_fps(self) -> float:
        """Output frames per wall-clock second, everything included."""
        return self.n_frames / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def generation_fps(self) -> float:
        """Output frames per second of UNet + VAE decode alone."""
        s = self.timings.get("generate", 0.0)
        return self.n_frames / s if s > 0 else float("nan")

    @property
    def realtime_factor(self) -> float:
        """End-to-end fps / 25: above 1 is faster than real time."""
        return self.end_to_end_fps / FPS

    def summary(self) -> str:
        """One line: what was written, how, and how fast."""
        c = self.config
        precision = "fp16" if c.fp16 else "fp32"
        name = self.output.name if self.output is not None else "(not written)"
        seconds = f"{self.n_frames / self.fps:.2f} s" if self.fps else f"{self.duration_s:.2f} s"
        audio = f"{self.duration_s:.2f} s"  # the muxed audio runs up to one frame past the last frame
        seconds += f", audio {audio}" if audio != seconds else ""
        text = (f"{name}: {plural(self.n_frames, 'frame')} at {self.fps} fps ({seconds}), source "
                f"{plural(self.source_frames, 'frame')}, {self.no_face_frames} without a face; {c.version}, "
                f"{precision}, batch {c.batch_size}, {c.device}; landmarks: {self.backend}; {self.wall_s:.1f} s wall "
                f"({self.end_to_end_fps:.1f} fps end to end, {self.realtime_factor:.2f}x real time)")
        if self.kind == "stream" and self.stats:
            st = self.stats
            text += (f"; live: first frame {st.get('first_frame_latency_s', float('nan')) * 1000:.0f} ms after the "
                     f"first push, {st.get('sustained_fps', float('nan')):.1f} fps sustained, "
                     f"{st.get('late_frames', 0)} late, {st.get('idle_frames', 0)} idle, "
                     f"{st.get('starved_frames', 0)} starved (none dropped)")
        return " ".join([text, *self.notes])

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        table = table_html((k, f"{v:.3f} s") for k, v in self.timings.items())
        try:
            player = video_html(self.output) if self.output is not None else ""
        except Exception:  # noqa: BLE001 - the summary is still useful without the player
            player = ""
        return f"<p>{html.escape(self.summary())}</p>{table}{player}"


__all__ = ["ClipResult"]
