"""The offline job's machinery (driven by :meth:`nbhelpers.pipeline.MuseTalkPipeline.lipsync`): a clip decoded,
tracked and prepared in pieces of :data:`STREAM_PIECE` source frames while the encoder writes the previous one.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any

import numpy as np

from . import blending, engine, faces, gpu, progress
from . import latents as latent_codes
from .config import InferenceConfig
from .engine import Piece, SourceFaces, Timings
from .errors import MediaError
from .faces.dwpose_torch import DEFAULT_BATCH, S3FD_GPU_BATCH
from .faces.speaker import choose_face, syncnet_scorer
from .framestore import FrameStore

FACE_BATCH_GPU = 32  # frames decoded and handed to the landmark backend at a time on a GPU (it splits them further)
FACE_BATCH_CPU = 8
STREAM_PIECE = 64  # source frames the offline job prepares at a time while the encoder writes the previous ones
DWPOSE_GIB_PER_FRAME = 0.034  # GiB per frame of DWPose fp16 with the flip test (bench/RESULTS.md, Landmarks)
FACES_SHARE = 0.5  # share of the memory left beside the models that the face models' batches may take
PIECE_ON_GPU_FRACTION = 0.05  # a piece's frames go to the GPU once when they take under this share of free memory


def fit_face_batches(detector: Any, frame_hw: tuple[int, int], device: Any, *, loaded_gib: float = 0.0) -> None:
    """Set the landmark backend ``detector``'s ``face_detector.batch_size`` (S3FD) and ``pose.batch_size`` (DWPose),
    where it has them, for (H, W) frames to a :data:`FACES_SHARE` of the memory of CUDA ``device`` the job's models
    leave (the planner's :class:`nbhelpers.gpu.MemoryModel`). ``loaded_gib`` of models already there
    (:meth:`~nbhelpers.pipeline.MuseTalkPipeline.resident_gib`) count as free, as for the planner."""
    usable = gpu.usable_bytes(device)
    if usable is None:
        return
    mm = gpu.MEMORY_MODEL
    # the planner's budget (its workspace and safety margin), less the models every stage holds
    budget = (usable / 2**30 + max(0.0, float(loaded_gib)) - mm.workspace_gib) * (1.0 - mm.safety_fraction)
    left = budget - mm.core_fixed_gib - mm.bisenet_weights_gib - mm.s3fd_weights_gib - mm.dwpose_gib
    share = max(0.0, left) * FACES_SHARE
    s3fd_frame = mm.s3fd_bytes_per_pixel * frame_hw[0] * frame_hw[1] / 2**30
    face_detector, pose = getattr(detector, "face_detector", None), getattr(detector, "pose", None)
    if face_detector is not None and hasattr(face_detector, "batch_size"):
        face_detector.batch_size = int(min(S3FD_GPU_BATCH, max(1, share // s3fd_frame)))
    if pose is not None and hasattr(pose, "batch_size"):
        # at most the tracker's batch: DWPose pads a shorter call to its batch size
        pose.batch_size = int(min(DEFAULT_BATCH["cuda"], FACE_BATCH_GPU, max(1, share // DWPOSE_GIB_PER_FRAME)))


def compile_face_models(compiler: Any, detector: Any, frame_hw: tuple[int, int]) -> None:
    """Have ``compiler`` (:class:`~nbhelpers.gpu.compile.BackgroundCompiler`) compile, in the background, the
    networks of the landmark backend ``detector`` for the offline job's calls: S3FD at its ``batch_size`` on (H, W)
    frames, DWPose at its ``batch_size`` (twice that with the flip test), each as its call makes the input (dtype,
    layout, inference mode). Backends without them (dlib, ONNX), CPU devices and compile off are left alone."""
    import torch

    s3fd, pose = getattr(detector, "face_detector", None), getattr(detector, "pose", None)
    with torch.inference_mode():
        if isinstance(getattr(s3fd, "net", None), torch.nn.Module) and str(s3fd.device).startswith("cuda"):
            x = torch.zeros(s3fd.batch_size, 3, *frame_hw, device=s3fd.device, dtype=s3fd.dtype)
            layout = torch.channels_last if s3fd.channels_last else torch.contiguous_format
            compiler.request("s3fd", s3fd.net, x.contiguous(memory_format=layout), dynamic_batch=False)
        if isinstance(getattr(pose, "net", None), torch.nn.Module) and str(pose.device).startswith("cuda"):
            layout = torch.channels_last if pose.channels_last else torch.contiguous_format
            x = torch.zeros(pose.batch_size, 3, *pose.input_size[::-1], device=pose.device, dtype=pose.dtype)
            x = x.contiguous(memory_format=layout)
            compiler.request("dwpose", pose.net, torch.cat([x, x.flip(-1)]) if pose.flip_test else x,
                             dynamic_batch=False)


class Window:
    """Frames ``offset .. offset + n - 1`` of a clip, indexed by their clip index (a piece of the offline job)."""

    def __init__(self, frames: Any, offset: int):
        self.frames, self.offset = frames, int(offset)
        self.device = getattr(frames, "device", None)

    def __len__(self) -> int:
        return self.offset + len(self.frames)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            if not self.offset <= index < len(self):
                raise IndexError(f"frame {index} is not in this piece ({self.offset}..{len(self) - 1})")
            return self.frames[int(index) - self.offset]
        if isinstance(index, slice) and index.step in (None, 1):
            start = self.offset if index.start is None else index.start
            stop = len(self) if index.stop is None else index.stop
            if not self.offset <= start <= stop <= len(self):
                raise IndexError(f"frames {start}..{stop - 1} are not in this piece ({self.offset}..{len(self) - 1})")
            return self.frames[start - self.offset:stop - self.offset]
        return self.frames[index - self.offset]  # an index array or tensor (GPU frames)


class StreamedJob:
    """The offline job of ``n_out`` frames in pieces: per :data:`STREAM_PIECE` source frames (decoded into
    ``store``), track (or take the ``boxes`` given), encode latents and make blend material with ``pipe``'s models
    (loaded at the first face), then hand the piece's output frames (t < N uses source frame t) to the engine.
    ``source_frames`` (None: ``n_out``) is the stage bars' total until tracking ends.

    With ``smooth_boxes`` > 1 every frame is tracked first and the clip rendered as one piece. A clip with no face
    raises :class:`~nbhelpers.errors.NoFaceError` when its last frame is tracked."""

    def __init__(self, pipe: Any, config: InferenceConfig, store: FrameStore, n_out: int, boxes: Any,
                 timings: Timings, source_frames: int | None = None):
        self.pipe, self.config, self.store, self.n_out, self.timings = pipe, config, store, n_out, timings
        self.source_frames = source_frames or n_out  # expected, for the stage bars until tracking ends
        self._bars: dict[str, Any] = {}
        self._bar_stack = contextlib.ExitStack()
        self.boxes = boxes
        self.tracker = self.track = self.models = None  # made when tracking starts, it ends, and at the first face
        self.turns: list[Any] = []  # face="speaker": who spoke when (faces.speaker.Turn)
        self.rows: list[int] = []  # latent row of each source frame so far, -1 without a face
        self.crop = np.zeros((0, 4), dtype=np.int32)
        self.latents: Any = None
        self.materials: list[Any] = []
        self._next_offset = 0
        self._decoder: DecodeAhead | None = None

    def start_tracking(self, detector: Any, weights_dir: Any, loaded_gib: float, video: Any, waveform: Any) -> None:
        """Make the face tracker over ``detector`` (a backend object, or ``"auto"`` with boxes given), its GPU batches
        fitted first (:func:`fit_face_batches`). A face choice that needs the whole ``video`` (a point in a later
        frame; ``"speaker"`` with the ``waveform``, by SyncNet when its weights are in ``weights_dir``) is settled
        first, into ``self.config`` and ``self.turns`` (:func:`choose_face`)."""
        schedule = None
        if self.boxes is None and detector != "auto":
            speaker = self.config.face == "speaker"
            scorer = syncnet_scorer(video, waveform, weights_dir, self.pipe.device) if speaker else None
            self.config, schedule, self.turns = choose_face(self.config, lambda: self.pipe.faces(
                video, config=self.config, backend=detector), waveform, self.n_out, scorer)
        on_cuda = self.pipe.device.type == "cuda"
        if on_cuda:
            fit_face_batches(detector, (self.store.height, self.store.width), self.pipe.device, loaded_gib=loaded_gib)
            if self.pipe.config.compile != "off" and self.pipe.compiler.enabled:
                compile_face_models(self.pipe.compiler, detector, (self.store.height, self.store.width))
        self.tracker = faces.FaceTracker(detector, self.config, boxes=self.boxes, weights_dir=weights_dir,
                                         batch_size=FACE_BATCH_GPU if on_cuda else FACE_BATCH_CPU, schedule=schedule)

    def decode_ahead(self, reader: Any) -> DecodeAhead:
        """Decode the first ``min(n_out, N)`` frames in pieces, one piece ahead."""
        self._decoder = DecodeAhead(reader, self.n_out, STREAM_PIECE, self.store, self.timings)
        return self._decoder

    def pieces(self, decoded: Any):
        """Yield :class:`~nbhelpers.engine.Piece` covering output frames 0..n_out-1 in order."""
        t = self.timings
        streamed = self.config.smooth_boxes <= 1
        written = 0
        for arr in decoded:  # (b, H, W, 3) pieces, already in the frame store
            offset = self._next_offset
            self._next_offset += len(arr)
            frames_device = self._upload(arr) if streamed else None  # once: faces, parsing and the paste-back
            with t.stage("faces"):
                crop, has = self._track(arr, frames_device)
            self.crop = np.concatenate([self.crop, crop])
            self.rows.extend([-1] * len(arr))  # latent rows of the faces are set as they are prepared
            if not streamed:
                continue
            window = Window(arr, offset)
            self._prepare(window, offset + np.flatnonzero(has), frames_device)
            stop = min(self.n_out, offset + len(arr))
            if stop > written:
                if self.models is None or not has[written - offset:stop - offset].any():
                    yield Piece(written, stop - written, frames=arr[written - offset:stop - offset])
                else:
                    source = self._source(window, None if frames_device is None else Window(frames_device, offset))
                    yield Piece(written, stop - written, source=source, models=self.models)
                written = stop
        with t.stage("store"):
            self.store.finish()  # every piece was written by the decoding thread before it was handed over
        with t.stage("faces"):
            self.track = self.tracker.finish()  # NoFaceError for a clip without any face
        self._end_bar("faces", self.track.n_frames)
        if len(self.store) != self.track.n_frames:
            raise MediaError(f"internal: decoded {len(self.store)} frames but tracked {self.track.n_frames}")
        if not streamed:  # smoothed crop boxes: prepare the whole clip now
            self.crop = self.track.crop_boxes
            self._prepare(self.store, np.flatnonzero(self.track.has_face), None)
        for name in ("latents", "parsing"):
            self._end_bar(name, self.track.n_faces)
        if written < self.n_out:  # the rest of the ping-pong (or, smoothed, every frame) from the whole clip
            with t.stage("upload"):
                source = self._source(self.store, None)
            yield Piece(written, self.n_out - written, source=source, models=self.models)

    def _track(self, arr: np.ndarray, frames_device: Any) -> tuple[np.ndarray, np.ndarray]:
        step, crops, has = self.tracker.batch_size, [], []
        for start in range(0, len(arr), step):
            part = None if frames_device is None else frames_device[start:start + step]
            crop, found = self.tracker.add(arr[start:start + step], frames_device=part)
            crops.append(crop)
            has.append(found)
            self._bar("faces").update(len(crop))
        return np.concatenate(crops), np.concatenate(has)

    def _bar(self, name: str) -> Any:
        """The stage's bar of source frames over the whole job, made (its clock started) at the stage's first use."""
        if name not in self._bars:
            self._bars[name] = self._bar_stack.enter_context(progress.bar(self.source_frames, name))
        return self._bars[name]

    def _end_bar(self, name: str, count: int) -> None:
        """Close a stage's bar full at the ``count`` frames it really had, timed by the stage's own seconds."""
        pbar = self._bars.get(name)
        if pbar is not None:
            pbar.total = pbar.n = count
            pbar.start_t = pbar.last_print_t = time.time() - self.timings.seconds.get(name, 0.0)  # tqdm's clock
            pbar.close()

    def _upload(self, arr: np.ndarray) -> Any:
        """A piece's frames on the GPU when under PIECE_ON_GPU_FRACTION of its usable memory, else None."""
        if self.pipe.device.type != "cuda":
            return None
        if arr.nbytes >= PIECE_ON_GPU_FRACTION * (gpu.usable_bytes(self.pipe.device) or 0):
            return None
        with self.timings.stage("upload"):
            return gpu.to_device(arr, self.pipe.device)

    def _prepare(self, frames: Any, face_frames: np.ndarray, frames_device: Any) -> None:
        """Latents and blend material of ``face_frames`` (clip indices)."""
        t, config = self.timings, self.config
        if face_frames.size == 0:
            return
        if self.models is None:
            with t.stage("models"):  # loaded once per pipeline: no time here on a second job
                self.models = self.pipe.models_for(config)
        batch = int(config.batch_size or 8)
        with t.stage("latents"):  # crop, resize and encode (indexed by source frame: Q6)
            latents = latent_codes.encode_frames(frames, self.crop, face_frames, self.models.vae, seed=config.seed,
                                                 mode=config.latent_mode, batch_size=batch,
                                                 progress=self._bar("latents"))
        with t.stage("parsing"):  # feathered mask + expanded square; on CUDA the parsing stays on the GPU
            parser = self.pipe.face_parser
            parser.batch_size = batch
            window = None if frames_device is None else Window(frames_device, frames.offset)
            materials = blending.materials_for_frames(frames, self.crop, face_frames, parser, config,
                                                      progress=self._bar("parsing"), frames_device=window)
        import torch

        first = len(self.materials)
        for k, i in enumerate(face_frames):
            self.rows[int(i)] = first + k
        self.latents = latents if self.latents is None else torch.cat([self.latents, latents])
        self.materials.extend(materials)

    def _source(self, frames: Any, frames_device: Any) -> SourceFaces:
        rows = np.asarray(self.rows[:len(frames)], dtype=np.int64)
        m = self.materials
        source = SourceFaces(frames=frames, latent_row=rows, latents=self.latents, boxes=[x.box for x in m],
                             masks=[x.mask for x in m], squares=[x.square for x in m], frames_device=frames_device)
        # masks on the GPU once; the whole clip's frames too when they fit (a piece's were uploaded with it)
        whole_clip = frames is self.store
        return source.to_device(self.pipe.device, frames_fraction=engine.FRAMES_ON_GPU_FRACTION if whole_clip else 0.0)

    def close(self) -> None:
        self._bar_stack.close()
        if self._decoder is not None:
            self._decoder.close()
        if self.tracker is not None:
            self.tracker.close()


class DecodeAhead:
    """The first ``n`` frames of a video in pieces of ``piece`` frames, decoded and appended to the frame store in
    a thread one piece ahead of the job (ffmpeg's 64 KiB pipe stalls without a reader). The job's wait is timed as
    ``decode``; an error in the thread is raised in the job's thread at the piece it would have given."""

    def __init__(self, reader: Any, n: int, piece: int, store: FrameStore, timings: Timings):
        self._reader, self._left, self._piece, self._store, self._timings = reader, int(n), int(piece), store, timings
        self._queue: Any = queue.Queue(maxsize=1)  # one piece ahead: bounded host memory
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nbhelpers-decode", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._left > 0 and not self._stop.is_set():
                arr = self._reader.read_batch(min(self._piece, self._left))
                if len(arr) == 0:
                    break
                self._store.append_batch(arr)
                self._left -= len(arr)
                self._put(arr)
            self._put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the job's thread, raised there
            self._put(exc)

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                return self._queue.put(item, timeout=0.1)

    def __iter__(self):
        while True:
            start = time.perf_counter()
            item = self._queue.get()
            self._timings.add("decode", time.perf_counter() - start)
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop the thread (it ends at its next piece) and drop what it decoded ahead."""
        self._stop.set()
        deadline = time.monotonic() + 30.0  # a read in progress ends with its piece (or when ffmpeg is stopped)
        while self._thread.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.1)
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()


__all__ = ["DecodeAhead", "StreamedJob", "Window", "compile_face_models", "fit_face_batches"]
