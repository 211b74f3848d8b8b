"""The avatar cache on disk: a folder of a few large files (Google Drive is slow with many small ones).

================  ==================================================================================
``avatar.json``   format version, package version, parameters, source and weights fingerprints, and the size
                  and SHA-256 of every other file (written last: its presence marks a complete cache)
``frames.mkv``    the N source frames at 25 fps, FFV1 lossless (BGR, bit-exact)
``avatar.npz``    crop boxes (N, 4), has_face (N,), latents (M, 8, 32, 32) float32, squares (M, 4),
                  masks (M ragged (2s, 2s) uint8, stored flat with their sides)
================  ==================================================================================
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__, media, weights
from ..config import InferenceConfig
from ..constants import FPS
from ..errors import CacheError, FFmpegError
from ..hashing import atomic_path, sha256_file

AVATAR_FORMAT = 1  # bump when the cache layout or the maths of any cached array changes
MANIFEST = "avatar.json"
FRAMES_FILE = "frames.mkv"
ARRAYS_FILE = "avatar.npz"
# Fields of InferenceConfig that change what is cached (device, precision and batch size do not).
CACHED_FIELDS = ("version", "extra_margin", "bbox_shift", "parsing_mode", "left_cheek_width", "right_cheek_width",
                 "landmark_backend", "smooth_boxes", "seed", "latent_mode", "blur_ratio", "face")
_OLDER_DEFAULTS = {"face": "largest"}  # fields added since: what a manifest without them was made with
# Weight folders whose files shape the cache (the UNet and whisper run at generate time and do not).
CACHED_WEIGHTS = ("sd-vae", "face-parse-bisent", "dwpose", "s3fd")


def source_fingerprint(path: Path) -> dict[str, Any]:
    """Name, size, modification time (whole seconds) and SHA-256 of the source video (a copied file still matches)."""
    stat = path.stat()
    return {"name": path.name, "size": stat.st_size, "sha256": sha256_file(path), "mtime": int(stat.st_mtime)}


def weights_fingerprint(weights_dir: Path) -> dict[str, Any]:
    """``[size, mtime]`` of each weight file present that shapes the cache (VAE, parsing, landmarks), by its path:
    the manifest's files and alternates in :data:`CACHED_WEIGHTS` folders (the same for every version)."""
    names = sorted({path for entry in weights.MANIFEST for path in (entry.path, *entry.alternates)
                    if path.split("/")[0] in CACHED_WEIGHTS})
    paths = {name: weights_dir / name for name in names}
    return {name: [p.stat().st_size, int(p.stat().st_mtime)] for name, p in paths.items() if p.is_file()}


def boxes_key(boxes: Any) -> str | None:
    """SHA-256 of the boxes given (one box or one entry per frame, None for no face), or None for detected faces."""
    if boxes is None:
        return None
    rows = np.asarray(boxes, dtype=float) if np.isscalar(boxes[0]) else \
        np.asarray([[-1, -1, -1, -1] if b is None else list(b) for b in boxes], dtype=float)
    return hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()


def write_lossless(frames: Any, path: Path, width: int, height: int, *, stop: threading.Event | None = None) -> int:
    """Write (H, W, 3) uint8 BGR frames to an FFV1 MKV that decodes back bit-exact (:class:`LosslessFrames`);
    returns the frame count. ``stop`` set from another thread kills the encoder and raises CacheError (the caller
    removes the file)."""
    args = [media.ffmpeg_exe(), "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{width}x{height}",
            "-r", str(FPS), "-i", "-", "-c:v", "ffv1", "-level", "3", "-pix_fmt", "bgr0", "-f", "matroska",
            str(path)]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err: list[bytes] = []
    drain = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    drain.start()
    n = 0
    try:
        for frame in frames:
            if stop is not None and stop.is_set():
                proc.kill()
                break
            proc.stdin.write(np.ascontiguousarray(frame).data)
            n += 1
        proc.stdin.close()
    except BrokenPipeError:
        pass
    rc = proc.wait()
    drain.join()
    if stop is not None and stop.is_set():
        raise CacheError(f"writing the avatar frames to {path} was stopped after {n} frames")
    if rc != 0:
        raise FFmpegError(f"writing the avatar frames to {path} failed", args, rc,
                          b"".join(err).decode("utf-8", "replace")[-4000:])
    return n


