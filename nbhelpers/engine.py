"""The render engine: every frame of every clip (offline job, avatar, live, preview) is made here.

Per batch of output frames: UNet step and VAE decode of those whose source frame ``cycle_index(t, N)`` (the
ping-pong, §4.5) has a face, with tokens ``features[t]``, paste-back, and hand-off to a sink; a face-less source frame
is written unchanged. Out of memory halves the batch and retries the same frames (:func:`nbhelpers.gpu.batched`).
Source: ``scripts/inference.py:187-238``, ``scripts/realtime_inference.py:226-285`` (docs/official-behaviour.md
§4.5, §6-§9).
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import blending, gpu
from .constants import AUDIO_TOKENS, WHISPER_DIM
from .errors import FFmpegError, InputError, NbHelpersError
from .framestore import cycle_index
from .gpu.memory import _cuda, _remember_peak
from .latents import decode, unet_step
from .progress import bar

WRITER_QUEUE_DEPTH = 2  # batches waiting for the encoder
# Pinned host buffers in rotation: the queue, the batch being encoded, the one handed over and the one in flight.
PINNED_RING = WRITER_QUEUE_DEPTH + 3
FRAMES_ON_GPU_FRACTION = 0.25  # source frames are kept on the GPU when they take under this share of free memory
WRITER_TIMEOUT_S = 600.0  # a sink that accepts nothing for this long is reported as stalled (seconds)


@dataclass
class Timings:
    """Wall-clock ``seconds`` per stage (summed over repeats), in the order the stages first ran, and optionally
    ``peak_gib``, the largest ``torch.cuda.max_memory_allocated`` per stage (tracking resets torch's peak counters
    per stage; :func:`nbhelpers.gpu.peak_memory` keeps the process's peak)."""

    seconds: dict[str, float] = field(default_factory=dict)
    peak_gib: dict[str, float] | None = None

    @contextmanager
    def stage(self, name: str):
        """Time the block and add its seconds to ``name`` (and its peak GPU memory, when tracked)."""
        torch, index = _cuda() if self.peak_gib is not None else (None, None)
        if torch is not None:
            _remember_peak(torch, index)  # keep the job's peak before the counters restart for this block
            torch.cuda.reset_peak_memory_stats(index)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)
            if torch is not None:
                peak = torch.cuda.max_memory_allocated(index) / 2**30
                self.peak_gib[name] = max(self.peak_gib.get(name, 0.0), peak)
                _remember_peak(torch, index)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)


@contextmanager
def flush_denormals(device) -> Iterator[None]:
    """On the CPU, flush denormal floats (below 1e-38) to zero while the block runs, then restore the default (off):
    random or lightly trained weights give many, which the CPU handles in slow microcode. No effect on CUDA."""
    import torch

    on_cpu = torch.device(device).type == "cpu"
    if on_cpu:
        torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if on_cpu:
            torch.set_flush_denormal(False)


