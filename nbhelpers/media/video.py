"""Reading video: frames at a constant 25 fps, photos as one frame, upright and without alpha."""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

from ..constants import FPS
from ..errors import FFmpegError, InputError, plural
from .ffmpeg import QUIET, _existing_file, _passthrough, _Process, _run, _tail, ffmpeg_exe
from .probing import MediaInfo, _fps_text, probe

# EXIF orientation -> (row step, column step) after the transpose of orientations 5-8
_EXIF_STEPS = {2: (1, -1), 3: (-1, -1), 4: (-1, 1), 5: (1, 1), 6: (1, -1), 7: (-1, -1), 8: (-1, 1)}


def _apply_orientation(frames: np.ndarray, orientation: int) -> np.ndarray:
    """Turn (N, H, W, C) stored pixels upright for an EXIF orientation (Pillow's ``ImageOps.exif_transpose``)."""
    if orientation not in _EXIF_STEPS:
        return frames
    rows, cols = _EXIF_STEPS[orientation]
    out = frames.transpose(0, 2, 1, 3) if orientation >= 5 else frames
    return np.ascontiguousarray(out[:, ::rows, ::cols])


def _flatten_alpha(bgra: np.ndarray, background: tuple[int, int, int]) -> np.ndarray:
    """(..., 4) uint8 BGRA (straight alpha) over an opaque BGR colour -> (..., 3) uint8 BGR, rounded to nearest."""
    alpha = bgra[..., 3:4].astype(np.uint16)
    colour = bgra[..., :3].astype(np.uint16)
    bg = np.asarray(background, dtype=np.uint16)
    return ((colour * alpha + bg * (255 - alpha) + 127) // 255).astype(np.uint8)


def no_video_error(path: Path, info: MediaInfo) -> InputError:
    """The error for a ``video`` argument whose file (probed as ``info``) has no video stream."""
    what = "an audio file" if info.has_audio else "a file with no picture"
    return InputError(f"video {str(path)!r} is {what} (container {info.container!r}, no video stream). Give a "
                      "video or photo of a face; a speech file goes in as the audio.")


def _check_fps(fps) -> Fraction:
    try:
        value = Fraction(fps) if not isinstance(fps, float) else Fraction(fps).limit_denominator(1001)
    except (TypeError, ValueError, ZeroDivisionError):
        value = None
    if value is None or value <= 0 or isinstance(fps, bool):
        raise InputError(f"fps must be a positive number of frames per second (MuseTalk uses {FPS}); got {fps!r}.")
    return value


def _check_count(name: str, n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InputError(f"{name} must be an integer >= 1; got {n!r}.")


class _FrameStream:
    """One decode of a video through an ffmpeg pipe; reads whole frames."""

    def __init__(self, reader: VideoReader, extra_filter: str | None = None, max_frames: int | None = None):
        self.reader = reader
        self.channels = 4 if reader.has_alpha else 3
        self.width, self.height = reader._decoded_size
        self.frame_bytes = self.width * self.height * self.channels
        self.proc = _Process(reader._command(extra_filter, max_frames))
        self.done = False
        self.count = 0

    def read(self, n: int) -> np.ndarray:
        r = self.reader
        out = np.empty((n, self.height, self.width, self.channels), dtype=np.uint8)
        if self.done:
            return np.empty((0, r.height, r.width, 3), dtype=np.uint8)
        view = memoryview(out).cast("B")
        filled, want = 0, n * self.frame_bytes
        while filled < want and (got := self.proc.popen.stdout.readinto(view[filled:])):
            filled += got
        frames = filled // self.frame_bytes
        self.count += frames
        if filled < want:
            self.done = True
            if self.proc.wait() != 0:
                raise self.proc.error(f"ffmpeg failed while decoding {str(r.path)!r} after "
                                      f"{plural(self.count, 'frame')}.")
            if filled % self.frame_bytes:
                raise self.proc.error(
                    f"ffmpeg returned a partial frame from {str(r.path)!r} ({filled % self.frame_bytes} of "
                    f"{self.frame_bytes} bytes); the frame size changed mid-stream? Convert the clip first with "
                    "nbhelpers.media.convert_to_25fps().")
            self.close()
        out = out[:frames]
        if self.channels == 4:
            out = _flatten_alpha(out, r.background)
        return _apply_orientation(out, r.info.exif_orientation)

    def close(self) -> None:
        self.done = True
        self.proc.kill()


class VideoReader(contextlib.AbstractContextManager):
    """Frames of a video (or one photo) at a constant frame rate, streamed from an ffmpeg pipe.

    Iterating yields ``(H, W, 3) uint8`` BGR frames from the first, each ``iter()`` with its own decode;
    :meth:`read_batch` reads from a separate cursor. Use it as a context manager to stop ffmpeg. The ``fps`` filter
    re-times frames by their timestamps, so any source rate gives ``round(D * fps)`` frames (D the end of the last
    source frame); phone clips are turned upright; alpha is composited over ``background`` (BGR, 3 ints 0-255) as
    ``round((colour * a + background * (255 - a)) / 255)``; a photo is one frame, its EXIF orientation applied. ``fps``
    is kept as a Fraction, ``info`` is the source's :class:`MediaInfo`, ``width`` and ``height`` (pixels) are upright.
    Raises InputError: missing file, no video stream, or a bad ``fps``/``background``; FFmpegError: ffmpeg cannot read
    the file."""

    def __init__(self, path, fps=FPS, *, background=(0, 0, 0)):
        self.path = _existing_file(path, "video")
        self.fps = _check_fps(fps)
        try:
            self.background = tuple(int(v) for v in background)
        except (TypeError, ValueError):
            self.background = ()
        if len(self.background) != 3 or any(not 0 <= v <= 255 for v in self.background):
            raise InputError(f"background must be a BGR colour of 3 integers in 0-255, e.g. (0, 0, 0) for black; "
                             f"got {background!r}.")
        self._exe = ffmpeg_exe()
        self.info = probe(self.path, count_frames=False)
        if not self.info.has_video:
            raise no_video_error(self.path, self.info)
        if not self.info.width or not self.info.height:
            raise InputError(f"video: ffmpeg reports no frame size for {str(self.path)!r}; convert it to MP4 first.")
        self.width, self.height = self.info.width, self.info.height
        fmt = self.info.pix_fmt or ""
        self.has_alpha = fmt == "pal8" or fmt.startswith(("ya", "yuva", "gbrap", "rgba", "bgra", "argb", "abgr"))
        stored = self.info.video_stream
        # what ffmpeg delivers: upright for videos (autorotation), as stored for stills (EXIF applied by us)
        self._decoded_size = (stored.width, stored.height) if self.info.is_image else (self.width, self.height)
        self._count: int | None = 1 if self.info.is_image else None
        self._cursor: _FrameStream | None = None
        self._streams: set[_FrameStream] = set()

    def _command(self, extra_filter: str | None = None, max_frames: int | None = None, null: bool = False):
        args = [self._exe, *QUIET]
        if self.info.is_image:
            args.append("-noautorotate")  # recent ffmpeg turns JPEGs by EXIF, older does not: we do it ourselves
        args += ["-i", str(self.path), "-map", f"0:{self.info.video_stream.index}"]
        chain = [f"fps={self.fps.numerator}/{self.fps.denominator}"] if not self.info.is_image else []
        chain += [extra_filter] if extra_filter else []
        if chain:
            args += ["-vf", ",".join(chain)]
        if self.info.is_image:
            max_frames = 1 if max_frames is None else min(max_frames, 1)
        if max_frames is not None:
            args += ["-frames:v", str(max_frames)]
        args += _passthrough(self._exe)
        if null:
            return args + ["-f", "null", "-progress", "pipe:1", "-"]
        return args + ["-f", "rawvideo", "-pix_fmt", "bgra" if self.has_alpha else "bgr24", "pipe:1"]

    @property
    def frame_count(self) -> int:
        """Exact number of frames this reader yields (1 for a photo); for a video the first access runs one counting
        decode (``-vf fps=25 -f null``) unless a completed iteration has recorded it."""
        if self._count is None:
            rc, out, err = _run(self._command(null=True), "count frames")
            found = re.findall(rb"^frame=\s*(\d+)", out, flags=re.MULTILINE)
            if rc != 0 or not found:
                raise FFmpegError(f"ffmpeg could not decode {str(self.path)!r} to count its frames.",
                                  args_list=self._command(null=True), returncode=rc, stderr_tail=_tail(err))
            self._count = int(found[-1])
        return self._count

    def __len__(self) -> int:
        return self.frame_count

    def _open(self, extra_filter: str | None = None, max_frames: int | None = None) -> _FrameStream:
        stream = _FrameStream(self, extra_filter, max_frames)
        self._streams.add(stream)
        return stream

    def _release(self, stream: _FrameStream) -> None:
        stream.close()
        self._streams.discard(stream)

    def iter_batches(self, batch_size: int = 16) -> Iterator[np.ndarray]:
        """Yield ``(n, H, W, 3) uint8`` BGR batches of ``batch_size`` (>= 1) frames, the last shorter, from the first;
        FFmpegError when ffmpeg fails while decoding."""
        _check_count("batch_size", batch_size)
        stream = self._open()
        try:
            while True:
                batch = stream.read(batch_size)
                if len(batch):
                    yield batch
                if len(batch) < batch_size:
                    break
            self._count = stream.count
        finally:
            self._release(stream)

    def __iter__(self) -> Iterator[np.ndarray]:
        frame_bytes = self.width * self.height * (4 if self.has_alpha else 3)
        for batch in self.iter_batches(max(1, min(8, (64 << 20) // frame_bytes))):  # <= 64 MiB per read
            yield from batch

    def read_batch(self, n: int) -> np.ndarray:
        """The next ``n`` (>= 1) frames from the reader's cursor: ``(n', H, W, 3) uint8`` BGR, ``n' == 0`` at the end;
        FFmpegError when ffmpeg fails while decoding."""
        _check_count("n", n)
        if self._cursor is None:
            self._cursor = self._open()
        batch = self._cursor.read(n)
        if self._cursor.done:
            if self._count is None and len(batch) < n:
                self._count = self._cursor.count
            self._streams.discard(self._cursor)
        return batch

    def close(self) -> None:
        """Stop every ffmpeg this reader started. Safe to call twice."""
        for stream in list(self._streams):
            self._release(stream)
        self._cursor = None

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - GC safety net
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        count = self._count if self._count is not None else "?"
        kind = "photo" if self.info.is_image else "video"
        return (f"VideoReader({self.path.name!r}, {kind}, {self.width}x{self.height} px, {_fps_text(self.fps)} fps, "
                f"frames={count})")


def load_video(path, fps=FPS, *, background=(0, 0, 0)) -> VideoReader:
    """Open a video or a photo as a :class:`VideoReader` of upright BGR frames at constant ``fps`` (MuseTalk: 25);
    raises as :class:`VideoReader` does (InputError for bad input, FFmpegError when ffmpeg cannot read the file).
    Source: ``inference.py:120-126`` keeps the source fps, so other rates drift (quirk Q8); ``app.py:432-472`` re-times
    uploads to 25 fps, as this always does."""
    return VideoReader(path, fps, background=background)


def frames_at(path, indices: Sequence[int], fps=FPS, *, background=(0, 0, 0)) -> np.ndarray:
    """``(len(indices), H, W, 3) uint8`` BGR: the frames numbered ``indices`` at ``fps`` (any order, repeats allowed),
    as iteration yields them, decoded without piping the others. Raises InputError for an index that is negative,
    not an integer, or past the last frame, and FFmpegError when ffmpeg fails."""
    wanted = list(indices)
    if not wanted:
        raise InputError("indices must name at least one frame number; got an empty list.")
    for i in wanted:
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or i < 0:
            raise InputError(f"indices must be integers >= 0 (frame numbers at {fps} fps); got {i!r}.")
    unique = sorted({int(i) for i in wanted})
    with VideoReader(path, fps, background=background) as reader:
        if len(unique) <= 200:  # the stream stops with the reader
            expr = "+".join(f"eq(n\\,{i})" for i in unique)
            got = reader._open(f"select={expr}", max_frames=len(unique)).read(len(unique))
        else:
            keep = set(unique)
            picked = [frame for n, frame in enumerate(itertools.islice(reader, unique[-1] + 1)) if n in keep]
            got = np.stack(picked) if picked else np.empty((0, reader.height, reader.width, 3), np.uint8)
        if len(got) < len(unique):
            count = reader.frame_count
            raise InputError(f"indices: frame {unique[len(got)]} is past the last frame of {str(reader.path)!r}, which "
                             f"has {plural(count, 'frame')} at {_fps_text(reader.fps)} fps (valid: 0-{count - 1}).")
    position = {i: k for k, i in enumerate(unique)}
    return got[[position[int(i)] for i in wanted]]


def read_frame(path, index: int = 0, fps=FPS, *, background=(0, 0, 0)) -> np.ndarray:
    """One ``(H, W, 3) uint8`` BGR frame of a video or photo, number ``index`` at ``fps``; errors as
    :func:`frames_at`."""
    return frames_at(path, [index], fps, background=background)[0]
