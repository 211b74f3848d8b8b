"""The face choice of ``InferenceConfig.face``: which face is repainted when a video shows several."""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

__all__ = ["FACE_RULE", "FaceChoice", "parse_face"]

FACE_RULE = ("'largest', 'speaker', a track number (see pipe.faces(video)), a point 'x,y' or a box 'x1,y1,x2,y2' "
             "(x2 > x1, y2 > y1), optionally '@frame' (e.g. '120,80@0')")

_NUMBER = r"\s*(-?\d+(?:\.\d+)?)\s*"
_FACE_AT = re.compile(rf"{_NUMBER}(?:,{_NUMBER}){{1,3}}(?:@\s*(\d+)\s*)?")


@dataclass(frozen=True)
class FaceChoice:
    """A parsed ``InferenceConfig.face``: ``kind`` is ``"largest"``, ``"speaker"``, ``"track"`` (``track``), ``"point"``
    (``point`` = (x, y)) or ``"box"`` (``box`` = (x1, y1, x2, y2)); points and boxes are in frame ``frame``."""

    kind: str
    track: int | None = None
    point: tuple[float, float] | None = None
    box: tuple[float, float, float, float] | None = None
    frame: int = 0

    def __str__(self) -> str:
        if self.kind == "track":
            return f"track {self.track}"
        if self.kind in ("point", "box"):
            at = ",".join(f"{v:g}" for v in (self.point or self.box))  # as typed, without the frame: "120,80"
            return f"the {self.kind} {at} in frame {self.frame}"
        return self.kind


def parse_face(value: Any) -> FaceChoice:
    """Parse a face choice, :data:`FACE_RULE` (a track number as an int or digits; points and boxes in pixels of
    the source frame, frame 0 by default). Raises InputError: anything else."""
    if isinstance(value, str) and value.strip().lower() in ("largest", "speaker"):
        return FaceChoice(value.strip().lower())
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0:
        return FaceChoice("track", track=int(value))
    if isinstance(value, str) and value.strip().isdigit():
        return FaceChoice("track", track=int(value.strip()))
    match = _FACE_AT.fullmatch(value) if isinstance(value, str) else None
    numbers_ = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", value.split("@")[0])] if match else []
    if match and len(numbers_) in (2, 4):
        frame = int(match.group(match.lastindex)) if "@" in value else 0
        if len(numbers_) == 2:
            return FaceChoice("point", point=(numbers_[0], numbers_[1]), frame=frame)
        x1, y1, x2, y2 = numbers_
        if x2 > x1 and y2 > y1:
            return FaceChoice("box", box=(x1, y1, x2, y2), frame=frame)
    raise InputError(f"face must be {FACE_RULE}; got {value!r}.")
