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

import dataclasses
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .config import InferenceConfig
from .constants import FPS, SAMPLE_RATE
from .errors import CacheError, FFmpegError, InputError, NoFaceError
from .framestore import FrameStore
from .result import ClipResult

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


def write_lossless(frames: Any, path: Path, width: int, height: int, *, stop: threading.Event | None = None) -> int:
    """Write (H, W, 3) uint8 BGR frames to an FFV1 MKV that decodes back bit-exact. Returns the frame count.

    ``stop``, when set from another thread, kills the encoder after the current frame and raises
    :class:`~nbhelpers.errors.CacheError` (the partial file is the caller's to remove).
    """
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


class LosslessFrames:
    """Random access to the N frames of an avatar's FFV1 file, decoded on demand in chunks (no raw copy on disk).

    Every FFV1 frame is a keyframe and the file's timestamps are exact multiples of 40 ms, so seeking to frame
    ``j`` (``-ss j/25`` before the input) decodes exactly frames ``j, j+1, ...``. The ping-pong cycle reads the
    frames forwards then backwards, so a small cache of recently decoded chunks serves both directions.

    Args:
        path: The FFV1 file written by :func:`write_lossless`.
        n_frames: N, the frames it holds.
        width: Frame width, pixels.
        height: Frame height, pixels.
        chunk: Frames decoded per ffmpeg call.
        cached_chunks: Chunks kept in memory (each ``chunk x H x W x 3`` bytes).

    ``frames[j]`` is a read-only (H, W, 3) uint8 BGR array; ``frames[a:b]`` and ``frames[[j, k]]`` stack copies.

    Raises:
        CacheError: (on access) the file holds fewer frames than recorded.
    """

    def __init__(self, path: Path, n_frames: int, width: int, height: int, chunk: int = 32, cached_chunks: int = 4):
        self.path = Path(path)
        self.n_frames = int(n_frames)
        self.width = int(width)
        self.height = int(height)
        self.chunk = max(1, int(chunk))
        self.cached_chunks = max(2, int(cached_chunks))
        self._cache: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def frame_shape(self) -> tuple[int, int, int]:
        """(H, W, 3)."""
        return (self.height, self.width, 3)

    def __len__(self) -> int:
        return self.n_frames

    def _decode(self, k: int) -> np.ndarray:
        start = k * self.chunk
        count = min(self.chunk, self.n_frames - start)
        args = [_ffmpeg(), "-v", "error", "-nostdin", "-ss", f"{start * 1000 // FPS / 1000:.3f}", "-i", str(self.path),
                "-frames:v", str(count), "-f", "rawvideo", "-pix_fmt", "bgr24", "-"]
        proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, check=False)
        if proc.returncode != 0:
            raise FFmpegError(f"reading frames {start}-{start + count - 1} of {self.path} failed", args,
                              proc.returncode, proc.stderr.decode("utf-8", "replace")[-4000:])
        size = self.height * self.width * 3
        if len(proc.stdout) != count * size:
            raise CacheError(f"{self.path} gave {len(proc.stdout) // size} frames from frame {start}, expected "
                             f"{count}; prepare the avatar again")
        arr = np.frombuffer(proc.stdout, dtype=np.uint8).reshape(count, self.height, self.width, 3)
        return arr

    def _frame(self, j: int) -> np.ndarray:
        if not -self.n_frames <= j < self.n_frames:
            raise IndexError(f"frame {j} of {self.n_frames}")
        j %= self.n_frames
        k = j // self.chunk
        with self._lock:
            block = self._cache.pop(k, None)
            if block is None:
                block = self._decode(k)
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

    def __iter__(self) -> Iterator[np.ndarray]:
        for j in range(self.n_frames):
            yield self._frame(j)

    def close(self) -> None:
        """Drop the decoded chunks."""
        self._cache.clear()