class LosslessFrames:
    """Random access to the ``n_frames`` (W x H) frames of an FFV1 file written by :func:`write_lossless`, decoded
    on demand in chunks: ``frames[j]`` is a read-only (H, W, 3) uint8 BGR array, ``frames[a:b]`` and
    ``frames[[j, k]]`` stack copies. Every FFV1 frame is a keyframe at a multiple of 40 ms, so ``-ss j/25`` decodes
    exactly frames ``j, j+1, ...``; recent chunks are kept for the ping-pong's backward pass. Iterating goes through
    ``frames[j]`` until IndexError. Access raises CacheError when the file holds fewer frames than recorded."""

    chunk = 32  # frames decoded per ffmpeg call
    cached_chunks = 4  # chunks kept in memory (each chunk x H x W x 3 bytes)

    def __init__(self, path: Path, n_frames: int, width: int, height: int):
        self.path, self.n_frames, self.width, self.height = Path(path), int(n_frames), int(width), int(height)
        self._cache: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.n_frames

    def _decode(self, k: int) -> np.ndarray:
        start = k * self.chunk
        count = min(self.chunk, self.n_frames - start)
        args = [media.ffmpeg_exe(), "-v", "error", "-nostdin", "-ss", f"{start * 1000 // FPS / 1000:.3f}", "-i",
                str(self.path), "-frames:v", str(count), "-f", "rawvideo", "-pix_fmt", "bgr24", "-"]
        proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, check=False)
        if proc.returncode != 0:
            raise FFmpegError(f"reading frames {start}-{start + count - 1} of {self.path} failed", args,
                              proc.returncode, proc.stderr.decode("utf-8", "replace")[-4000:])
        size = self.height * self.width * 3
        if len(proc.stdout) != count * size:
            raise CacheError(f"{self.path} gave {len(proc.stdout) // size} frames from frame {start}, expected "
                             f"{count}; prepare the avatar again")
        return np.frombuffer(proc.stdout, dtype=np.uint8).reshape(count, self.height, self.width, 3)

    def _frame(self, j: int) -> np.ndarray:
        if not -self.n_frames <= j < self.n_frames:
            raise IndexError(f"frame {j} of {self.n_frames}")
        j %= self.n_frames
        k = j // self.chunk
        with self._lock:
            block = self._cache.pop(k) if k in self._cache else self._decode(k)
            self._cache[k] = block  # most recently used last
            while len(self._cache) > self.cached_chunks:
                self._cache.pop(next(iter(self._cache)))
        return block[j - k * self.chunk]

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return self._frame(int(index))
        if isinstance(index, slice):
            index = range(*index.indices(self.n_frames))
        return np.stack([self._frame(int(j)) for j in index])

    def close(self) -> None:
        """Drop the decoded chunks."""
        self._cache.clear()