@dataclass
class SourceFaces:
    """What the engine renders from: N source ``frames`` (N, H, W, 3) uint8 BGR on the host with ``len`` and
    ``[index]`` (optionally also ``frames_device`` on the GPU), and for the M with a face their (M, 8, 32, 32)
    ``latents`` on the UNet device, crop ``boxes``, (2s, 2s) uint8 blend ``masks`` (numpy or device tensors) and
    expanded ``squares`` (frame pixels). ``latent_row``: (N,) int64 row of those per source frame, -1 without a face."""

    frames: Any
    latent_row: np.ndarray
    latents: Any
    boxes: Sequence[Any]
    masks: Sequence[Any]
    squares: Sequence[Any]
    frames_device: Any = None

    def __post_init__(self) -> None:
        n = len(self.frames)
        rows = np.asarray(self.latent_row)
        if rows.shape != (n,):
            raise InputError(f"latent_row must have one entry per source frame ({n}); got shape {rows.shape}.")
        m = int((rows >= 0).sum())
        if not (len(self.boxes) == len(self.masks) == len(self.squares)) or (m and int(rows.max()) >= len(self.boxes)):
            raise InputError(f"{m} source frames with a face need as many boxes, masks and squares; got "
                             f"{len(self.boxes)}, {len(self.masks)} and {len(self.squares)}.")
        if m and (self.latents is None or int(self.latents.shape[0]) <= int(rows.max())):
            raise InputError(f"latent_row points past the {0 if self.latents is None else self.latents.shape[0]} "
                             "latents given.")

    @property
    def n_frames(self) -> int:
        """N, the source frames the ping-pong cycles over."""
        return len(self.frames)

    def to_device(self, device: Any, *, frames_fraction: float = FRAMES_ON_GPU_FRACTION) -> SourceFaces:
        """A copy with the masks on CUDA ``device``, and the frames too when they take under ``frames_fraction`` of
        the free GPU memory; ``self`` on the CPU."""
        import torch

        device = torch.device(device)
        if device.type != "cuda":
            return self
        masks = [m if isinstance(m, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(m)).to(device)
                 for m in self.masks]
        frames_device = self.frames_device
        if frames_device is None and frames_fraction > 0 and len(self.frames):
            h, w = self.frames[0].shape[:2]
            free = gpu.usable_bytes(device) or 0  # under a per-process memory cap, what the cap leaves
            if len(self.frames) * h * w * 3 < frames_fraction * free:
                frames_device = torch.empty((len(self.frames), h, w, 3), dtype=torch.uint8, device=device)
                for start in range(0, len(self.frames), 64):
                    chunk = np.array(self.frames[start:start + 64])  # a writable copy (memmaps are read-only)
                    frames_device[start:start + len(chunk)] = torch.from_numpy(chunk).to(device)
        return dataclasses.replace(self, masks=masks, frames_device=frames_device)

    @classmethod
    def from_materials(cls, frames: Any, face_frames: Sequence[int], latents: Any,
                       materials: Sequence[Any]) -> SourceFaces:
        """Build from the N ``frames``, the M increasing indices ``face_frames`` of those with a face, and their
        (M, 8, 32, 32) ``latents`` and :class:`~nbhelpers.blending.BlendMaterial` ``materials`` in that order."""
        latent_row = np.full(len(frames), -1, dtype=np.int64)
        latent_row[np.asarray(face_frames, dtype=np.int64)] = np.arange(len(face_frames))
        return cls(frames=frames, latent_row=latent_row, latents=latents, boxes=[m.box for m in materials],
                   masks=[m.mask for m in materials], squares=[m.square for m in materials])


def check_features(features: Any, n_out: int) -> None:
    """Raise InputError unless ``features`` is a (T, 50, 384) tensor with T >= ``n_out``."""
    shape = tuple(getattr(features, "shape", ()))
    if len(shape) != 3 or shape[1:] != (AUDIO_TOKENS, WHISPER_DIM):
        raise InputError(f"features must be a tensor (T, {AUDIO_TOKENS}, {WHISPER_DIM}) from "
                         f"nbhelpers.audio.whisper_features; got shape {shape}.")
    if shape[0] < n_out:
        raise InputError(f"features cover {shape[0]} frames; {n_out} output frames were asked for.")


