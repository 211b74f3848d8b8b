"""Face detections remembered per video, so that a pipeline finds the faces of one video once.

:class:`DetectionMemory` keeps what a backend found in each frame, keyed by the video's content (SHA-256) and the
backend's name; crop boxes are computed from them again, so ``bbox_shift``, ``extra_margin``, the version and the
smoothing can change between jobs. :meth:`DetectionMemory.wrap` hands a job a backend that asks the real one only
about frames not seen before.
"""

from __future__ import annotations

import inspect
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..hashing import sha256_file
from .base import FaceResult

VIDEOS_KEPT = 8  # videos whose detections a pipeline keeps (the oldest used is dropped first)


class DetectionMemory:
    """What landmark backends found per frame of the videos a pipeline has seen (up to :data:`VIDEOS_KEPT`);
    ``detected`` counts the frames the real backends were asked about through :meth:`wrap`."""

    def __init__(self):
        self._found: OrderedDict[tuple[str, str], dict[int, FaceResult | None]] = OrderedDict()
        self._digests: dict[tuple[str, int, int], str] = {}
        self.detected = 0

    def digest(self, video: str | os.PathLike) -> str:
        """The SHA-256 of ``video``'s content, read once while its size and modification time stay the same."""
        path = Path(video).resolve()
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = sha256_file(path)
        return self._digests[key]

    def frames(self, video: str | os.PathLike, backend_name: str) -> dict[int, FaceResult | None]:
        """The remembered detections of ``video`` by ``backend_name``, by frame index (made empty when new)."""
        key = (self.digest(video), str(backend_name))
        found = self._found.setdefault(key, {})
        self._found.move_to_end(key)
        while len(self._found) > VIDEOS_KEPT:
            self._found.popitem(last=False)
        return found

    def wrap(self, backend: Any, video: str | os.PathLike, first: int = 0) -> Any:
        """``backend`` (an object, or the ``"auto"`` of boxes given, returned as is) made to remember: the frames
        handed to its ``detect`` are taken as frames ``first, first + 1, ...`` of ``video``."""
        if isinstance(backend, str):
            return backend
        return RememberingBackend(backend, self.frames(video, getattr(backend, "name", type(backend).__name__)),
                                  first, self)

    def clear(self) -> None:
        """Forget every detection (the backends move to another device, whose numbers may differ slightly)."""
        self._found.clear()


class RememberingBackend:
    """A landmark backend in front of another: frames it has seen are answered from ``found``, the others asked of
    the real backend (in one call, in order) and remembered. Frames are numbered from ``first`` in call order."""

    def __init__(self, backend: Any, found: dict[int, FaceResult | None], first: int, memory: DetectionMemory):
        self.backend, self.found, self.next, self.memory = backend, found, int(first), memory

    def __getattr__(self, name: str) -> Any:  # name, reason, accepts_frames_device, batch sizes: the real backend's
        return getattr(self.backend, name)

    def detect(self, frames: Any, frames_device: Any = None, choose: Any = None) -> list[FaceResult | None]:
        indices = range(self.next, self.next + len(frames))
        if choose is not None:  # a chosen face (nbhelpers.faces.tracks) depends on the choice: asked, not remembered
            if "choose" not in inspect.signature(self.backend.detect).parameters:
                raise InputError(f"landmark backend {getattr(self.backend, 'name', self.backend)!r} gives one face "
                                 "per frame, so a face cannot be chosen; use a built-in backend.")
            self.next += len(frames)
            extra = {} if frames_device is None else {"frames_device": frames_device}
            return self.backend.detect(frames, choose=choose, **extra)
        missing = [k for k, i in enumerate(indices) if i not in self.found]
        if missing:
            pick = missing if len(missing) < len(frames) else slice(None)
            extra = {} if frames_device is None else {"frames_device": frames_device[pick]}
            for k, result in zip(missing, self.backend.detect(frames[pick], **extra), strict=True):
                self.found[indices[k]] = result
            self.memory.detected += len(missing)
        self.next += len(frames)
        return [self.found[i] for i in indices]

    def close(self) -> None:
        """Nothing: the real backend belongs to whoever made it."""


__all__ = ["VIDEOS_KEPT", "DetectionMemory", "RememberingBackend"]