class BackgroundWrite:
    """:func:`write_lossless` then the file's size and SHA-256, in a thread, overlapping the models' work.
    :meth:`result` waits and returns ``(frames written, size, sha256)`` or raises; :meth:`cancel` stops and joins."""

    def __init__(self, frames: Any, path: Path, width: int, height: int):
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="avatar-ffv1")
        self._future = self._pool.submit(self._write, frames, path, width, height)
        self._pool.shutdown(wait=False)  # the thread ends when the write does

    def _write(self, frames: Any, path: Path, width: int, height: int) -> tuple[int, int, str]:
        n = write_lossless(frames, path, width, height, stop=self._stop)
        return n, path.stat().st_size, sha256_file(path)

    def result(self) -> tuple[int, int, str]:
        return self._future.result()

    def cancel(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True)


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of the avatar in ``directory``, checked for its format and keys; CacheError for no complete
    avatar there, an unreadable manifest, another format or a missing key."""
    path = directory / MANIFEST
    if not path.is_file():
        if not directory.is_dir() or not any(directory.iterdir()):
            raise CacheError(f"no avatar in {directory} yet (the folder is "
                             f"{'empty' if directory.is_dir() else 'not there'})")
        raise CacheError(f"{directory} holds no complete avatar ({MANIFEST} is missing)")
    try:
        meta = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise CacheError(f"{path} is unreadable ({exc})") from exc
    if meta.get("format") != AVATAR_FORMAT:
        raise CacheError(f"{directory} is avatar format {meta.get('format')!r}; this nbhelpers writes format "
                         f"{AVATAR_FORMAT}")
    for key in ("params", "files", "frame_shape", "source", "weights", "package_version"):
        if key not in meta:
            raise CacheError(f"{path} lacks {key!r}")
    return meta


def check_files(directory: Path, meta: dict[str, Any]) -> None:
    """Check every file the manifest lists: present, of its recorded size and SHA-256 (else CacheError)."""
    for name, info in meta["files"].items():
        p = directory / name
        if not p.is_file():
            raise CacheError(f"{p} is missing")
        size = p.stat().st_size
        if size != info["size"]:
            raise CacheError(f"{p} has {size} bytes, expected {info['size']} (truncated or replaced)")
        if sha256_file(p) != info["sha256"]:
            raise CacheError(f"{p} does not match its recorded SHA-256 (corrupted)")


def stale_reason(directory: Path, video: Path, config: InferenceConfig, weights_dir: Path, key: str | None) -> str:
    """Why the cache in ``directory`` cannot serve ``video`` with ``config``, ``weights_dir`` and the boxes of
    :func:`boxes_key` ``key``; "" when it can, "new avatar" when the folder is empty or not there."""
    if not directory.is_dir() or not any(directory.iterdir()):
        return "new avatar"
    try:
        meta = read_manifest(directory)
    except CacheError as exc:
        return str(exc)
    if meta["package_version"] != __version__:
        return f"made by nbhelpers {meta['package_version']}, this is {__version__}"
    params = {**_OLDER_DEFAULTS, **meta["params"]}
    changed = [f for f in CACHED_FIELDS if getattr(config, f) != params.get(f)]
    if changed:
        return "settings changed: " + ", ".join(f"{f} {params.get(f)!r} -> {getattr(config, f)!r}" for f in changed)
    if meta.get("boxes") != key:
        return "the given boxes changed"
    src = meta["source"]
    st = video.stat()
    if st.st_size != src["size"] or (src.get("mtime") != int(st.st_mtime) and sha256_file(video) != src["sha256"]):
        return "the source video changed"
    if meta["weights"] != weights_fingerprint(weights_dir):
        return "the weights changed"
    try:
        check_files(directory, meta)
    except CacheError as exc:
        return str(exc)
    return ""


def write_arrays(path: Path, crop_boxes: np.ndarray, has_face: np.ndarray, latents: np.ndarray, squares: np.ndarray,
                 masks: list[np.ndarray]) -> None:
    """Write the arrays file (``avatar.npz``); the masks are stored flat with their sides."""
    sides = np.asarray([m.shape[0] for m in masks], dtype=np.int32)
    flat = np.concatenate([m.reshape(-1) for m in masks]) if masks else np.zeros(0, np.uint8)
    np.savez(path, crop_boxes=crop_boxes, has_face=has_face.astype(np.uint8), latents=latents, squares=squares,
             mask_sides=sides, masks_flat=flat)


def read_arrays(directory: Path) -> dict[str, Any]:
    """The arrays of the avatar in ``directory``: ``crop_boxes`` (N, 4) int32, ``has_face`` (N,) bool, ``latents``
    (M, 8, 32, 32) float32, ``squares`` (M, 4) int32 and ``masks`` (M (2s, 2s) uint8). CacheError when the file
    is unreadable, or its masks or latents do not match its frames with a face."""
    try:
        arrays = np.load(directory / ARRAYS_FILE, allow_pickle=False)
        sides, flat = arrays["mask_sides"].tolist(), arrays["masks_flat"]
        starts = np.cumsum([0] + [s * s for s in sides]).tolist()  # each mask's offset, then the total
        if starts[-1] != flat.size:
            raise CacheError("mask data does not match the recorded sizes")
        masks = [flat[a:a + s * s].reshape(s, s) for s, a in zip(sides, starts[:-1], strict=True)]
        out = {"crop_boxes": arrays["crop_boxes"], "has_face": arrays["has_face"].astype(bool),
               "latents": arrays["latents"], "squares": arrays["squares"], "masks": masks}
    except (KeyError, ValueError, OSError) as exc:
        raise CacheError(f"{directory / ARRAYS_FILE} is unreadable ({exc}); the cache will be rebuilt") from exc
    n_faces = int(out["has_face"].sum())
    if out["latents"].shape[0] != n_faces or len(masks) != n_faces:
        raise CacheError(f"{directory} holds {out['latents'].shape[0]} latents and {len(masks)} masks for "
                         f"{n_faces} frames with a face; the cache will be rebuilt")
    return out


def write_manifest(work: Path, directory: Path, meta: dict[str, Any]) -> None:
    """Move the frames and arrays files from ``work`` into ``directory`` and write the manifest last; the old one
    is removed first, so a crash leaves no stale manifest."""
    (directory / MANIFEST).unlink(missing_ok=True)
    for name in (FRAMES_FILE, ARRAYS_FILE):
        os.replace(work / name, directory / name)
    with atomic_path(directory / MANIFEST) as tmp:
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True), "utf-8")


def manifest(config: InferenceConfig, key: str | None, video: Path, weights_dir: Path, frame_shape: tuple[int, int],
             n_frames: int, n_faces: int, backend: str, files: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a new avatar (see the module docstring)."""
    return {"format": AVATAR_FORMAT, "package_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "params": {k: v for k, v in config.to_dict().items() if k in CACHED_FIELDS},
            "boxes": key, "source": source_fingerprint(video),
            "weights": weights_fingerprint(weights_dir), "weights_dir": str(weights_dir),
            "frame_shape": list(frame_shape), "n_frames": int(n_frames), "n_faces": int(n_faces), "backend": backend,
            "files": files}


def file_entry(path: Path, size: int | None = None, sha256: str | None = None) -> dict[str, Any]:
    """A manifest's ``files`` entry: size and SHA-256 (computed when not given)."""
    return {"size": path.stat().st_size if size is None else int(size),
            "sha256": sha256_file(path) if sha256 is None else sha256}


__all__ = ["AVATAR_FORMAT", "ARRAYS_FILE", "CACHED_FIELDS", "FRAMES_FILE", "MANIFEST", "BackgroundWrite",
           "LosslessFrames", "boxes_key", "check_files", "file_entry", "manifest", "read_arrays",
           "read_manifest", "source_fingerprint", "stale_reason", "weights_fingerprint", "write_arrays",
           "write_lossless", "write_manifest"]
