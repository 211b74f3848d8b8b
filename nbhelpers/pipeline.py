"""The offline lip-sync job: a face video (or photo) and a speech file in, a finished MP4 out.

One job method, :func:`lipsync`, whose body is numbered steps matching the notebook headings (media, faces, gpu,
models, audio, latents, parsing, generate/blending, encode). Reproduces the official offline pipeline
(``scripts/inference.py``, reference §2-§8) and fixes the official bugs that lose frames or drift (reference §11):

- Q6: frames without a face no longer shift the latent index: latents are indexed by source frame.
- Q7: a frame without a face is written unchanged instead of being skipped (which cut the video short).
- Q8: every input is converted to constant 25 fps at ingest, so the frame count matches the audio.
- Q17: crop boxes are clamped to the frame (see :func:`nbhelpers.faces.crop_box`).
- Q24: the video is encoded once (libx264 CRF 18) with the audio muxed by explicit stream mapping.
- Q25: frames are streamed to disk (``FrameStore``), never all held in RAM.
- Q1: the VAE posterior is sampled from a seeded generator, so runs are reproducible.
"""

from __future__ import annotations

import html
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .config import InferenceConfig
from .constants import FPS, SAMPLE_RATE
from .errors import FFmpegError, InputError, MediaError, NbHelpersError
from .framestore import FrameStore, cycle_index, output_frame_count

OFFLINE_BLUR_RATIO = 0.05  # feather kernel k = int(0.05 * 2s // 2 * 2) + 1 (blending.py:81)


