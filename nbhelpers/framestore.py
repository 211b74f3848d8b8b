"""Random access to the 25 fps frames of a clip without holding them in RAM, within a checked disk budget.

The ping-pong cycle (§4.5) needs random access to frames that may not fit in RAM (quirk Q25): a :class:`FrameStore`
writes them to one raw file in the temporary folder, mapped back with ``numpy.memmap``, its folder ``flock``-held;
a new store removes the folders nobody holds (:func:`remove_stale_frames`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from .constants import FPS, SAMPLE_RATE
from .errors import DiskSpaceError

DISK_RESERVE_BYTES = 1 << 30  # left free beside the raw frames (the output file and the system need room too)
PREFIX = "nbhelpers-frames-"  # a store's own folder in the temporary folder
LOCK_NAME = "owner.lock"  # held (flock) by the process of the store, released by the kernel when it ends
NO_LOCK_NAME = "owner.nolock"  # its file system refused the lock: only its own store removes it
UNLOCKED_AGE_S = 3600.0  # a folder without a lock file (an older version's, or one killed as it was made)


class FrameStore(contextlib.AbstractContextManager):
    """``height`` x ``width`` uint8 BGR frames kept in a raw file in a new temporary folder (``directory``):
    :meth:`append` while decoding, :meth:`finish`, then ``store[i]`` and ``store[list]``. The folder goes at
    :meth:`close`, garbage collection or exit. DiskSpaceError when the disk fills up (the frames are removed)."""

    def __init__(self, height: int, width: int):
        self.height, self.width = int(height), int(width)
        with contextlib.suppress(Exception):  # clearing what others left must never stop this store
            remove_stale_frames()
        self.directory = Path(tempfile.mkdtemp(prefix=PREFIX))
        lock = _hold_lock(self.directory)
        self.path = self.directory / "frames.u8"
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed in finish()
        self._n = 0
        self._array: np.memmap | None = None
        self._finalizer = weakref.finalize(self, _remove, self.directory, lock)

    @property
    def frame_shape(self) -> tuple[int, int, int]:
        """(H, W, 3)."""
        return (self.height, self.width, 3)

    def append(self, frame: np.ndarray) -> int:
        """Append one (H, W, 3) uint8 BGR frame and return its index."""
        return self.append_batch(frame[None])

    def append_batch(self, frames: np.ndarray) -> int:
        """Append (b, H, W, 3) uint8 BGR frames in one write and return the index of the first."""
        if frames.ndim != 4 or frames.shape[1:] != self.frame_shape or frames.dtype != np.uint8:
            raise ValueError(f"frames {self._n}.. have shape {frames.shape} {frames.dtype}; expected (b, "
                             f"{', '.join(map(str, self.frame_shape))}) uint8 (all frames of a clip must have the "
                             "same size)")
        if self._fh is None:
            raise RuntimeError("FrameStore.append after finish()")
        try:
            self._fh.write(np.ascontiguousarray(frames).data)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self.close()
            frame_bytes = self.height * self.width * 3
            raise DiskSpaceError(f"the disk holding {self.directory} filled up after {self._n} decoded frames "
                                 f"({_gib(self._n * frame_bytes)}); the frames written so far were removed. Free "
                                 "some space, or set TMPDIR to a folder on a larger local disk.") from exc
        self._n += len(frames)
        return self._n - len(frames)

    def tee(self, frames: Iterable[np.ndarray], frame_count: int | None = None) -> Iterable[np.ndarray]:
        """``frames`` unchanged, each appended to the store as it is read (decode once, use twice); the result's
        ``frame_count`` is the count given, for a face track's bar (None: unknown)."""
        return _Tee(self, frames, frame_count)

    def finish(self) -> FrameStore:
        """Close the file and map it for reading; returns self."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._n:
            self._array = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(self._n, *self.frame_shape))
        return self

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index):
        if self._array is None:
            raise RuntimeError("FrameStore is empty or not finished")
        return self._array[index]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(self._n))

    def close(self) -> None:
        """Release the map and delete the folder with the raw file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self._array = None
        self._finalizer()

    def __exit__(self, *exc) -> None:
        self.close()


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def check_disk_for_frames(n_frames: int, height: int, width: int) -> int:
    """The bytes of ``n_frames`` raw ``height`` x ``width`` x 3 uint8 frames, after checking they fit on the disk of
    the temporary folder with 1 GiB to spare (else DiskSpaceError)."""
    where = Path(tempfile.gettempdir())
    need = int(n_frames) * int(height) * int(width) * 3
    free = shutil.disk_usage(where).free
    if need + DISK_RESERVE_BYTES > free:
        raise DiskSpaceError(f"{n_frames} decoded {width}x{height} frames need {_gib(need)} (+1 GiB to spare) in "
                             f"{where}, which has {_gib(free)} free. Free some space, set TMPDIR to a folder on a "
                             "larger local disk, or use a shorter clip (only the frames the audio reaches are "
                             "decoded).")
    return need


