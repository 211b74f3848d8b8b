"""The report of a live session: when its frames came out, how late, idle or starved, and frame 0's latency in parts."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LiveStats:
    """Counters of one live session (what :class:`~nbhelpers.result.ClipResult` ``.stats`` reports).

    ``*_t`` are times in seconds of the session's clock: the first push, frame 0 handed out, every frame emitted, and
    frame 0's group started, its tokens ready and it rendered. ``late``: frames handed out more than half a frame
    period after their time; ``idle``: silent frames; ``starved``: frames whose audio came too late (silence added);
    ``whisper_passes``: encoder forwards (the warm-up's not counted)."""

    first_push_t: float | None = None
    first_frame_t: float | None = None
    emit_t: list[float] = field(default_factory=list)
    late: int = 0
    max_late_s: float = 0.0
    idle: int = 0
    starved: int = 0
    whisper_passes: int = 0
    first_ready_t: float | None = None
    first_tokens_t: float | None = None
    first_rendered_t: float | None = None

    def first_frame_breakdown(self) -> dict[str, float]:
        """Frame 0's latency in parts, seconds (NaN where not reached): ``wait`` (for its audio and the worker),
        ``whisper`` (log-mel, encoder, token gather), ``render`` (UNet, VAE decode, blend, copy to the host) and
        ``handout`` (pacing, callbacks of earlier frames)."""
        marks = [self.first_push_t, self.first_ready_t, self.first_tokens_t, self.first_rendered_t, self.first_frame_t]
        return {name: float(t1 - t0) if t0 is not None and t1 is not None else float("nan")
                for name, t0, t1 in zip(("wait", "whisper", "render", "handout"), marks, marks[1:], strict=False)}

    def as_dict(self) -> dict[str, float]:
        """Plain numbers: first_frame_latency_s, sustained_fps, late_frames, max_late_s, idle_frames,
        starved_frames, whisper_passes and ``first_frame_<part>_s`` (:meth:`first_frame_breakdown`)."""
        n = len(self.emit_t)
        span = self.emit_t[-1] - self.emit_t[0] if n > 1 else 0.0
        latency = (self.first_frame_t - self.first_push_t) if self.first_frame_t is not None \
            and self.first_push_t is not None else float("nan")
        return {"first_frame_latency_s": float(latency),
                "sustained_fps": float((n - 1) / span) if span > 0 else float("nan"),
                "late_frames": int(self.late), "max_late_s": float(self.max_late_s), "idle_frames": int(self.idle),
                "starved_frames": int(self.starved), "whisper_passes": int(self.whisper_passes),
                **{f"first_frame_{k}_s": v for k, v in self.first_frame_breakdown().items()}}