def render(source: SourceFaces, features: Any, models: Any, batch_size: int, n_out: int, *,
           timings: Timings | None = None, pinned: bool | PinnedRing = False, first_frame: int = 0,
           cpu_blend: bool | None = None, feature_offset: int = 0,
           pad_batches: bool = False) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(t0, frames)``, (B, H, W, 3) uint8 BGR numpy frames t0..t0+B-1, for output frames
    ``first_frame .. first_frame + n_out - 1`` in order, one :func:`repaint` per batch of ``batch_size`` (>= 1).

    ``features`` (T, 50, 384) on the models' device: row ``t - feature_offset`` drives frame ``t``. ``timings`` gets
    ``generate`` and ``blend`` seconds (on CUDA from events read at the end). ``pinned`` (CUDA only: True, or a
    :class:`PinnedRing` shared by calls feeding one sink) copies frames into reused pinned buffers: consume each
    batch before ``PINNED_RING - 1`` more are made. ``pad_batches`` runs every CUDA UNet + decode call on
    ``batch_size`` rows, so a short last batch reuses the others' cuDNN plans.

    InputError (at the call) for ``batch_size`` < 1, ``n_out`` < 0 or ``features`` too short; OutOfMemoryError
    when batch size 1 does not fit. Source: ``scripts/inference.py:187-238``, ``realtime_inference.py:226-285``."""
    for name, value, least in (("batch_size", batch_size, 1), ("n_out", n_out, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"{name} must be a whole number >= {least}; got {value!r}.")
    if (isinstance(feature_offset, bool) or not isinstance(feature_offset, int)
            or not 0 <= feature_offset <= first_frame):
        raise InputError(f"feature_offset must be a whole number in [0, first_frame={first_frame}]; got "
                         f"{feature_offset!r}.")
    check_features(features, first_frame + n_out - feature_offset)
    return _render(source, features, models, batch_size, n_out, timings, pinned, first_frame, cpu_blend,
                   feature_offset, pad_batches)


def repaint(source: SourceFaces, features: Any, models: Any, ts: np.ndarray, *, first_frame: int = 0,
            cpu_blend: bool | None = None, timings: Timings | None = None, host_buffer: Any = None,
            events: Any = None, defer_copy: bool = False, feature_offset: int = 0, pad_to: int | None = None):
    """Make output frames ``first_frame + ts`` ((B,) ints): UNet step, VAE decode, the optional
    ``models.restorer`` (:class:`~nbhelpers.restore.Restorer`), and paste-back (on the GPU on CUDA unless
    ``cpu_blend``, else the bit-exact :func:`nbhelpers.blending.blend_cpu`). Returns ``(frames, faces_256)``:
    (B, H, W, 3) uint8 BGR numpy frames and the (F, 256, 256, 3) uint8 BGR tensor of the F generated crops (None
    when F = 0).

    ``host_buffer(shape)`` gives a pinned uint8 tensor to copy the frames into; with ``defer_copy`` the copy stays
    in flight (wait on ``events.last()``, a :class:`CudaStageEvents`). ``pad_to`` runs the UNet and decoder on at
    least that many rows (the last face repeated, extra outputs dropped), so batches keep one shape.
    Source: ``scripts/inference.py:199-238`` (docs/official-behaviour.md §6-§8)."""
    import torch

    device = _device_of(models)
    on_cuda = device.type == "cuda" and not cpu_blend
    t_abs = first_frame + np.asarray(ts, dtype=np.int64)
    js = cycle_index(t_abs, source.n_frames)
    rows = source.latent_row[js]
    has = rows >= 0
    t_start = time.perf_counter()
    with torch.inference_mode():
        faces_256 = None
        if has.any():
            face_rows_np, feature_rows = rows[has], t_abs[has] - feature_offset
            n_face = len(face_rows_np)
            if pad_to is not None and n_face < pad_to:
                face_rows_np = np.concatenate([face_rows_np, np.repeat(face_rows_np[-1:], pad_to - n_face)])
                feature_rows = np.concatenate([feature_rows, np.repeat(feature_rows[-1:], pad_to - n_face)])
            lat = source.latents[gpu.to_device(face_rows_np, source.latents.device)]
            feat = features[gpu.to_device(feature_rows, features.device)]
            faces_256 = decode(unet_step(models.unet, models.pe, lat, feat), models.vae)[:n_face]
            restorer = getattr(models, "restorer", None)
            if restorer is not None:
                faces_256 = restorer(faces_256)
        t_gen = time.perf_counter()
        if events is not None:
            events.mark("generate")
        face_rows = [int(r) for r in rows[has]]
        if on_cuda:
            frames = _blend_on_device(source, js, has, face_rows, faces_256, device, host_buffer, wait=not defer_copy)
        else:
            frames = np.stack([source.frames[int(j)] for j in js])
            if faces_256 is not None:
                faces_np = faces_256.cpu().numpy()
                for k, (p, r) in enumerate(zip(np.flatnonzero(has), face_rows, strict=True)):
                    frames[p] = blending.blend_cpu(frames[p], faces_np[k], source.boxes[r], source.masks[r],
                                                   source.squares[r])
    if events is not None:
        events.mark("blend")
    elif timings is not None:
        timings.add("generate", t_gen - t_start)
        timings.add("blend", time.perf_counter() - t_gen)
    return frames, faces_256


def _device_of(models: Any):
    import torch

    device = getattr(models, "device", None)
    return torch.device(device) if device is not None else next(models.unet.parameters()).device


class CudaStageEvents:
    """Stage times on CUDA from events recorded in the stream, summed once at the end of a clip (timing each batch
    by synchronising would stall the overlap of batches)."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = device
        self.marks: list[tuple[str, Any]] = []
        self.mark("")

    def mark(self, stage: str) -> None:
        """Mark the end of ``stage`` for the current batch ("": the start of a batch)."""
        # blocking: a host waiting on the event sleeps instead of spinning a core the encoder needs
        event = self.torch.cuda.Event(enable_timing=True, blocking=True)
        event.record(self.torch.cuda.current_stream(self.device))
        self.marks.append((stage, event))

    def last(self):
        """The most recent event (wait on it to know the batch's work, copy included, is done)."""
        return self.marks[-1][1]

    def add_to(self, timings: Timings) -> None:
        """Synchronise once and add each stage's seconds to ``timings``."""
        if len(self.marks) < 2:
            return
        self.marks[-1][1].synchronize()
        for (_, before), (stage, after) in zip(self.marks, self.marks[1:], strict=False):
            if stage:
                timings.add(stage, before.elapsed_time(after) / 1000.0)
        self.marks = [("", self.marks[-1][1])]  # the last event starts the next batch