class _Tee:
    def __init__(self, store: FrameStore, frames: Iterable[np.ndarray], frame_count: int | None):
        self.store, self.frames, self.frame_count = store, frames, frame_count

    def __iter__(self) -> Iterator[np.ndarray]:
        for frame in self.frames:
            self.store.append(frame)
            yield frame


def expected_frames(info, default: int) -> int:
    """Upper estimate of the 25 fps frames of a probed video (a :class:`nbhelpers.media.MediaInfo`): its stored
    frames when it has one frame or is stored at 25 fps and they were counted, else duration x 25 + 1; 1 for a
    photo, ``default`` when the duration is unknown."""
    if getattr(info, "is_image", False):
        return 1
    counted = getattr(info, "frame_count", None)
    if counted is not None and (counted == 1 or getattr(info, "fps", None) == FPS):
        return int(counted)
    duration = getattr(info, "duration_s", None)
    return int(duration * FPS) + 1 if duration else int(default)


def _remove(directory: Path, lock: int | None) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    if lock is not None:
        with contextlib.suppress(OSError):
            os.close(lock)


def _hold_lock(directory: Path) -> int | None:
    """Take this process's ``flock`` on a new store folder's ``owner.lock`` (locked before it is named, so a visible
    lock file is always held) and return its descriptor; None where there is no ``flock`` (the folder is then
    marked ``owner.nolock`` and only its own store removes it)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux or macOS
        return None
    making = directory / (LOCK_NAME + ".new")
    fd = os.open(making, os.O_CREAT | os.O_RDWR, 0o600)  # not inherited by child processes (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(making, directory / LOCK_NAME)
    except OSError:  # a file system without flock: the folder says so, and no sweep removes it
        os.close(fd)
        with contextlib.suppress(OSError):
            os.replace(making, directory / NO_LOCK_NAME)
        return None
    return fd


def remove_stale_frames() -> list[Path]:
    """Remove the frame folders in the temporary folder whose process ended without removing them, and return them:
    those whose ``owner.lock`` can be locked, and those without one older than :data:`UNLOCKED_AGE_S`.
    ``owner.nolock``, other users' and unreadable folders stay."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux or macOS
        return []
    removed = []
    for candidate in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            if not candidate.is_dir() or candidate.is_symlink() or (candidate / NO_LOCK_NAME).exists():
                continue
            lock_path = candidate / LOCK_NAME
            if not lock_path.exists():
                if time.time() - candidate.stat().st_mtime > UNLOCKED_AGE_S:
                    shutil.rmtree(candidate)
                    removed.append(candidate)
                continue
            fd = os.open(lock_path, os.O_RDWR)
        except OSError:  # another user's (mode 0700), gone meanwhile, or not ours to remove
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its store is alive
            os.close(fd)
            continue
        try:  # ours now: no living store holds it, and another sweep cannot take it meanwhile
            shutil.rmtree(candidate, ignore_errors=True)
            if not candidate.exists():
                removed.append(candidate)
        finally:
            os.close(fd)
    return removed


def cycle_index(t: int | np.ndarray, n_frames: int) -> int | np.ndarray:
    """Source frame of output frame ``t`` (int or integer array) in the official ping-pong over ``n_frames`` (N >= 1):
    ``0, 1, ..., N-1, N-1, ..., 1, 0`` repeated, so a photo always gives 0. Source: ``inference.py:179-181,210-212``."""
    if n_frames < 1:
        raise ValueError(f"n_frames must be >= 1, got {n_frames}")
    r = np.asarray(t) % (2 * n_frames)
    out = np.where(r < n_frames, r, 2 * n_frames - 1 - r)
    return int(out) if np.ndim(out) == 0 else out


def output_frame_count(n_samples: int) -> int:
    """Output frames for audio of ``n_samples`` at 16 kHz: ``floor(seconds * 25)`` in integer arithmetic.
    Source: ``audio_processor.py:63``."""
    return int(n_samples) * FPS // SAMPLE_RATE
