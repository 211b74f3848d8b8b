"""Avatars: prepare a face once, then turn any number of speech clips into video as fast as the GPU allows.

An avatar is a folder holding everything that depends only on the face video: its 25 fps frames, crop boxes,
latents, blend masks and expanded squares. It is written as a few large files (Google Drive is slow with many
small ones), in a versioned, self-describing cache:

================  ==================================================================================
``avatar.json``   format version, package version, parameters, source and weights fingerprints, and the size
                  and SHA-256 of every other file (written last: its presence marks a complete cache)
``frames.mkv``    the N source frames at 25 fps, FFV1 lossless (BGR, bit-exact)
``avatar.npz``    crop boxes (N, 4), has_face (N,), latents (M, 8, 32, 32) float32, squares (M, 4),
                  masks (M ragged (2s, 2s) uint8, stored flat with their sides)
================  ==================================================================================

Loading checks all of it and rebuilds only what changed; it never asks on stdin (the official realtime script
does, quirk Q22). :meth:`Avatar.generate` then runs whisper features, UNet and VAE decode in batches, blends on
the GPU with the cached masks, copies finished frames to pinned host memory and encodes them through an ffmpeg
pipe while the next batch computes. Every frame is produced, the last included (the official worker drops it,
quirk Q9).

Source: ``scripts/realtime_inference.py`` (reference §9), with the offline feathering (0.05) by default so that
an avatar's frames equal the offline job's (``config.blur_ratio=0.1`` gives the official realtime feathering).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .config import InferenceConfig
from .constants import FPS, SAMPLE_RATE
from .errors import CacheError, FFmpegError, InputError
from .framestore import FrameStore, output_frame_count

AVATAR_FORMAT = 1  # bump when the cache layout or the maths of any cached array changes
MANIFEST = "avatar.json"
FRAMES_FILE = "frames.mkv"
ARRAYS_FILE = "avatar.npz"
# Fields of InferenceConfig that change what is cached (device, precision and batch size do not).
CACHED_FIELDS = ("version", "extra_margin", "bbox_shift", "parsing_mode", "left_cheek_width", "right_cheek_width",
                 "landmark_backend", "smooth_boxes", "seed", "latent_mode", "blur_ratio")


# ------------------------------------------------------------------------------------------------------------------
# Fingerprints


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_fingerprint(path: Path) -> dict[str, Any]:
    """Size and SHA-256 of the source video (content, not name or time: a copied file still matches)."""
    return {"name": path.name, "size": path.stat().st_size, "sha256": _sha256(path)}


def weights_fingerprint(weights_dir: Path, version: str) -> dict[str, Any]:
    """Name, size and modification time of each weight file that shapes the cache (VAE, parsing, landmarks).

    The UNet and whisper do not enter the cache (they run at generate time), so changing them keeps it.
    """
    from . import weights

    out = {}
    for name in weights.required_files(version, parsing=True):
        if name.split("/")[0] in ("sd-vae", "face-parse-bisent", "dwpose", "s3fd"):
            p = weights_dir / name
            if p.is_file():
                st = p.stat()
                out[name] = [st.st_size, int(st.st_mtime)]
    return out


# ------------------------------------------------------------------------------------------------------------------
# Lossless frames (FFV1)


def _ffmpeg() -> str:
    from . import media

    return media.ffmpeg_exe()


def write_lossless(frames: Any, path: Path, width: int, height: int) -> int:
    """Write (H, W, 3) uint8 BGR frames to an FFV1 MKV that decodes back bit-exact. Returns the frame count."""
    args = [_ffmpeg(), "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "bgr24", "-s", f"{width}x{height}",
            "-r", str(FPS), "-i", "-", "-c:v", "ffv1", "-level", "3", "-pix_fmt", "bgr0", "-f", "matroska",
            str(path)]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err: list[bytes] = []
    drain = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    drain.start()
    n = 0
    try:
        for frame in frames:
            proc.stdin.write(np.ascontiguousarray(frame).data)
            n += 1
        proc.stdin.close()
    except BrokenPipeError:
        pass
    rc = proc.wait()
    drain.join()
    if rc != 0:
        raise FFmpegError(f"writing the avatar frames to {path} failed", args, rc,
                          b"".join(err).decode("utf-8", "replace")[-4000:])
    return n


def read_lossless(path: Path, width: int, height: int) -> Iterator[np.ndarray]:
    """Yield the (H, W, 3) uint8 BGR frames of an FFV1 file written by :func:`write_lossless`."""
    args = [_ffmpeg(), "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "bgr24", "-"]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err: list[bytes] = []
    drain = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    drain.start()
    size = width * height * 3
    try:
        while True:
            buf = proc.stdout.read(size)
            if not buf:
                break
            if len(buf) != size:
                raise CacheError(f"{path} ends in a partial frame; the cache will be rebuilt")
            yield np.frombuffer(buf, dtype=np.uint8).reshape(height, width, 3)
    finally:
        proc.stdout.close()
        rc = proc.wait()
        drain.join()
    if rc != 0:
        raise FFmpegError(f"reading the avatar frames from {path} failed", args, rc,
                          b"".join(err).decode("utf-8", "replace")[-4000:])


# ------------------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class GenerateResult:
    """What :meth:`Avatar.generate` produced.

    Attributes:
        output: The MP4 written, or None when nothing was written (``output=False``).
        n_frames: Output frames, ``floor(audio seconds x 25)``, every one produced (the last included).
        duration_s: Audio duration in seconds.
        timings: Seconds per stage: ``audio`` (load + whisper features), ``generate`` (UNet + VAE decode),
            ``blend`` (paste-back + copy to host), ``encode_wait`` (waiting for the encoder after the last batch).
        wall_s: Wall clock from the audio path given to the file closed.
        batch_size: Frames per batch used.
    """

    output: Path | None
    n_frames: int
    duration_s: float
    timings: dict[str, float]
    wall_s: float
    batch_size: int

    @property
    def generation_fps(self) -> float:
        """Frames per second of UNet + VAE decode to uint8 on the device."""
        s = self.timings.get("generate", 0.0)
        return self.n_frames / s if s > 0 else float("nan")

    @property
    def end_to_end_fps(self) -> float:
        """Frames per second of wall clock, audio in to file closed."""
        return self.n_frames / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def realtime_factor(self) -> float:
        """End-to-end fps / 25: above 1 is faster than real time."""
        return self.end_to_end_fps / FPS

    def summary(self) -> str:
        name = self.output.name if self.output else "(not written)"
        return (f"{name}: {self.n_frames} frames ({self.duration_s:.2f} s) in {self.wall_s:.2f} s: "
                f"{self.end_to_end_fps:.1f} fps end to end ({self.realtime_factor:.2f}x real time), "
                f"generation {self.generation_fps:.1f} fps, batch {self.batch_size}")

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.3f} s</td></tr>" for k, v in self.timings.items())
        player = ""
        if self.output is not None:
            try:
                from .ui import video_html

                player = video_html(self.output)
            except Exception:  # noqa: BLE001
                player = ""
        return f"<p>{html.escape(self.summary())}</p><table>{rows}</table>{player}"


# ------------------------------------------------------------------------------------------------------------------
# The avatar


@dataclass
class Avatar:
    """A prepared face: frames, crop boxes, latents and blend material, ready to generate from any audio.

    Attributes:
        directory: The cache folder.
        config: Settings it was prepared with (device, precision and batch size planned for this machine).
        frame_shape: (H, W) of the frames in pixels.
        crop_boxes: (N, 4) int32 crop boxes, rows of -1 for frames without a face.
        has_face: (N,) bool.
        loaded_from_cache: True when nothing was recomputed.
        rebuild_reason: Why the cache was (re)built, or "" when loaded.
    """

    directory: Path
    config: InferenceConfig
    frame_shape: tuple[int, int]
    crop_boxes: np.ndarray
    has_face: np.ndarray
    latents_np: np.ndarray
    squares: np.ndarray
    masks: list[np.ndarray]
    weights_dir: Path
    loaded_from_cache: bool = False
    rebuild_reason: str = ""
    _frames: FrameStore | None = field(default=None, repr=False)
    _state: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n_frames(self) -> int:
        """Source frames at 25 fps."""
        return int(len(self.has_face))

    @property
    def n_faces(self) -> int:
        return int(self.has_face.sum())

    def __str__(self) -> str:
        how = "loaded from cache" if self.loaded_from_cache else f"prepared ({self.rebuild_reason})"
        return (f"Avatar {self.directory.name}: {self.n_frames} frames {self.frame_shape[1]}x{self.frame_shape[0]}, "
                f"{self.n_faces} with a face; {how}")

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(str(self))}</p>"

    # -- loading -------------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, directory: str | os.PathLike, *, weights_dir: str | os.PathLike | None = None,
             config: InferenceConfig | None = None, check: bool = True) -> Avatar:
        """Load a prepared avatar, checking its format, files and hashes.

        Args:
            directory: The avatar folder written by :func:`prepare_avatar`.
            weights_dir: Weights folder for generation (default: the one it was prepared with, else the default).
            config: Override device / precision / batch size (cached fields must match the cache).
            check: Verify every file's size and SHA-256 (catches truncated or corrupted files).

        Raises:
            CacheError: The folder is not a complete avatar of this format, a file is missing, truncated or
                corrupt, or ``config`` differs in a cached field. :func:`prepare_avatar` rebuilds in that case.
        """
        directory = Path(directory)
        try:
            meta = _read_manifest(directory)
            if check:
                _check_files(directory, meta)
        except CacheError as exc:
            raise CacheError(f"{exc}. Prepare the avatar there (again) with `python -m nbhelpers avatar prepare "
                             f"VIDEO {directory}` or nbhelpers.prepare_avatar(video, {str(directory)!r}); a damaged "
                             "or outdated avatar is rebuilt by preparing it again.") from exc
        stored = InferenceConfig(**meta["params"])
        if config is not None:
            diff = [f for f in CACHED_FIELDS if getattr(config, f) != getattr(stored, f)
                    and not (f == "landmark_backend" and config.landmark_backend == "auto")]
            if diff:
                raise CacheError(f"the avatar in {directory} was prepared with other settings ({', '.join(diff)}); "
                                 "prepare it again with prepare_avatar(..., config=...)")
            stored = stored.replace(device=config.device, fp16=config.fp16, batch_size=config.batch_size)
        try:
            arrays = np.load(directory / ARRAYS_FILE, allow_pickle=False)
            sides = arrays["mask_sides"]
            flat = arrays["masks_flat"]
            masks, pos = [], 0
            for s in sides.tolist():
                masks.append(flat[pos:pos + s * s].reshape(s, s))
                pos += s * s
            if pos != flat.size:
                raise CacheError("mask data does not match the recorded sizes")
            avatar = cls(directory=directory, config=stored, frame_shape=tuple(meta["frame_shape"]),
                         crop_boxes=arrays["crop_boxes"], has_face=arrays["has_face"].astype(bool),
                         latents_np=arrays["latents"], squares=arrays["squares"], masks=masks,
                         weights_dir=Path(weights_dir or meta.get("weights_dir") or _default_weights()),
                         loaded_from_cache=True)
        except (KeyError, ValueError, OSError) as exc:
            raise CacheError(f"{directory / ARRAYS_FILE} is unreadable ({exc}); the cache will be rebuilt") from exc
        if avatar.latents_np.shape[0] != avatar.n_faces or len(masks) != avatar.n_faces:
            raise CacheError(f"{directory} holds {avatar.latents_np.shape[0]} latents and {len(masks)} masks for "
                             f"{avatar.n_faces} frames with a face; the cache will be rebuilt")
        return avatar

    def frames(self) -> FrameStore:
        """The N source frames (decoded from the lossless file once, kept in a disk-backed store)."""
        if self._frames is None:
            h, w = self.frame_shape
            store = FrameStore(h, w)
            for frame in read_lossless(self.directory / FRAMES_FILE, w, h):
                store.append(frame)
            store.finish()
            if len(store) != self.n_frames:
                store.close()
                raise CacheError(f"{self.directory / FRAMES_FILE} holds {len(store)} frames, expected "
                                 f"{self.n_frames}; the cache will be rebuilt")
            self._frames = store
        return self._frames

    # -- generation ----------------------------------------------------------------------------------------------

    def _ensure_models(self):
        """Load UNet, VAE, whisper and PE once for all clips, move the cached arrays to the device."""
        if "bundle" in self._state:
            return self._state
        import torch

        from . import gpu, models

        plan = gpu.plan(kind="realtime", config=self.config, n_frames=None, frame_size=self.frame_shape,
                        weights="tiny" if (self.weights_dir / "tiny.json").is_file() else "full")
        self.config = plan.config
        device = torch.device(self.config.device or "cpu")
        dtype = torch.float16 if self.config.fp16 else torch.float32
        bundle = models.load_models(self.weights_dir, version=self.config.version, device=device, dtype=dtype)
        frames = self.frames()
        state = {"bundle": bundle, "device": device, "dtype": dtype,
                 "latents": torch.from_numpy(self.latents_np).to(device=device, dtype=dtype)}
        if device.type == "cuda":
            state["masks"] = [torch.from_numpy(np.ascontiguousarray(m)).to(device) for m in self.masks]
            nbytes = len(frames) * frames.height * frames.width * 3
            free, _ = torch.cuda.mem_get_info(device)
            if nbytes < 0.25 * free:  # keep the source frames on the GPU when they fit comfortably
                dev_frames = torch.empty((len(frames), frames.height, frames.width, 3), dtype=torch.uint8,
                                         device=device)
                for start in range(0, len(frames), 64):
                    chunk = np.ascontiguousarray(frames[start:start + 64])
                    dev_frames[start:start + len(chunk)] = torch.from_numpy(chunk).to(device)
                state["frames_device"] = dev_frames
        else:
            state["masks"] = self.masks
        self._state.update(state)
        return self._state

    def optimize(self, compile: bool = False, channels_last: bool = True) -> Avatar:
        """Speed up generation on CUDA (no effect on CPU). Returns self.

        ``channels_last`` stores UNet and VAE convolution weights in NHWC, the layout cuDNN's fastest fp16 kernels
        use; ``compile`` wraps the UNet and the VAE decoder in ``torch.compile`` (a one-time cost of tens of
        seconds at the first batch, and again for each new batch shape). Numerics stay within fp16 rounding.
        """
        import torch

        st = self._ensure_models()
        if st["device"].type != "cuda":
            return self
        torch.backends.cudnn.benchmark = True
        bundle = st["bundle"]
        if channels_last:
            bundle.unet.to(memory_format=torch.channels_last)
            bundle.vae.to(memory_format=torch.channels_last)
        if compile and not st.get("compiled"):
            bundle.unet.forward = torch.compile(bundle.unet.forward)
            bundle.vae.decoder.forward = torch.compile(bundle.vae.decoder.forward)
            st["compiled"] = True
        return self

    def load_models(self) -> Avatar:
        """Load UNet, VAE, whisper and the cached arrays onto the device now (else the first clip does it).

        Returns self, so that the first :meth:`generate` measures generation only.
        """
        self._ensure_models()
        return self

    def _render_inputs(self):
        from .pipeline import RenderInputs

        st = self._ensure_models()
        latent_row = np.full(self.n_frames, -1, dtype=np.int64)
        latent_row[np.flatnonzero(self.has_face)] = np.arange(self.n_faces)
        boxes = [tuple(int(v) for v in self.crop_boxes[j]) for j in np.flatnonzero(self.has_face)]
        return RenderInputs(frames=self.frames(), latent_row=latent_row, latents=st["latents"], boxes=boxes,
                            masks=st["masks"], squares=[tuple(int(v) for v in s) for s in self.squares],
                            frames_device=st.get("frames_device"))

    def _features(self, audio, timings):
        from . import media
        from .audio import whisper_features

        st = self._ensure_models()
        with timings.stage("audio"):
            if isinstance(audio, np.ndarray):
                waveform = np.asarray(audio, dtype=np.float32)
            else:
                path = Path(audio)
                if not path.is_file():
                    raise InputError(f"audio {str(path)!r} does not exist; give the path of a speech file.")
                waveform = media.load_audio(path)
            n_out = output_frame_count(len(waveform))
            if n_out < 1:
                raise InputError(f"audio lasts {len(waveform) / SAMPLE_RATE:.3f} s, shorter than one frame "
                                 f"(1/{FPS} s).")
            features = whisper_features(waveform, st["bundle"].whisper, fps=FPS,
                                        feature_extractor=st["bundle"].feature_extractor)
        return waveform, features, n_out

    def generate(self, audio: str | os.PathLike | np.ndarray, output: str | os.PathLike | bool | None = None, *,
                 frame_callback=None) -> GenerateResult:
        """Turn one speech clip into a video of this avatar.

        Args:
            audio: Speech file (any format ffmpeg reads), or a 16 kHz mono float32 waveform (then ``output``
                gets no audio track unless it is a file).
            output: MP4 path; None for ``<avatar>/vid_output/<audio name>.mp4``; False to write nothing (to
                measure generation alone).
            frame_callback: Called as ``frame_callback(t, frame)`` with each finished (H, W, 3) uint8 BGR frame
                (copy it if you keep it).

        Returns:
            :class:`GenerateResult` with generation fps and end-to-end fps.

        Raises:
            InputError: The audio is missing, unreadable or shorter than one frame.
        """
        from .pipeline import Timings, flush_denormals

        t0 = time.perf_counter()
        timings = Timings()
        st = self._ensure_models()
        with flush_denormals(st["device"]):
            return self._generate(audio, output, frame_callback, t0, timings)

    def _generate(self, audio, output, frame_callback, t0, timings) -> GenerateResult:
        from . import media
        from .pipeline import _BackgroundWriter, render
        from .progress import bar

        waveform, features, n_out = self._features(audio, timings)
        st = self._ensure_models()
        inputs = self._render_inputs()
        batch = int(self.config.batch_size or 20)
        out_path: Path | None
        if output is False:
            out_path = None
        elif output is None:
            name = Path(audio).stem if not isinstance(audio, np.ndarray) else "clip"
            out_path = self.directory / "vid_output" / f"{name}.mp4"
        else:
            out_path = Path(output)
        audio_track = None if isinstance(audio, np.ndarray) else Path(audio)
        h, w = self.frame_shape
        writer = media.VideoWriter(out_path, w, h, fps=FPS, audio=audio_track) if out_path is not None else None
        sink_writer = writer if writer is not None else _NullWriter()
        with _maybe(writer), _BackgroundWriter(sink_writer, frame_callback) as sink:
            with bar(total=n_out, desc="generate", unit="frame") as progress:
                for first, frames in render(inputs, features, st["bundle"], batch, n_out, st["device"],
                                            timings=timings, pinned=True):
                    sink.put(first, frames)
                    progress.update(len(frames))
        timings.seconds["encode_wait"] = sink.wait_s
        final = Path(writer.path) if writer is not None and hasattr(writer, "path") else out_path
        return GenerateResult(output=final, n_frames=n_out, duration_s=len(waveform) / SAMPLE_RATE,
                              timings=dict(timings.seconds), wall_s=time.perf_counter() - t0, batch_size=batch)

    def stream(self, audio: str | os.PathLike | np.ndarray) -> Iterator[np.ndarray]:
        """Yield the finished (H, W, 3) uint8 BGR frames of one clip, in order, as they are made (no file)."""
        from .pipeline import Timings, render

        timings = Timings()
        _, features, n_out = self._features(audio, timings)
        st = self._ensure_models()
        inputs = self._render_inputs()
        for _, frames in render(inputs, features, st["bundle"], int(self.config.batch_size or 20), n_out,
                                st["device"], pinned=False):
            yield from (np.array(f) for f in frames)

    def close(self) -> None:
        """Release the models and the decoded frames."""
        self._state.clear()
        if self._frames is not None:
            self._frames.close()
            self._frames = None
        from .gpu import release

        release()


class _NullWriter:
    def write(self, frames) -> None:
        pass


class _maybe:
    def __init__(self, cm):
        self.cm = cm

    def __enter__(self):
        return self.cm.__enter__() if self.cm is not None else None

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc) if self.cm is not None else False


# ------------------------------------------------------------------------------------------------------------------
# Preparing


def _default_weights() -> Path:
    from . import weights

    return weights.default_dir()


def _read_manifest(directory: Path) -> dict[str, Any]:
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


def _check_files(directory: Path, meta: dict[str, Any]) -> None:
    for name, info in meta["files"].items():
        p = directory / name
        if not p.is_file():
            raise CacheError(f"{p} is missing")
        size = p.stat().st_size
        if size != info["size"]:
            raise CacheError(f"{p} has {size} bytes, expected {info['size']} (truncated or replaced)")
        if _sha256(p) != info["sha256"]:
            raise CacheError(f"{p} does not match its recorded SHA-256 (corrupted)")


def _stale_reason(directory: Path, video: Path, config: InferenceConfig, weights_dir: Path,
                  boxes_key: Any) -> str:
    """Why the cache in ``directory`` cannot be used as is ("" when it can)."""
    try:
        meta = _read_manifest(directory)
    except CacheError as exc:
        return str(exc)
    if meta["package_version"] != __version__:
        return f"made by nbhelpers {meta['package_version']}, this is {__version__}"
    params = {f: getattr(config, f) for f in CACHED_FIELDS}
    stored = {f: meta["params"].get(f) for f in CACHED_FIELDS}
    changed = [f for f in CACHED_FIELDS if params[f] != stored[f]]
    if changed:
        return "settings changed: " + ", ".join(f"{f} {stored[f]!r} -> {params[f]!r}" for f in changed)
    if meta.get("boxes") != boxes_key:
        return "the given boxes changed"
    src = meta["source"]
    st = video.stat()
    if st.st_size != src["size"] or (src.get("mtime") != int(st.st_mtime) and _sha256(video) != src["sha256"]):
        return "the source video changed"
    if meta["weights"] != weights_fingerprint(weights_dir, config.version):
        return "the weights changed"
    try:
        _check_files(directory, meta)
    except CacheError as exc:
        return str(exc)
    return ""


def _boxes_key(boxes: Any) -> Any:
    if boxes is None:
        return None
    arr = np.asarray([[-1, -1, -1, -1] if b is None else list(b) for b in boxes], dtype=float) \
        if not np.isscalar(boxes[0]) else np.asarray(boxes, dtype=float)
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def prepare_avatar(video: str | os.PathLike, directory: str | os.PathLike, *, config: InferenceConfig | None = None,
                   boxes: Any = None, weights_dir: str | os.PathLike | None = None, rebuild: bool = False,
                   backend: Any = None) -> Avatar:
    """Prepare (or load) the avatar of a face video: frames, crop boxes, latents and blend masks, computed once.

    When ``directory`` already holds an avatar made from the same video content, settings, boxes, weights,
    format and package version, and every file passes its size and SHA-256 check, it is loaded without
    recomputation. Otherwise it is rebuilt (the reason is in ``rebuild_reason``), written into a temporary folder
    inside ``directory`` and moved into place, with ``avatar.json`` last. Nothing asks on stdin.

    Args:
        video: Face video (any frame rate: converted to 25 fps) or photo.
        directory: The avatar folder (created; may be on Google Drive).
        config: Settings; cached fields are version, extra_margin, bbox_shift, parsing_mode, cheek widths,
            landmark backend, smoothing, seed, latent_mode and blur_ratio.
        boxes: Crop boxes given by hand (one for the clip or one per 25 fps frame), skipping detection.
        weights_dir: Weights folder (default :func:`nbhelpers.weights.default_dir`).
        rebuild: Rebuild even when the cache is valid.
        backend: Landmark backend object or name (default ``config.landmark_backend``).

    Returns:
        :class:`Avatar` with ``loaded_from_cache`` telling whether anything was recomputed.

    Raises:
        InputError: The video is missing or unreadable, or an option is invalid.
        WeightsError: Weight files are missing.
        NoFaceError: No frame has a face (pass ``boxes=``).

    Source: ``scripts/realtime_inference.py:87-210`` (reference §9.2), without its stdin prompts (Q22) and with
    frames without a face kept (Q7).
    """
    from . import faces, gpu, models, weights
    from .pipeline import (
        _blend_materials,
        _check_video_only,
        _device_dtype,
        _encode_faces,
        _weights_kind,
        flush_denormals,
    )

    config = config or InferenceConfig()
    if boxes is not None and config.landmark_backend != "boxes":
        config = config.replace(landmark_backend="boxes")
    directory = Path(directory)
    video_path = Path(video)
    weights_path = Path(weights_dir) if weights_dir is not None else weights.default_dir()
    if directory.exists() and not directory.is_dir():
        raise InputError(f"directory {str(directory)!r} is a file; give a folder for the avatar (it is created).")
    if not video_path.is_file():
        raise InputError(f"video {str(video_path)!r} does not exist; give the path of a face video or photo.")
    boxes_key = _boxes_key(boxes)
    reason = "rebuild asked" if rebuild else _stale_reason(directory, video_path, config, weights_path, boxes_key)
    if not reason:
        try:
            return Avatar.load(directory, weights_dir=weights_path, config=config, check=False)
        except CacheError as exc:
            reason = str(exc)

    # Validate the video and the weights before any heavy work.
    from . import media

    _check_video_only(video_path, config, weights_path)

    directory.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=directory))
    reader = media.load_video(video_path)
    store = FrameStore(reader.height, reader.width, directory=work / "raw")
    cleanup = ExitStack()
    try:
        track = faces.track(store.tee(reader), backend=backend or config.landmark_backend, config=config,
                            boxes=boxes, weights_dir=weights_path)
        store.finish()
        reader.close()
        plan = gpu.plan(kind="avatar", config=config, n_frames=len(store), frame_size=store.frame_shape[:2],
                        weights=_weights_kind(weights_path))
        run_config = plan.config
        device, dtype = _device_dtype(run_config)
        cleanup.enter_context(flush_denormals(device))
        face_frames = np.flatnonzero(track.has_face)
        vae = models.load_vae(weights_path, device=device, dtype=dtype)
        latents = _encode_faces(store, track, face_frames, vae, run_config)
        latents_np = latents.float().cpu().numpy()
        del vae, latents
        gpu.release()
        materials = _blend_materials(store, track, face_frames, weights_path, device, dtype, run_config)
        masks = [np.ascontiguousarray(materials[int(j)].mask) for j in face_frames]
        squares = np.asarray([materials[int(j)].square for j in face_frames], dtype=np.int32).reshape(-1, 4)
        crop_boxes = np.asarray(track.crop_boxes, dtype=np.int32)
        h, w = store.frame_shape[:2]

        # Write: frames, arrays, then the manifest last (its presence marks a complete cache).
        n_written = write_lossless(store, work / FRAMES_FILE, w, h)
        if n_written != len(store):
            raise CacheError(f"wrote {n_written} of {len(store)} frames")
        sides = np.asarray([m.shape[0] for m in masks], dtype=np.int32)
        flat = np.concatenate([m.reshape(-1) for m in masks]) if masks else np.zeros(0, np.uint8)
        with open(work / ARRAYS_FILE, "wb") as fh:
            np.savez(fh, crop_boxes=crop_boxes, has_face=track.has_face.astype(np.uint8), latents=latents_np,
                     squares=squares, mask_sides=sides, masks_flat=flat)
        st = video_path.stat()
        source = source_fingerprint(video_path)
        source["mtime"] = int(st.st_mtime)
        meta = {
            "format": AVATAR_FORMAT, "package_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "params": {k: v for k, v in config.to_dict().items() if k in CACHED_FIELDS},
            "boxes": boxes_key, "source": source, "weights": weights_fingerprint(weights_path, config.version),
            "weights_dir": str(weights_path), "frame_shape": [h, w], "n_frames": len(store),
            "n_faces": int(len(face_frames)), "backend": track.backend,
            "files": {name: {"size": (work / name).stat().st_size, "sha256": _sha256(work / name)}
                      for name in (FRAMES_FILE, ARRAYS_FILE)},
        }
        store.close()
        (directory / MANIFEST).unlink(missing_ok=True)  # invalidate first: a crash below leaves no stale manifest
        for name in (FRAMES_FILE, ARRAYS_FILE):
            os.replace(work / name, directory / name)
        tmp_manifest = work / MANIFEST
        tmp_manifest.write_text(json.dumps(meta, indent=1, sort_keys=True), "utf-8")
        os.replace(tmp_manifest, directory / MANIFEST)
    finally:
        cleanup.close()
        reader.close()
        store.close()
        shutil.rmtree(work, ignore_errors=True)

    avatar = Avatar.load(directory, weights_dir=weights_path, config=run_config, check=False)
    avatar.loaded_from_cache = False
    avatar.rebuild_reason = reason
    return avatar


__all__ = ["AVATAR_FORMAT", "Avatar", "GenerateResult", "prepare_avatar", "read_lossless", "write_lossless"]