class PinnedRing:
    """Pinned host buffers for finished batches, reused in rotation: batch k (over every render call sharing the
    ring, retries included) uses slot ``k % size``, whose batch k - size the writer has finished with."""

    def __init__(self):
        self.slots: list = [None] * PINNED_RING
        self.produced = 0  # batches made so far

    def buffer(self, shape: tuple[int, ...]):
        """The (shape) uint8 pinned tensor of the current batch's slot."""
        import torch

        slot = self.produced % len(self.slots)
        if self.slots[slot] is None or tuple(self.slots[slot].shape) != tuple(shape):
            self.slots[slot] = torch.empty(tuple(shape), dtype=torch.uint8, pin_memory=True)
        return self.slots[slot]


@dataclass
class Piece:
    """``count`` consecutive output frames from ``first_frame`` for :func:`run`: rendered from ``source`` (with
    ``models`` when not :func:`run`'s own), or ``frames`` (count, H, W, 3) uint8 BGR written unchanged."""

    first_frame: int
    count: int
    source: SourceFaces | None = None
    frames: np.ndarray | None = None
    models: Any = None


def _render(source, features, models, batch_size, n_out, timings, pinned, first_frame, cpu_blend, feature_offset=0,
            pad_batches=False):
    device = _device_of(models)
    on_cuda = device.type == "cuda" and not cpu_blend
    use_pinned = bool(pinned) and on_cuda
    ring = pinned if isinstance(pinned, PinnedRing) else PinnedRing()
    events = CudaStageEvents(device) if device.type == "cuda" else None

    def host_buffer(shape):
        return ring.buffer(shape) if use_pinned else None

    # every UNet + decode call at the planned batch shape on CUDA until an OOM fallback
    pad = {"to": int(batch_size) if pad_batches and device.type == "cuda" else None}

    def after_oom() -> None:
        pad["to"] = None
        gpu.empty_cache()

    def step(sl: slice):
        if events is not None:
            events.mark("")
        frames, _ = repaint(source, features, models, np.arange(sl.start, sl.stop), first_frame=first_frame,
                            cpu_blend=cpu_blend, timings=None if events is not None else timings,
                            host_buffer=host_buffer, events=events, defer_copy=use_pinned,
                            feature_offset=feature_offset, pad_to=pad["to"])
        ring.produced += 1
        return frames, (events.last() if use_pinned else None)

    # Batch k+1 is queued on the GPU before the host waits for batch k's copy: the device never idles.
    pending = None
    try:
        for sl, (frames, done) in gpu.batched(n_out, int(batch_size), step, stage="generate", on_oom=after_oom):
            if pending is not None:
                pending[2].synchronize()
                yield pending[:2]
            pending = (first_frame + sl.start, frames, done)
            if done is None:
                yield pending[:2]
                pending = None
        if pending is not None:
            pending[2].synchronize()
            yield pending[:2]
    finally:
        if events is not None and timings is not None:
            events.add_to(timings)