class _BackgroundWrite:
    """:func:`write_lossless` then the file's size and SHA-256, in a thread (ffmpeg and hashlib release the GIL),
    so that the encode overlaps the latents and face parsing of :func:`prepare_avatar`.

    :meth:`result` joins and returns ``(frames written, size, sha256)`` or raises the writer's error;
    :meth:`cancel` stops the encoder and joins (for the error path: nothing is left running or writing).
    """

    def __init__(self, frames: Any, path: Path, width: int, height: int):
        self.path = path
        self._stop = threading.Event()
        self._out: tuple[int, int, str] | None = None
        self._error: BaseException | None = None

        def work() -> None:
            try:
                n = write_lossless(frames, path, width, height, stop=self._stop)
                self._out = (n, path.stat().st_size, _sha256(path))
            except BaseException as exc:  # noqa: BLE001 - handed to result()
                self._error = exc

        self._thread = threading.Thread(target=work, name="avatar-ffv1", daemon=True)
        self._thread.start()

    def result(self) -> tuple[int, int, str]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._out is not None
        return self._out

    def cancel(self) -> None:
        self._stop.set()
        self._thread.join()


# ------------------------------------------------------------------------------------------------------------------
# The avatar


@dataclass
class Avatar:
    """A prepared face: frames, crop boxes, latents and blend material, ready to generate from any audio.

    It generates with the models of a :class:`~nbhelpers.pipeline.MuseTalkPipeline`: the one it was prepared or
    loaded with, or one made over ``weights_dir`` at the first clip.

    Attributes:
        directory: The cache folder.
        config: Settings it was prepared with (device, precision and batch size planned for this machine).
        frame_shape: (H, W) of the frames in pixels.
        crop_boxes: (N, 4) int32 crop boxes, rows of -1 for frames without a face.
        has_face: (N,) bool.
        latents_np: (M, 8, 32, 32) float32 latents of the M frames with a face.
        squares: (M, 4) int32 expanded squares.
        masks: M feathered blend masks (2s, 2s) uint8.
        weights_dir: The weights folder of its models.
        backend: Landmark backend it was prepared with.
        loaded_from_cache: True when nothing was recomputed.
        rebuild_reason: Why the cache was (re)built, or "" when loaded.
        pipeline: The pipeline whose models generate its clips (None until the first clip when loaded alone).
        prepare_timings: Wall seconds of each stage of the preparation that made it (empty when loaded):
            ``frames`` (decode and crop boxes), ``parser_wait`` and ``vae_wait`` (loading the face parser and
            the VAE, or waiting for another thread loading them, as in a batch worker), ``parse`` (face parsing
            and blend masks), ``encode`` (latents), ``arrays`` (the arrays file), ``frames_file`` (waiting for the
            lossless frames file and its hash), ``finish`` (manifest and reload).
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
    backend: str = ""
    loaded_from_cache: bool = False
    rebuild_reason: str = ""
    pipeline: Any = field(default=None, repr=False)
    _frames: LosslessFrames | FrameStore | None = field(default=None, repr=False)
    _state: dict[str, Any] = field(default_factory=dict, repr=False)
    _owns_pipeline: bool = field(default=False, repr=False)
    prepare_timings: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def n_frames(self) -> int:
        """Source frames at 25 fps."""
        return int(len(self.has_face))

    @property
    def n_faces(self) -> int:
        """Source frames with a face."""
        return int(self.has_face.sum())

    def __str__(self) -> str:
        how = "loaded from cache" if self.loaded_from_cache else f"prepared ({self.rebuild_reason})"
        return (f"Avatar {self.directory.name}: {self.n_frames} frames {self.frame_shape[1]}x{self.frame_shape[0]}, "
                f"{self.n_faces} with a face; {how}")

    def __repr__(self) -> str:  # the arrays are many megabytes: show what the avatar is, not its data
        return (f"Avatar({str(self.directory)!r}, {self.n_frames} frames, {self.n_faces} with a face, "
                f"{self.frame_shape[1]}x{self.frame_shape[0]}, backend {self.backend or '?'!r})")

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(str(self))}</p>"

    # -- loading -------------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, directory: str | os.PathLike, *, weights_dir: str | os.PathLike | None = None,
             config: InferenceConfig | None = None, check: bool = True, pipeline: Any = None) -> Avatar:
        """Load a prepared avatar, checking its format, files and hashes.

        Args:
            directory: The avatar folder written by :func:`prepare_avatar`.
            weights_dir: Weights folder for generation (default: the pipeline's, else the one it was prepared
                with, else the default).
            config: Override device / precision / batch size (cached fields must match the cache).
            check: Verify every file's size and SHA-256 (catches truncated or corrupted files).
            pipeline: A :class:`~nbhelpers.pipeline.MuseTalkPipeline` whose loaded models generate the clips.

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
                    and not (f == "landmark_backend" and "auto" in (config.landmark_backend, stored.landmark_backend))]
            if diff:
                raise CacheError(f"the avatar in {directory} was prepared with other settings ({', '.join(diff)}); "
                                 "prepare it again with prepare_avatar(..., config=...)")
            stored = stored.replace(device=config.device, fp16=config.fp16, batch_size=config.batch_size,
                                    encoder=config.encoder, restore=config.restore,
                                    restore_strength=config.restore_strength)
        if pipeline is not None:
            weights_dir = pipeline.weights_dir
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
                         backend=str(meta.get("backend", "")), loaded_from_cache=True, pipeline=pipeline)
        except (KeyError, ValueError, OSError) as exc:
            raise CacheError(f"{directory / ARRAYS_FILE} is unreadable ({exc}); the cache will be rebuilt") from exc
        if avatar.latents_np.shape[0] != avatar.n_faces or len(masks) != avatar.n_faces:
            raise CacheError(f"{directory} holds {avatar.latents_np.shape[0]} latents and {len(masks)} masks for "
                             f"{avatar.n_faces} frames with a face; the cache will be rebuilt")
        return avatar

    def frames(self) -> LosslessFrames | FrameStore:
        """The N source frames: read from the lossless file on demand (:class:`LosslessFrames`), or, for the avatar
        :func:`prepare_avatar` just built, the local raw copy it decoded them into (a
        :class:`~nbhelpers.framestore.FrameStore`, the very frames written losslessly: nothing is decoded again).
        Both give read-only (H, W, 3) uint8 BGR frames by index; the raw copy is removed by :meth:`close`, or once
        the frames are on the GPU, after which the lossless file serves them."""
        if self._frames is None:
            h, w = self.frame_shape
            self._frames = LosslessFrames(self.directory / FRAMES_FILE, self.n_frames, w, h)
        return self._frames

    # -- generation ----------------------------------------------------------------------------------------------

    def _pipeline(self):
        if self.pipeline is None:
            from .pipeline import MuseTalkPipeline

            self.pipeline = MuseTalkPipeline.from_pretrained(self.weights_dir, self.config)
            self._owns_pipeline = True
        return self.pipeline

    def _ensure_state(self) -> dict[str, Any]:
        """The pipeline's models, this avatar's latents and masks on its device, and the frames on the GPU when
        they fit comfortably (a quarter of the free memory); made once for all clips."""
        if "source" in self._state:
            return self._state
        import torch

        from .engine import SourceFaces

        pipe = self._pipeline()
        asked = pipe.job_config(self.config.replace(device=None, fp16=None))
        config = pipe.plan("realtime", asked, None, self.frame_shape)
        self.config = config
        # A whole clip into a file waits for no first frame: its own plan (kind "clip") allows larger batches,
        # unless the batch was asked for; live sessions and stream() keep the realtime batch of self.config.
        self._state["clip_config"] = pipe.plan("clip", asked, None, self.frame_shape)
        device = pipe.device
        frames = self.frames()
        latents = torch.from_numpy(self.latents_np).to(device=device, dtype=pipe.dtype)
        latent_row = np.full(self.n_frames, -1, dtype=np.int64)
        latent_row[np.flatnonzero(self.has_face)] = np.arange(self.n_faces)
        boxes = [tuple(int(v) for v in self.crop_boxes[j]) for j in np.flatnonzero(self.has_face)]
        source = SourceFaces(frames=frames, latent_row=latent_row, latents=latents, boxes=boxes, masks=self.masks,
                             squares=[tuple(int(v) for v in s) for s in self.squares]).to_device(device)
        if source.frames_device is not None and isinstance(self._frames, FrameStore):
            # The frames are on the GPU now: free the local raw copy, the lossless file serves any later host read.
            self._frames.close()
            self._frames = None
            source = dataclasses.replace(source, frames=self.frames())
        self._state.update(source=source, models=pipe.models_for(config))  # with the face restorer, if asked
        return self._state

    def optimize(self, compile: bool = False, channels_last: bool = True) -> Avatar:
        """Speed up generation on CUDA (no effect on CPU). Returns self.

        ``channels_last`` stores UNet and VAE convolution weights in NHWC, the layout cuDNN's fastest fp16 kernels
        use; ``compile`` wraps the UNet and the VAE decoder in ``torch.compile`` (a one-time cost of tens of
        seconds at the first batch, and again for each new batch shape). Numerics stay within fp16 rounding. This
        changes the pipeline's models, so its other jobs run the same way.
        """
        import torch

        st = self._ensure_state()
        models = st["models"]
        if models.device.type != "cuda":
            return self
        torch.backends.cudnn.benchmark = True
        if channels_last:
            models.unet.to(memory_format=torch.channels_last)
            models.vae.to(memory_format=torch.channels_last)
        if compile and not st.get("compiled"):
            models.unet.forward = torch.compile(models.unet.forward)
            models.vae.decoder.forward = torch.compile(models.vae.decoder.forward)
            st["compiled"] = True
        return self

    def load_models(self) -> Avatar:
        """Load UNet, VAE, whisper and the cached arrays onto the device now (else the first clip does it).

        Returns self, so that the first :meth:`generate` measures generation only.
        """
        self._ensure_state()
        self._pipeline().features(np.zeros(SAMPLE_RATE // FPS, dtype=np.float32))  # whisper + feature extractor
        return self

    def _features(self, audio, timings):
        from . import media
        from .checks import speech_frames

        pipe = self._pipeline()
        with timings.stage("audio"):
            if isinstance(audio, np.ndarray):
                waveform = np.asarray(audio, dtype=np.float32)
            else:
                path = Path(audio)
                if not path.is_file():
                    raise InputError(f"audio {str(path)!r} does not exist; give the path of a speech file.")
                waveform = media.load_audio(path)
            n_out = speech_frames(waveform)
            features = pipe.features(waveform)
        return waveform, features, n_out

    def generate(self, audio: str | os.PathLike | np.ndarray, output: str | os.PathLike | bool | None = None, *,
                 frame_callback=None, encoder: str | None = None, render_gate: Any = None) -> ClipResult:
        """Turn one speech clip into a video of this avatar.

        Args:
            audio: Speech file (any format ffmpeg reads), or a 16 kHz mono float32 waveform (then ``output``
                gets no audio track unless it is a file).
            output: MP4 path; None for ``<avatar>/vid_output/<audio name>.mp4``; False to write nothing (to
                measure generation alone).
            frame_callback: Called as ``frame_callback(t, frame)`` with each finished (H, W, 3) uint8 BGR frame
                (copy it if you keep it).
            encoder: Video encoder setting (:data:`nbhelpers.constants.ENCODERS`); default ``config.encoder``.
                Chosen once per avatar (the NVENC test encode runs once).
            render_gate: None, or a lock or semaphore shared by threads rendering clips at once: held only while
                this clip renders (:func:`nbhelpers.engine.run`), so reading its audio and starting its encoder
                happen before, and its encoder's finishing of the file after. The batch workers pass one.

        Returns:
            :class:`~nbhelpers.result.ClipResult` (``kind="avatar"``) with generation fps and end-to-end fps.

        Raises:
            InputError: The audio is missing, unreadable or shorter than one frame.
        """
        from . import media
        from .engine import Timings, flush_denormals, run

        t0 = time.perf_counter()
        timings = Timings()
        st = self._ensure_state()
        with flush_denormals(st["models"].device):
            waveform, features, n_out = self._features(audio, timings)
            if output is False:
                out_path = None
            elif output is None:
                name = Path(audio).stem if not isinstance(audio, np.ndarray) else "clip"
                out_path = self.directory / "vid_output" / f"{name}.mp4"
            else:
                out_path = Path(output)
            audio_track = None if isinstance(audio, np.ndarray) else Path(audio)
            h, w = self.frame_shape
            clip_config = st.get("clip_config", self.config)
            batch = int(clip_config.batch_size or 20)
            if out_path is None:
                run(st["source"], features, st["models"], batch, n_out, None, frame_callback=frame_callback,
                    timings=timings, render_gate=render_gate)
                final = None
            else:
                setting = encoder or self.config.encoder
                if self._state.get("encoder_setting") != setting:
                    self._state.update(encoder_setting=setting, encoder=media.choose_encoder(setting))
                writer = media.VideoWriter(out_path, w, h, fps=FPS, audio=audio_track, encoder=self._state["encoder"])
                with writer:
                    run(st["source"], features, st["models"], batch, n_out, writer, frame_callback=frame_callback,
                        timings=timings, render_gate=render_gate)
                final = Path(writer.path) if hasattr(writer, "path") else out_path
        return ClipResult(output=final, n_frames=n_out, source_frames=self.n_frames,
                          no_face_frames=self.n_frames - self.n_faces, fps=FPS,
                          duration_s=len(waveform) / SAMPLE_RATE, config=clip_config, backend=self.backend or "cache",
                          timings=dict(timings.seconds), wall_s=time.perf_counter() - t0, kind="avatar",
                          notes=self._pipeline().clip_notes((w, h) if final is not None else None))

    def stream(self, audio: str | os.PathLike | np.ndarray) -> Iterator[np.ndarray]:
        """Yield the finished (H, W, 3) uint8 BGR frames of one clip, in order, as they are made (no file)."""
        from .engine import Timings, render

        st = self._ensure_state()
        _, features, n_out = self._features(audio, Timings())
        for _, frames in render(st["source"], features, st["models"], int(self.config.batch_size or 20), n_out,
                                pad_batches=True):
            yield from (np.array(f) for f in frames)

    def live(self, **options: Any):
        """A live session of this avatar: push speech chunks as they arrive, get frames in order at 25 fps.

        ``session.push(samples, sample_rate)`` takes PCM chunks of any length; frames come out through
        ``for n, frame in session``, ``on_frame=`` and/or ``to=`` (a file or an ffmpeg URL, audio muxed live);
        ``session.close()`` flushes the tail and returns a :class:`~nbhelpers.result.ClipResult` (``kind="stream"``)
        with the latency figures. Options are those of :class:`nbhelpers.live.LiveSession` (``realtime``,
        ``delay_s``, ``hop``, ``silence``, ``to``...); which frames equal :meth:`generate` is said there.

        Raises:
            InputError: An option is out of range.
        """
        from .live import LiveSession

        return LiveSession(self, **options)

    def close(self) -> None:
        """Release this avatar's arrays on the device and its decoded frames; the models too when the avatar made
        its own pipeline (a pipeline passed in stays loaded for its other jobs)."""
        models_thread = self._state.get("live_models_thread")  # live sessions' model thread (nbhelpers.live)
        if models_thread is not None:
            models_thread.close()
        self._state.clear()
        if self._frames is not None:
            self._frames.close()
            self._frames = None
        from .gpu import release

        if self._owns_pipeline and self.pipeline is not None:
            self.pipeline.release()
            self.pipeline = None
            self._owns_pipeline = False
        release()


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
                   backend: Any = None, pipeline: Any = None) -> Avatar:
    """Prepare (or load) the avatar of a face video: frames, crop boxes, latents and blend masks, computed once.

    When ``directory`` already holds an avatar made from the same video content, settings, boxes, weights,
    format and package version, and every file passes its size and SHA-256 check, it is loaded without
    recomputation. Otherwise it is rebuilt (the reason is in ``rebuild_reason``): the decoded frames wait on local
    disk (the system's temporary folder, never the avatar folder, which may be on Google Drive), the cache files
    are written into a temporary folder inside ``directory`` and moved into place, with ``avatar.json`` last.
    Nothing asks on stdin.

    Args:
        video: Face video (any frame rate: converted to 25 fps) or photo.
        directory: The avatar folder (created; may be on Google Drive).
        config: Settings; cached fields are version, extra_margin, bbox_shift, parsing_mode, cheek widths,
            landmark backend, smoothing, seed, latent_mode and blur_ratio.
        boxes: Crop boxes given by hand, skipping detection, full-frame pixels: one ``(x1, y1, x2, y2)`` for
            every frame (bare, or a list holding just that box), or exactly one entry, a box or None (no face),
            per 25 fps frame of the whole video (an avatar keeps every frame of its video). Per-frame boxes of
            another length are refused before any model loads, with the video's frame count.
        weights_dir: Weights folder (default: the pipeline's, else :func:`nbhelpers.weights.default_dir`).
        rebuild: Rebuild even when the cache is valid.
        backend: Landmark backend object or name (default ``config.landmark_backend``).
        pipeline: A :class:`~nbhelpers.pipeline.MuseTalkPipeline` whose loaded models prepare the avatar and
            generate its clips; None makes one over ``weights_dir``.

    Returns:
        :class:`Avatar` with ``loaded_from_cache`` telling whether anything was recomputed. A rebuilt avatar
        serves its frames from the local raw copy decoded while preparing (bit-exact the frames in
        ``frames.mkv``, which is encoded and hashed in a thread while the models run) until :meth:`Avatar.close`
        or until they are on the GPU, so its first clip decodes nothing.

    Raises:
        InputError: The video is missing or unreadable, an option is invalid, or ``boxes`` does not fit the
            video (per-frame boxes not one per frame, a box outside the frame).
        WeightsError: Weight files are missing.
        NoFaceError: No frame has a face (pass ``boxes=``).
        DiskSpaceError: The local disk cannot hold the decoded frames.

    Source: ``scripts/realtime_inference.py:87-210`` (reference §9.2), without its stdin prompts (Q22) and with
    frames without a face kept (Q7).
    """
    from . import faces, media, weights
    from .blending import materials_for_frames
    from .checks import check_boxes, check_video, check_weights_dir, given_boxes, no_face_in_rotated_video
    from .engine import Timings, flush_denormals
    from .framestore import check_disk_for_frames, expected_frames
    from .latents import encode_frames
    from .pipeline import MuseTalkPipeline

    config = config or InferenceConfig()
    boxes = given_boxes(boxes)  # a list holding one box is that box (and the same cache key)
    if boxes is not None and config.landmark_backend != "boxes":
        config = config.replace(landmark_backend="boxes")
    directory = Path(directory)
    if pipeline is not None:
        weights_path = pipeline.weights_dir
    else:
        weights_path = Path(weights_dir) if weights_dir is not None else weights.default_dir()
    if directory.exists() and not directory.is_dir():
        raise InputError(f"directory {str(directory)!r} is a file; give a folder for the avatar (it is created).")
    video_path = Path(video)
    if not video_path.is_file():
        raise InputError(f"video {str(video_path)!r} does not exist; give the path of a face video or photo.")
    boxes_key = _boxes_key(boxes)
    reason = "rebuild asked" if rebuild else _stale_reason(directory, video_path, config, weights_path, boxes_key)
    if not reason:
        try:
            return Avatar.load(directory, weights_dir=weights_path, config=config, check=False, pipeline=pipeline)
        except CacheError as exc:
            reason = str(exc)

    # Validate the video and the weights before any heavy work.
    from . import gpu

    gpu.check_device(config.device)
    _, video_info = check_video(video_path)
    boxes = check_boxes(boxes, video_path, video_info)
    check_weights_dir(weights_path, config.version, config.landmark_backend)
    if config.restore is not None:
        from .restore import check_available

        check_available(config.restore, weights_path)
    owns = pipeline is None
    pipe = pipeline or MuseTalkPipeline.from_pretrained(weights_path, config)
    run_config = pipe.job_config(config.replace(device=None, fp16=None) if not owns else config)
    pipe.check_weights(run_config.landmark_backend)

    reader = media.load_video(video_path)
    check_disk_for_frames(expected_frames(video_info, 1), reader.height, reader.width)
    store = FrameStore(reader.height, reader.width)
    directory.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=directory))
    writer: _BackgroundWrite | None = None
    kept = False  # the frame store becomes the new avatar's frames (no decode of the file just written)
    timings = Timings()
    try:
        with timings.stage("frames"):
            detector = ("auto" if config.landmark_backend == "boxes"
                        else pipe.landmarks(backend or run_config.landmark_backend))
            try:
                track = faces.track(store.tee(reader), backend=detector, config=config, boxes=boxes,
                                    weights_dir=weights_path)
            except NoFaceError as exc:
                raise no_face_in_rotated_video(exc, video_info) from None
            store.finish()
            reader.close()
        run_config = pipe.plan("avatar", run_config, len(store), store.frame_shape[:2])
        batch = int(run_config.batch_size or 8)
        face_frames = np.flatnonzero(track.has_face)
        h, w = store.frame_shape[:2]
        # The lossless file is encoded and hashed in a thread while the models compute masks and latents. Face
        # parsing (our own network, torch only) runs before the VAE: where the VAE is still loading in another
        # thread (a batch worker's preload, whose diffusers import takes seconds), the masks are made meanwhile.
        # The two are independent (the latents' sampling has its own seeded generator).
        writer = _BackgroundWrite(store, work / FRAMES_FILE, w, h)
        with flush_denormals(pipe.device):
            with timings.stage("parser_wait"):
                parser = pipe.face_parser
            parser.batch_size = batch
            with timings.stage("parse"):
                materials = materials_for_frames(store, track.crop_boxes, face_frames, parser, run_config)
                masks = [np.ascontiguousarray(m.mask.cpu().numpy() if hasattr(m.mask, "cpu") else m.mask)
                         for m in materials]
            with timings.stage("vae_wait"):
                vae = pipe.vae
            with timings.stage("encode"):
                latents_np = encode_frames(store, track.crop_boxes, face_frames, vae, seed=config.seed,
                                           mode=config.latent_mode, batch_size=batch).float().cpu().numpy()
        squares = np.asarray([m.square for m in materials], dtype=np.int32).reshape(-1, 4)
        crop_boxes = np.asarray(track.crop_boxes, dtype=np.int32)

        # Write: frames (in the thread), arrays, then the manifest last (its presence marks a complete cache).
        with timings.stage("arrays"):
            sides = np.asarray([m.shape[0] for m in masks], dtype=np.int32)
            flat = np.concatenate([m.reshape(-1) for m in masks]) if masks else np.zeros(0, np.uint8)
            with open(work / ARRAYS_FILE, "wb") as fh:
                np.savez(fh, crop_boxes=crop_boxes, has_face=track.has_face.astype(np.uint8), latents=latents_np,
                         squares=squares, mask_sides=sides, masks_flat=flat)
        with timings.stage("frames_file"):
            n_written, frames_size, frames_sha = writer.result()
        writer = None
        finish_start = time.perf_counter()
        if n_written != len(store):
            raise CacheError(f"wrote {n_written} of {len(store)} frames")
        files = {FRAMES_FILE: {"size": frames_size, "sha256": frames_sha},
                 ARRAYS_FILE: {"size": (work / ARRAYS_FILE).stat().st_size, "sha256": _sha256(work / ARRAYS_FILE)}}
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
            "files": files,
        }
        (directory / MANIFEST).unlink(missing_ok=True)  # invalidate first: a crash below leaves no stale manifest
        for name in (FRAMES_FILE, ARRAYS_FILE):
            os.replace(work / name, directory / name)
        tmp_manifest = work / MANIFEST
        tmp_manifest.write_text(json.dumps(meta, indent=1, sort_keys=True), "utf-8")
        os.replace(tmp_manifest, directory / MANIFEST)
        # The arrays are read back from the cache just written; the frames are the store's (bit-exact the same
        # as the lossless file, which decodes back exactly: FFV1), so the first clip decodes nothing.
        # Its clips plan their own batch (Avatar._ensure_state): the preparation's batch is not a batch asked for.
        clip_config = run_config.replace(batch_size=config.batch_size,
                                         reasons={k: v for k, v in run_config.reasons.items() if k != "batch_size"})
        avatar = Avatar.load(directory, weights_dir=weights_path, config=clip_config, check=False, pipeline=pipe)
        avatar._frames = store
        kept = True
        timings.add("finish", time.perf_counter() - finish_start)
        avatar.prepare_timings = {k: round(v, 4) for k, v in timings.seconds.items()}
    finally:
        if writer is not None:  # an error before the frames were written: stop the encoder before cleaning up
            writer.cancel()
        reader.close()
        if not kept:
            store.close()
        shutil.rmtree(work, ignore_errors=True)

    avatar._owns_pipeline = owns
    avatar.loaded_from_cache = False
    avatar.rebuild_reason = reason
    return avatar


# Kept for code written against the first releases: the one result type of every clip.
GenerateResult = ClipResult

__all__ = ["AVATAR_FORMAT", "Avatar", "GenerateResult", "LosslessFrames", "prepare_avatar", "read_lossless",
           "write_lossless"]