@dataclass
class Timings:
    """Wall-clock seconds per stage, in the order the stages ran."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    @property
    def total(self) -> float:
        return float(sum(self.seconds.values()))


@dataclass(frozen=True)
class LipsyncResult:
    """What one :func:`lipsync` job produced. Shows the video inline in a notebook.

    Attributes:
        output: Path of the finished MP4 (25 fps, source resolution, the input audio muxed in).
        n_frames: Output frames written, ``floor(audio seconds x 25)``.
        source_frames: 25 fps frames of the source video (1 for a photo).
        no_face_frames: Source frames without a face; they pass through unchanged.
        fps: Output frame rate (25).
        duration_s: Audio duration in seconds (16 kHz samples / 16000).
        config: The settings used, with the planner's reasons in ``config.reasons``.
        backend: Landmark backend that found the faces (``"boxes"`` when boxes were given).
        timings: Seconds per stage (media, faces, models, audio, latents, parsing, generate, encode...).
        wall_s: Wall-clock seconds from the call to the closed file.
    """

    output: Path
    n_frames: int
    source_frames: int
    no_face_frames: int
    fps: int
    duration_s: float
    config: InferenceConfig
    backend: str
    timings: dict[str, float]
    wall_s: float

    @property
    def end_to_end_fps(self) -> float:
        """Output frames per wall-clock second, everything included."""
        return self.n_frames / self.wall_s if self.wall_s > 0 else float("nan")

    def summary(self) -> str:
        c = self.config
        precision = "fp16" if c.fp16 else "fp32"
        return (f"{self.output.name}: {self.n_frames} frames at {self.fps} fps ({self.duration_s:.2f} s), "
                f"source {self.source_frames} frames, {self.no_face_frames} without a face; {c.version}, "
                f"{precision}, batch {c.batch_size}, {c.device}; landmarks: {self.backend}; "
                f"{self.wall_s:.1f} s wall ({self.end_to_end_fps:.1f} fps end to end)")

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        try:
            from .ui import video_html

            player = video_html(self.output)
        except Exception:  # noqa: BLE001 - the summary is still useful without the player
            player = ""
        return f"<p>{html.escape(self.summary())}</p>{player}"


@contextmanager
def flush_denormals(device) -> Any:
    """On the CPU, treat denormal floats as zero while the block runs (then restore the default, off).

    Random or lightly trained weights give many denormal activations, which the CPU handles in slow microcode
    (the tiny test UNet ran about 4x faster with them flushed). The values involved are below 1e-38, far under
    fp32 resolution of the images, so results are unchanged in practice. No effect on CUDA.
    """
    import torch

    on_cpu = torch.device(device).type == "cpu"
    if on_cpu:
        torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if on_cpu:
            torch.set_flush_denormal(False)


# ------------------------------------------------------------------------------------------------------------------
# Checks


def _as_input_path(value: Any, name: str) -> Path:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise InputError(f"{name} is required: give the path of a file; got {value!r}.")
    path = Path(os.fspath(value)).expanduser()
    if not path.exists():
        raise InputError(f"{name} {str(path)!r} does not exist. Check the path (upload the file first in "
                         "notebook 02_media, or give the full path).")
    if path.is_dir():
        raise InputError(f"{name} {str(path)!r} is a folder; give a video, image or audio file.")
    return path


def check_inputs(video: Any, audio: Any, output: Any = None, *, config: InferenceConfig,
                 weights_dir: Any = None, boxes: Any = None) -> tuple[Path, Path, Path, Path, Any, Any]:
    """Validate every input of a job before any frame is decoded or any model loads.

    Args:
        video: Face video or photo path.
        audio: Speech file path (any format ffmpeg reads, or a video with an audio stream).
        output: Output MP4 path, or None for ``results/<video>_<audio>.mp4`` in the working directory.
        config: Settings (already validated by :class:`InferenceConfig`).
        weights_dir: Folder of the weights (official ``models/`` layout), or None for the default.
        boxes: User crop boxes or None.

    Returns:
        ``(video, audio, output, weights_dir, video_info, audio_info)``.

    Raises:
        InputError: A file is missing, is not media, has no video/audio stream, or the output is not ``.mp4``.
        NoGpuError: ``config.device`` names a CUDA device this runtime does not have.
        WeightsError: Weight files are missing (names them and gives the download command).
    """
    from . import media

    video_path, weights_path, video_info = _check_video_only(video, config, weights_dir)
    audio_path = _as_input_path(audio, "audio")
    if output is None:
        output_path = Path.cwd() / "results" / f"{video_path.stem}_{audio_path.stem}.mp4"
    else:
        output_path = Path(os.fspath(output)).expanduser()
        if output_path.suffix.lower() != ".mp4":
            raise InputError(f"output must end in .mp4; got {str(output_path)!r}.")
    try:
        audio_info = media.probe(audio_path)
    except MediaError as exc:
        raise InputError(f"audio {str(audio_path)!r} could not be read: {exc}") from exc
    if not audio_info.has_audio:
        raise InputError(f"audio {str(audio_path)!r} has no audio stream. Give a speech file (wav, mp3, m4a, "
                         "ogg, flac) or a video that carries sound.")
    if boxes is None and config.landmark_backend == "boxes":
        raise InputError("landmark_backend='boxes' needs boxes=: one (x1, y1, x2, y2) for the clip or one per frame.")
    return video_path, audio_path, output_path, weights_path, video_info, audio_info


# ------------------------------------------------------------------------------------------------------------------
# The job


def lipsync(video: str | os.PathLike, audio: str | os.PathLike, output: str | os.PathLike | None = None, *,
            version: str | None = None, boxes: Any = None, config: InferenceConfig | None = None,
            weights_dir: str | os.PathLike | None = None, backend: Any = None,
            frame_callback: Callable[[int, np.ndarray], None] | None = None) -> LipsyncResult:
    """Lip-sync a face video (or photo) to a speech file and write an MP4.

    The output has ``floor(audio seconds x 25)`` frames at 25 fps and the source resolution; source frames cycle
    forward and back (0..N-1, N-1..0, ...) as the official code does, so audio longer than the video loops it and
    shorter audio uses its first frames. Frames without a face are written unchanged (counted in
    ``no_face_frames``). The input audio is muxed in by explicit stream mapping.

    Args:
        video: Face video (any container ffmpeg reads, any frame rate: converted to 25 fps) or a photo.
        audio: Speech (wav, mp3, m4a, ogg, flac, or a video with sound), any sample rate and channel count.
        output: Path of the MP4 to write (default ``results/<video>_<audio>.mp4``). Written under a temporary
            name and renamed when complete.
        version: ``"v15"`` or ``"v1"``; overrides ``config.version`` when given.
        boxes: Crop boxes given by hand instead of detecting faces: one ``(x1, y1, x2, y2)`` in source pixels for
            the whole clip, or one per 25 fps frame (None for a frame without a face).
        config: :class:`InferenceConfig`; missing device, precision and batch size are planned from the GPU.
        weights_dir: Folder of the weights in the official layout (default :func:`nbhelpers.weights.default_dir`).
        backend: A landmark backend object or name; default ``config.landmark_backend``.
        frame_callback: Called as ``frame_callback(t, frame)`` with each finished (H, W, 3) uint8 BGR frame before
            it is encoded (for tests and previews).

    Returns:
        :class:`LipsyncResult` (shows the video inline in a notebook).

    Raises:
        InputError: A file is missing or unreadable, has no video or audio stream, or an option is invalid
            (before anything heavy runs).
        WeightsError: Weight files are missing or corrupt (names them and gives the download command).
        NoFaceError: No frame has a face (before the UNet loads): pass ``boxes=`` or another clip.
        FFmpegError: ffmpeg failed (its stderr is in the message).

    Source: ``scripts/inference.py:85-249`` (reference §2-§8), with the fixes listed in the module docstring.
    """
    t0 = time.perf_counter()
    timings = Timings()
    config = config or InferenceConfig()
    if version is not None and version != config.version:
        config = config.replace(version=version)
    if boxes is not None and config.landmark_backend != "boxes":
        config = config.replace(landmark_backend="boxes")

    # 1. check inputs: files, streams and weights, before anything heavy
    video_path, audio_path, output_path, weights_path, video_info, _ = check_inputs(
        video, audio, output, config=config, weights_dir=weights_dir, boxes=boxes)

    from . import faces, gpu, media, models

    # 2. media: audio at 16 kHz, frames at constant 25 fps streamed to disk while the faces are found
    with timings.stage("media"):
        waveform = media.load_audio(audio_path)
    n_out = output_frame_count(len(waveform))
    if n_out < 1:
        raise InputError(f"audio {str(audio_path)!r} lasts {len(waveform) / SAMPLE_RATE:.3f} s, shorter than one "
                         f"frame (1/{FPS} s); give at least 0.04 s of speech.")

    reader = media.load_video(video_path)
    store = FrameStore(reader.height, reader.width)
    stack = ExitStack()
    try:
        # 3. faces: crop box per frame (or the boxes given), before any heavy model loads
        with timings.stage("faces"):
            track = faces.track(store.tee(reader), backend=backend or config.landmark_backend, config=config,
                                boxes=boxes, weights_dir=weights_path)
        store.finish()
        reader.close()
        if len(store) != track.n_frames:
            raise MediaError(f"internal: decoded {len(store)} frames but tracked {track.n_frames}")

        # 4. gpu: device, precision and batch size from free memory (user overrides kept)
        plan = gpu.plan(kind="lipsync", config=config, n_frames=n_out, frame_size=store.frame_shape[:2],
                        weights=_weights_kind(weights_path), source_frames=len(store))  # issue 14 item 11
        config = plan.config
        device, dtype = _device_dtype(config)

        # 5. models: load on CPU with memory mapping, cast, then move (no fp32 copy on the GPU in fp16)
        stack.enter_context(flush_denormals(device))
        with timings.stage("models"):
            bundle = models.load_models(weights_path, version=config.version, device=device, dtype=dtype)

        # 6. audio: whisper features, one (50, 384) token block per output frame
        with timings.stage("audio"):
            from .audio import whisper_features

            features = whisper_features(waveform, bundle.whisper, fps=FPS,
                                        feature_extractor=bundle.feature_extractor)
        if features.shape[0] != n_out:
            raise NbHelpersError(f"internal: {features.shape[0]} feature frames for {n_out} output frames")

        # 7. latents: crop, resize and encode each source frame with a face (indexed by source frame: fixes Q6).
        # The ping-pong cycle over n_out output frames uses source frames 0..min(n_out, N)-1 only, so a short
        # clip over a long video encodes and parses only those (the official code prepares every frame).
        used = min(n_out, len(store))
        face_frames = np.flatnonzero(track.has_face[:used])
        with timings.stage("latents"):
            latents = _encode_faces(store, track, face_frames, bundle.vae, config)
        latent_row = np.full(len(store), -1, dtype=np.int64)
        latent_row[face_frames] = np.arange(len(face_frames))

        # 8. parsing: blend material (feathered mask + expanded square) of each source frame with a face
        with timings.stage("parsing"):
            materials = _blend_materials(store, track, face_frames, weights_path, device, dtype, config)

        # 9-10. generate and blend: UNet + VAE decode per batch of output frames, paste back, encode
        writer = media.VideoWriter(output_path, store.width, store.height, fps=FPS, audio=audio_path)
        with writer, _BackgroundWriter(writer, frame_callback) as sink:
            _generate(store, track, latents, latent_row, materials, features, bundle, config, sink, n_out,
                      device, timings)
        timings.seconds["encode_wait"] = sink.wait_s
    finally:
        stack.close()
        reader.close()
        store.close()

    return LipsyncResult(output=Path(writer.path if hasattr(writer, "path") else output_path), n_frames=n_out,
                         source_frames=track.n_frames, no_face_frames=int(track.n_no_face), fps=FPS,
                         duration_s=len(waveform) / SAMPLE_RATE, config=config, backend=track.backend,
                         timings=dict(timings.seconds), wall_s=time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------------------------
# Steps


def _weights_kind(weights_path: Path) -> str:
    return "tiny" if (weights_path / "tiny.json").is_file() else "full"


def _device_dtype(config: InferenceConfig):
    import torch

    device = torch.device(config.device or "cpu")
    dtype = torch.float16 if config.fp16 else torch.float32
    return device, dtype


def _encode_faces(store: FrameStore, track, face_frames: np.ndarray, vae, config: InferenceConfig):
    """(M, 8, 32, 32) latents of the M source frames with a face, in frame order, on the VAE device."""
    import torch

    from .latents import crop_and_resize, encode

    chunks = []
    batch = max(1, int(config.batch_size or 8))
    # Runs of consecutive source frames, cut into batches: the posterior noise of source frame i is seeded from
    # (seed, i) (``first_index``), so the batch size, the OOM fallback, frames without a face, and whether all
    # frames or a prefix are encoded (offline job vs avatar) never change a frame's latents.
    starts = [0] + [k for k in range(1, len(face_frames)) if face_frames[k] != face_frames[k - 1] + 1]
    bounds = list(zip(starts, starts[1:] + [len(face_frames)], strict=True))
    for run_start, run_stop in bounds:
        for start in range(run_start, run_stop, batch):
            idx = face_frames[start:min(start + batch, run_stop)]
            crops = np.stack([crop_and_resize(store[int(i)], track.crop_boxes[int(i)]) for i in idx])
            chunks.append(encode(crops, vae, generator=int(config.seed), mode=config.latent_mode,
                                 first_index=int(idx[0]), batch_size=batch))
    if not chunks:
        raise NbHelpersError("internal: no face frames to encode")
    # Contiguous (NCHW) like latents reloaded from an avatar cache: the VAE can hand back channels-last tensors,
    # and convolution kernels round differently per memory format, so this keeps offline == avatar bit-exact.
    return torch.cat(chunks).contiguous()


def _blend_materials(store: FrameStore, track, face_frames: np.ndarray, weights_path: Path, device, dtype,
                     config: InferenceConfig) -> dict[int, Any]:
    from . import blending
    from .gpu import release
    from .parsing import FaceParser

    parser = FaceParser(weights_path, device=device, dtype=dtype, batch_size=int(config.batch_size or 8))
    try:
        materials: dict[int, Any] = {}
        chunk = 32
        for start in range(0, len(face_frames), chunk):
            idx = [int(i) for i in face_frames[start:start + chunk]]
            mats = blending.prepare_materials([store[i] for i in idx], [track.crop_boxes[i] for i in idx], parser,
                                              mode=config.effective_parsing_mode,
                                              left_cheek_width=config.left_cheek_width,
                                              right_cheek_width=config.right_cheek_width,
                                              blur_ratio=config.blur_ratio)
            materials.update(zip(idx, mats, strict=True))
        return materials
    finally:
        release(parser)


@dataclass
class RenderInputs:
    """Everything the generation loop needs about the source frames (from a job or an avatar cache).

    Attributes:
        frames: N source frames (N, H, W, 3) uint8 BGR with random access on the host (FrameStore or array).
        latent_row: (N,) int64: row of ``latents``/``boxes``/``masks`` for each source frame, -1 = no face.
        latents: (M, 8, 32, 32) tensor on the UNet device, one per source frame with a face.
        boxes: M crop boxes ``(x1, y1, x2, y2)``.
        masks: M feathered masks (2s, 2s) uint8 (numpy, or tensors already on the device).
        squares: M expanded squares ``(xs, ys, xe, ye)``.
        frames_device: optional (N, H, W, 3) uint8 tensor of the same frames already on the GPU.
    """

    frames: Any
    latent_row: np.ndarray
    latents: Any
    boxes: Sequence[Any]
    masks: Sequence[Any]
    squares: Sequence[Any]
    frames_device: Any = None


def render(inputs: RenderInputs, features, bundle, batch_size: int, n_out: int, device, *,
           timings: Timings | None = None, pinned: bool = False):
    """Yield ``(first_output_index, frames)`` for all output frames, in order: UNet, decode, blend.

    Output frame ``t`` uses source frame ``cycle_index(t, N)`` (the official ping-pong, reference §4.5) and whisper
    tokens ``features[t]``. Frames whose source frame has no face are the source frame unchanged. Batches run
    through :func:`nbhelpers.gpu.batched`, so an out-of-memory halves the batch and retries the same frames.
    On CUDA the blend runs on the GPU (:func:`nbhelpers.blending.blend_torch`) and only finished frames are copied
    to the host; on CPU the bit-exact :func:`nbhelpers.blending.blend_cpu` is used.

    Args:
        inputs: The source frames, latents and blend material.
        features: (T, 50, 384) whisper tokens, T >= n_out, on the device.
        bundle: Loaded models (``unet``, ``vae``, ``pe``).
        batch_size: Output frames per batch.
        n_out: Output frames to produce.
        device: torch device of the models.
        timings: Accumulates ``generate`` (UNet + decode) and ``blend`` seconds when given (CUDA-synchronised
            per batch only when timings are asked for).
        pinned: Copy finished frames into a ring of pinned host buffers (CUDA only). The caller must consume each
            batch before ``len(ring) - 1`` more batches are produced (the background writer queue guarantees it).

    Yields:
        ``(t0, frames)`` with frames an (B, H, W, 3) uint8 BGR numpy array for output frames t0..t0+B-1.
    """
    import torch

    from . import blending
    from .gpu import batched
    from .latents import decode, unet_step

    n_src = len(inputs.frames)
    src_of = cycle_index(np.arange(n_out), n_src)
    on_cuda = torch.device(device).type == "cuda"
    ring: list = []
    ring_pos = [0]
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)

    def host_buffer(shape):
        # A ring of 4 pinned buffers: with the writer queue of depth 2 and one batch being encoded, the buffer
        # reused for batch k last held batch k - 4, which the writer has finished with.
        if not (pinned and on_cuda):
            return None
        slot = ring_pos[0] % 4
        ring_pos[0] += 1
        if len(ring) <= slot:
            ring.append(None)
        if ring[slot] is None or tuple(ring[slot].shape) != shape:
            ring[slot] = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        return ring[slot]

    def step(sl: slice) -> np.ndarray:
        ts = np.arange(sl.start, sl.stop)
        js = src_of[ts]
        rows = inputs.latent_row[js]
        has = rows >= 0
        t_start = time.perf_counter()
        with torch.inference_mode():
            faces_256 = None
            if has.any():
                lat = inputs.latents[torch.as_tensor(rows[has], device=inputs.latents.device)]
                feat = features[torch.as_tensor(ts[has], device=features.device)]
                faces_256 = decode(unet_step(bundle.unet, bundle.pe, lat, feat), bundle.vae)
            if timings is not None:
                sync()
                t_gen = time.perf_counter()
                timings.seconds["generate"] = timings.seconds.get("generate", 0.0) + t_gen - t_start
            face_rows = [int(r) for r in rows[has]]
            if on_cuda:
                if inputs.frames_device is not None:
                    frames_t = inputs.frames_device[torch.as_tensor(js, device=inputs.frames_device.device)]
                else:
                    frames_t = torch.from_numpy(np.stack([inputs.frames[int(j)] for j in js])).to(
                        device, non_blocking=True)
                if faces_256 is not None:
                    pos = torch.as_tensor(np.flatnonzero(has), device=frames_t.device)
                    blended = blending.blend_torch(frames_t[pos], faces_256,
                                                   [inputs.boxes[r] for r in face_rows],
                                                   [inputs.masks[r] for r in face_rows],
                                                   [inputs.squares[r] for r in face_rows], inplace=True)
                    frames_t[pos] = blended
                buf = host_buffer(tuple(frames_t.shape))
                if buf is not None:
                    buf.copy_(frames_t, non_blocking=True)
                    torch.cuda.current_stream().synchronize()
                    frames = buf.numpy()
                else:
                    frames = frames_t.cpu().numpy()
            else:
                frames = np.stack([inputs.frames[int(j)] for j in js])
                if faces_256 is not None:
                    faces_np = faces_256.cpu().numpy()
                    for k, p in enumerate(np.flatnonzero(has)):
                        r = face_rows[k]
                        frames[p] = blending.blend_cpu(frames[p], faces_np[k], inputs.boxes[r], inputs.masks[r],
                                                       inputs.squares[r])
        if timings is not None:
            timings.seconds["blend"] = timings.seconds.get("blend", 0.0) + time.perf_counter() - t_gen
        return frames

    for sl, frames in batched(n_out, int(batch_size), step, stage="generate"):
        yield sl.start, frames


def _generate(store: FrameStore, track, latents, latent_row: np.ndarray, materials: dict[int, Any], features,
              bundle, config: InferenceConfig, sink, n_out: int, device, timings: Timings | None = None) -> None:
    """Run :func:`render` over a job's frames and send each finished batch to ``sink``."""
    from .progress import bar

    face_frames = sorted(materials)
    inputs = RenderInputs(frames=store, latent_row=latent_row, latents=latents,
                          boxes=[materials[j].box for j in face_frames],
                          masks=[materials[j].mask for j in face_frames],
                          squares=[materials[j].square for j in face_frames])
    with bar(total=n_out, desc="generate", unit="frame") as progress:
        for first, frames in render(inputs, features, bundle, int(config.batch_size or 8), n_out, device,
                                    timings=timings, pinned=True):
            sink.put(first, frames)
            progress.update(len(frames))