def _blend_on_device(source: SourceFaces, js, has, face_rows, faces_256, device, host_buffer,
                     wait: bool = True) -> np.ndarray:
    import torch

    held, frames = source.frames_device, source.frames
    frames_t = (held[gpu.to_device(js, held.device)] if held is not None else
                torch.from_numpy(np.stack([frames[int(j)] for j in js])).pin_memory().to(device, non_blocking=True))
    if faces_256 is not None:
        pos = gpu.to_device(np.flatnonzero(has), frames_t.device)
        frames_t[pos] = blending.blend_torch(frames_t[pos], faces_256, [source.boxes[r] for r in face_rows],
                                             [source.masks[r] for r in face_rows],
                                             [source.squares[r] for r in face_rows], inplace=True)
    buf = host_buffer(tuple(frames_t.shape)) if host_buffer is not None else None
    if buf is None:
        return frames_t.cpu().numpy()
    buf.copy_(frames_t, non_blocking=True)
    if wait:
        done = torch.cuda.Event(blocking=True)  # the host sleeps until the copy lands (no spinning)
        done.record()
        done.synchronize()
    return buf.numpy()


def run(source: SourceFaces, features: Any, models: Any, batch_size: int, n_out: int, writer: Any, *,
        frame_callback: Callable[[int, np.ndarray], None] | None = None, timings: Timings | None = None,
        desc: str = "generate", render_gate: Any = None) -> int:
    """Render ``n_out`` frames (:func:`render`) while a background thread hands batch k to ``writer`` (anything
    with ``write(frames)`` of (B, H, W, 3) uint8 BGR, or None) and ``frame_callback(t, frame)``; returns ``n_out``.

    ``source`` is a :class:`SourceFaces`, or an iterable of :class:`Piece` covering frames 0..n_out-1 in order (a
    generator preparing each piece when asked overlaps that work with the encoder). ``timings`` also gets
    ``encode_wait``: seconds this thread waited for the encoder (its queue full, then the last batches).
    ``render_gate`` (a lock or semaphore, or None) is held from the first batch until the last one is rendered, so
    threads sharing it render at most as many clips at once as it admits. ``desc`` names the bar.
    Raises what the writer or the callback raised (in the calling thread), and what :func:`render` raises."""
    pieces = [Piece(0, n_out, source)] if isinstance(source, SourceFaces) else source
    ring = PinnedRing()
    written = 0
    progress = None
    with BackgroundWriter(writer, frame_callback) as sink, contextlib.ExitStack() as bars, \
            contextlib.ExitStack() as gate:
        if render_gate is not None:
            render_gate.acquire()
            gate.callback(render_gate.release)
        for piece in pieces:  # a generator of pieces prepares piece k+1 while the encoder writes piece k
            if progress is None:  # the bar and its clock start with the first piece, after the stages before it
                progress = bars.enter_context(bar(total=n_out, desc=desc, unit="frame"))
            if piece.first_frame != written or piece.count < 0 or written + piece.count > n_out:
                raise NbHelpersError(f"internal: piece of frames {piece.first_frame}..+{piece.count} after "
                                     f"{written} of {n_out} frames")
            if piece.frames is not None:
                if len(piece.frames) != piece.count:
                    raise NbHelpersError(f"internal: piece of {piece.count} frames holds {len(piece.frames)}")
                batches: Any = [(piece.first_frame, piece.frames)] if piece.count else []
            else:
                batches = render(piece.source, features, piece.models if piece.models is not None else models,
                                 batch_size, piece.count, timings=timings, pinned=ring, first_frame=piece.first_frame,
                                 pad_batches=True)
            for first, frames in batches:
                if written + len(frames) >= n_out:
                    gate.close()  # the last batch is rendered: the device is free for another clip
                sink.put(first, frames)
                written += len(frames)
                progress.update(len(frames))
    if timings is not None:
        timings.add("encode_wait", sink.wait_s)
    if written != n_out:
        raise NbHelpersError(f"internal: rendered {written} of {n_out} frames")
    return written


