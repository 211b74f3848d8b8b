"""Which face is repainted: the face choice of ``InferenceConfig.face`` and a crop box given by hand."""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

__all__ = ["FACE_RULE", "FaceChoice", "parse_box", "parse_face"]

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
    coords = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", value.split("@")[0])] if match else []
    if match and len(coords) in (2, 4):
        frame = int(match.group(match.lastindex)) if "@" in value else 0
        if len(coords) == 2:
            return FaceChoice("point", point=(coords[0], coords[1]), frame=frame)
        x1, y1, x2, y2 = coords
        if x2 > x1 and y2 > y1:
            return FaceChoice("box", box=(x1, y1, x2, y2), frame=frame)
    raise InputError(f"face must be {FACE_RULE}; got {value!r}.")


def parse_box(value: Any, name: str = "box", shown: str | None = None) -> tuple[int, int, int, int]:
    """A crop box given by hand (``"x1,y1,x2,y2"``, bare or in brackets as Python writes it, or a sequence) as four
    whole source pixels; InputError (led by ``name``, the box written as ``shown``, default ``name 'value'``) unless
    four finite numbers, x1 < x2 and y1 < y2."""
    parts = value.strip(" ()[]").replace(" ", "").split(",") if isinstance(value, str) else value
    try:
        if isinstance(parts, (str, bytes, Mapping)) or any(isinstance(v, bool) for v in parts):
            raise TypeError
        coords = [float(v) for v in parts]
        box = tuple(int(round(v)) for v in coords) if all(map(math.isfinite, coords)) else ()
    except (TypeError, ValueError, OverflowError):
        box = ()
    if len(box) != 4:
        raise InputError(f"{name} must be four finite numbers x1,y1,x2,y2 in source pixels; got {value!r}.")
    if not (box[0] < box[2] and box[1] < box[3]):
        raise InputError(f"{shown or f'{name} {value!r}'} is inverted: x1,y1 is the top-left corner and x2,y2 the "
                         "bottom-right one, so x1 < x2 and y1 < y2.")
    return box