class _BackgroundWriter:
    """Encodes finished frames on a thread while the GPU computes the next batch (at most 2 batches queued).

    No wait is unbounded (issue 14 item 10): queueing a batch and the final join give up after ``timeout_s``
    (default: the writer's ``stall_timeout_s`` plus 30 s, since the writer bounds each of its own waits), then
    abort the writer (killing ffmpeg, which releases a write blocked on its pipe) and raise FFmpegError.
    """

    def __init__(self, writer, frame_callback=None, depth: int = 2, timeout_s: float | None = None):
        self.writer = writer
        self.frame_callback = frame_callback
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.wait_s = 0.0
        stall = getattr(writer, "stall_timeout_s", None)
        self.timeout_s = timeout_s if timeout_s is not None else (stall + 30.0 if stall is not None else None)
        self.thread = threading.Thread(target=self._run, name="nbhelpers-encode", daemon=True)

    def __enter__(self) -> _BackgroundWriter:
        self.thread.start()
        return self

    def _stalled(self, doing: str) -> FFmpegError:
        self.writer.abort()
        self.thread.join(timeout=5)
        return FFmpegError(f"the encoder thread did not {doing} within {self.timeout_s:g} s "
                           f"({getattr(self.writer, 'frames_written', '?')} frames written): ffmpeg or the frame "
                           "callback is stuck (an output folder on a network mount that stopped answering?). "
                           "ffmpeg was stopped and nothing was saved; write to a local folder and copy the file.")

    def _enqueue(self, item) -> None:
        start = time.monotonic()
        while True:
            if self.error is not None and item is not None:
                raise self.error
            try:
                self.queue.put(item, timeout=0.5)
                return
            except queue.Full:
                if not self.thread.is_alive():
                    raise NbHelpersError("internal: the encoder thread stopped") from None
                if self.timeout_s is not None and time.monotonic() - start > self.timeout_s:
                    raise self._stalled("take the next batch") from None

    def put(self, first_index: int, frames: np.ndarray) -> None:
        self._enqueue((first_index, frames))

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is not None:
                continue
            first, frames = item
            try:
                if self.frame_callback is not None:
                    for k, frame in enumerate(frames):
                        self.frame_callback(first + k, frame)
                self.writer.write(frames)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                self.error = exc

    def __exit__(self, exc_type, exc, tb) -> None:
        start = time.perf_counter()
        try:
            self._enqueue(None)
            self.thread.join(self.timeout_s)
            if self.thread.is_alive():
                raise self._stalled("finish the last batches")
        except NbHelpersError:
            if exc_type is None:
                raise  # else the job's own exception is the one to see
        finally:
            self.wait_s = time.perf_counter() - start
        if exc_type is None and self.error is not None:
            raise self.error