class BackgroundWriter:
    """Hands finished batches to ``writer`` (``write(frames)``, optionally ``abort()`` and ``stall_timeout_s``; or
    None) and ``frame_callback(t, frame)`` on a thread while the caller, blocked while ``depth`` batches wait,
    computes the next. An error there is raised in the caller's thread at the next :meth:`put` or at exit. A writer
    that takes no batch for ``timeout_s`` (default its ``stall_timeout_s`` + 30 s, else :data:`WRITER_TIMEOUT_S`) is
    aborted and reported as stalled (FFmpegError); nothing half-written is kept."""

    def __init__(self, writer: Any, frame_callback: Callable[[int, np.ndarray], None] | None = None,
                 depth: int = WRITER_QUEUE_DEPTH, timeout_s: float | None = None):
        self.writer = writer
        self.frame_callback = frame_callback
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        stall = getattr(writer, "stall_timeout_s", None)
        self.timeout_s = float(timeout_s if timeout_s is not None else
                               (stall + 30.0 if stall is not None else WRITER_TIMEOUT_S))
        self.error: BaseException | None = None
        self.wait_s = 0.0
        self.thread = threading.Thread(target=self._run, name="nbhelpers-encode", daemon=True)

    def __enter__(self) -> BackgroundWriter:
        self.thread.start()
        return self

    def put(self, first_index: int, frames: np.ndarray) -> None:
        """Queue a batch whose first output index is ``first_index`` (blocks while the queue is full)."""
        self._enqueue((first_index, frames))

    def _enqueue(self, item: Any) -> None:
        start = time.monotonic()
        while True:
            if self.error is not None and item is not None:
                raise self.error
            try:
                self.queue.put(item, timeout=min(0.5, self.timeout_s))
                self.wait_s += time.monotonic() - start  # the caller waited for the encoder (a full queue)
                return
            except queue.Full:
                if not self.thread.is_alive():
                    raise NbHelpersError("internal: the encoder thread stopped") from None
                if time.monotonic() - start > self.timeout_s:
                    raise self._stalled("take the next batch") from None

    def _stalled(self, doing: str) -> NbHelpersError:
        what = getattr(self.writer, "path", None) or type(self.writer).__name__
        error = FFmpegError(f"the encoder thread did not {doing} within {self.timeout_s:g} s "
                            f"({getattr(self.writer, 'frames_written', '?')} frames written to {what}): ffmpeg or the "
                            "frame callback is stuck (an output folder on a network mount that stopped answering?). "
                            "ffmpeg was stopped and nothing was saved; write to a local folder and copy the file.")
        if self.error is None:
            self.error = error  # the thread skips what is still queued
        abort = getattr(self.writer, "abort", None)
        if callable(abort):
            abort()
        with contextlib.suppress(queue.Full):
            self.queue.put(None, timeout=5)  # the thread ends once the killed writer returns
        self.thread.join(timeout=5)
        return error

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
                if self.writer is not None:
                    self.writer.write(frames)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                self.error = exc

    def __exit__(self, exc_type, exc, tb) -> None:
        start, waited = time.perf_counter(), self.wait_s
        try:
            if self.thread.is_alive():  # else already stopped (a stall was handled)
                self._enqueue(None)
                self.thread.join(self.timeout_s)
                if self.thread.is_alive():
                    raise self._stalled("finish the last batches")
        except NbHelpersError:
            if exc_type is None:
                raise  # else the job's own exception is the one to see
        finally:
            self.wait_s = waited + time.perf_counter() - start
        if exc_type is None and self.error is not None:
            raise self.error


__all__ = ["BackgroundWriter", "PinnedRing", "Piece", "SourceFaces", "Timings", "check_features", "flush_denormals",
           "render", "repaint", "run"]