def describe_boxes(boxes: Sequence[Any] | None) -> str:
    """One line describing user boxes (for logs)."""
    if boxes is None:
        return "detected"
    arr = np.asarray(boxes, dtype=object)
    return "one box for the clip" if arr.ndim == 1 else f"{len(arr)} boxes given"




# ------------------------------------------------------------------------------------------------------------------
# First-frame preview


@dataclass(frozen=True)
class Preview:
    """The inpainting of one frame, shown before a full run (figure with four panels in a notebook).

    Attributes:
        frame: (H, W, 3) uint8 BGR source frame (25 fps numbering).
        result: (H, W, 3) uint8 BGR frame after repainting and blending.
        face_256: (256, 256, 3) uint8 BGR generated crop (the UNet output decoded by the VAE).
        crop_box: ``(x1, y1, x2, y2)`` crop box in frame pixels; the lower half of it is repainted.
        landmarks: (68, 2) float32 landmarks, or None when boxes were given.
        mask: (2s, 2s) uint8 feathered blend mask over the expanded square ``square``.
        square: ``(xs, ys, xe, ye)`` expanded square.
        audio: Where the audio tokens came from (a file's first frame, or seeded random tokens).
    """

    frame: np.ndarray
    result: np.ndarray
    face_256: np.ndarray
    crop_box: tuple[int, int, int, int]
    landmarks: np.ndarray | None
    mask: np.ndarray
    square: tuple[int, int, int, int]
    audio: str

    def figure(self):
        """A matplotlib Figure (no pyplot): source with box and landmarks, blend mask, generated crop, result."""
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle

        fig = Figure(figsize=(12, 3.6), dpi=90)
        axes = fig.subplots(1, 4)
        x1, y1, x2, y2 = self.crop_box
        axes[0].imshow(self.frame[:, :, ::-1])
        axes[0].add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, color="lime", lw=1.5))
        axes[0].axhline((y1 + y2) / 2, xmin=0, xmax=1, color="yellow", lw=0.6, ls="--")
        if self.landmarks is not None:
            axes[0].scatter(self.landmarks[:, 0], self.landmarks[:, 1], s=2, c="cyan")
        axes[0].set_title("crop box (green), midline (yellow)")
        overlay = self.frame[:, :, ::-1].astype(np.float32) / 255
        xs, ys, xe, ye = self.square
        h, w = overlay.shape[:2]
        cx0, cy0, cx1, cy1 = max(xs, 0), max(ys, 0), min(xe, w), min(ye, h)
        m = self.mask[cy0 - ys:cy1 - ys, cx0 - xs:cx1 - xs].astype(np.float32) / 255
        overlay[cy0:cy1, cx0:cx1, 0] = overlay[cy0:cy1, cx0:cx1, 0] * (1 - m) + m
        axes[1].imshow(overlay)
        axes[1].set_title("blend mask (red)")
        axes[2].imshow(self.face_256[:, :, ::-1])
        axes[2].set_title("generated crop 256x256")
        axes[3].imshow(self.result[:, :, ::-1])
        axes[3].set_title("result")
        pad = max(x2 - x1, y2 - y1)
        for ax in (axes[0], axes[1], axes[3]):
            ax.set_xlim(max(x1 - pad // 2, 0), min(x2 + pad // 2, w))
            ax.set_ylim(min(y2 + pad // 2, h), max(y1 - pad // 2, 0))
        for ax in axes:
            ax.set_xticks([])
            ax.set_yticks([])
        fig.tight_layout()
        return fig

    def _repr_png_(self) -> bytes:
        import io

        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()

    def __repr__(self) -> str:
        return (f"Preview(crop_box={self.crop_box}, square={self.square}, frame={self.frame.shape[1]}x"
                f"{self.frame.shape[0]}, audio={self.audio!r})")


def preview(video: str | os.PathLike, config: InferenceConfig | None = None, *,
            weights_dir: str | os.PathLike | None = None, boxes: Any = None,
            audio: str | os.PathLike | None = None, frame_index: int = 0, backend: Any = None) -> Preview:
    """Repaint one frame with the current settings, to check the crop box and mask before a full run.

    Runs the same steps as :func:`lipsync` on a single 25 fps frame: faces (or the boxes given), latents, parsing,
    UNet + decode and blending. With ``audio`` the tokens of its first output frame are used; without, seeded
    random tokens stand in, as the official app's "Test Inpainting" button does with unseeded ones
    (``app.py:35-123``), so the mouth shape is arbitrary but the crop, mask and blend are the real ones.

    Args:
        video: Face video or photo.
        config: Settings (default :class:`InferenceConfig`).
        weights_dir: Weights folder (default :func:`nbhelpers.weights.default_dir`).
        boxes: One crop box ``(x1, y1, x2, y2)`` or per-frame boxes, as for :func:`lipsync`.
        audio: Optional speech file.
        frame_index: Which 25 fps frame to preview (default the first).
        backend: Landmark backend object or name (default ``config.landmark_backend``).

    Returns:
        :class:`Preview` (a four-panel figure in a notebook).

    Raises:
        InputError: Missing or unreadable files, a frame index past the end, or invalid options.
        WeightsError: Missing weight files.
        NoFaceError: No face in that frame (pass ``boxes=``).
    """
    import torch

    from . import blending, faces, gpu, media, models
    from .audio import whisper_features
    from .latents import crop_and_resize, decode, encode, unet_step
    from .parsing import FaceParser

    config = config or InferenceConfig()
    if boxes is not None and config.landmark_backend != "boxes":
        config = config.replace(landmark_backend="boxes")
    if audio is not None:
        video_path, _, _, weights_path, _, _ = check_inputs(video, audio, None, config=config,
                                                            weights_dir=weights_dir, boxes=boxes)
    else:
        video_path, weights_path, _ = _check_video_only(video, config, weights_dir)
    frames = media.frames_at(video_path, [int(frame_index)])
    if len(frames) != 1:
        raise InputError(f"frame_index {frame_index} is past the end of {str(video_path)!r}.")
    frame = np.ascontiguousarray(frames[0])
    one_box = boxes
    if boxes is not None and not np.isscalar(np.asarray(boxes, dtype=object).ravel()[0]) \
            and np.asarray(boxes, dtype=object).ndim > 1:
        one_box = [boxes[int(frame_index)]]
    track = faces.track(frame[None], backend=backend or config.landmark_backend, config=config, boxes=one_box,
                        weights_dir=weights_path)
    box = tuple(int(v) for v in track.crop_boxes[0])
    plan = gpu.plan(kind="lipsync", config=config, n_frames=1, frame_size=frame.shape[:2],
                    weights=_weights_kind(weights_path))
    device, dtype = _device_dtype(plan.config)
    with flush_denormals(device):
        bundle = models.load_models(weights_path, version=config.version, device=device, dtype=dtype)
        latent = encode(crop_and_resize(frame, box)[None], bundle.vae, generator=int(config.seed),
                        mode=config.latent_mode, first_index=int(frame_index))
        if audio is not None:
            feats = whisper_features(media.load_audio(audio), bundle.whisper,
                                     feature_extractor=bundle.feature_extractor)[:1]
            source = f"first frame of {Path(audio).name}"
        else:
            g = torch.Generator().manual_seed(int(config.seed))
            feats = torch.randn((1, 50, 384), generator=g).to(device=device, dtype=dtype)
            source = f"random tokens (seed {config.seed})"
        face = decode(unet_step(bundle.unet, bundle.pe, latent, feats), bundle.vae)[0].cpu().numpy()
        gpu.release(bundle)
        parser = FaceParser(weights_path, device=device, dtype=dtype)
        material = blending.prepare_materials([frame], [box], parser, mode=config.effective_parsing_mode,
                                              left_cheek_width=config.left_cheek_width,
                                              right_cheek_width=config.right_cheek_width,
                                              blur_ratio=config.blur_ratio)[0]
        gpu.release(parser)
    result = blending.blend_cpu(frame, face, material.box, material.mask, material.square)
    lms = None if not np.isfinite(track.landmarks[0]).all() else track.landmarks[0].astype(np.float32)
    return Preview(frame=frame, result=result, face_256=face, crop_box=box, landmarks=lms, mask=material.mask,
                   square=tuple(int(v) for v in material.square), audio=source)


def _check_video_only(video: Any, config: InferenceConfig, weights_dir: Any):
    """The video, device and weights part of :func:`check_inputs` (for jobs without audio)."""
    from . import gpu, media, weights

    gpu.check_device(config.device)

    video_path = _as_input_path(video, "video")
    try:
        info = media.probe(video_path)
    except MediaError as exc:
        raise InputError(f"video {str(video_path)!r} could not be read as a video or image: {exc}") from exc
    if not info.has_video:
        raise InputError(f"video {str(video_path)!r} has no video stream; give a face video or photo.")
    weights_path = Path(weights_dir) if weights_dir is not None else weights.default_dir()
    # issue 14 item 7: every weight file the job opens is looked inside (not only present) before any frame is read
    weights.check_job_files(weights_path, config.version, config.landmark_backend)
    return video_path, weights_path, info


__all__ = ["LipsyncResult", "Preview", "RenderInputs", "check_inputs", "lipsync", "preview", "render"]
