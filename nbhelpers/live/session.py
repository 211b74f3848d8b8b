"""The live session: its audio timeline (chunks resampled to 16 kHz and joined, silence added when the feed runs dry),
when each group of ``hop`` frames is final, idle frames for silence, pacing to the wall clock and the sinks."""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .. import engine, gpu, media
from ..config import LiveConfig
from ..constants import FPS, SAMPLE_RATE, SEGMENT_SAMPLES, WHISPER_DIM, WHISPER_LAYERS
from ..engine import Timings, flush_denormals
from ..errors import InputError, NbHelpersError, require
from ..framestore import cycle_index
from ..media.stream import FFmpegSink
from ..result import ClipResult
from .stats import LiveStats
from .thread import model_thread
from .tokens import SAMPLES_PER_FRAME, PrefixTokens

RIGHT_CONTEXT = 2 * SAMPLES_PER_FRAME  # the window reads 2 video frames past the current one (PAD_RIGHT_STEPS)
LEFT_CONTEXT = 2 * SAMPLES_PER_FRAME
LATE_TOLERANCE_S = 0.5 / FPS  # a frame emitted more than half a frame period after its time is late
_END = object()  # the frames queue's end marker


class LiveSession(contextlib.AbstractContextManager):
    """A live avatar: :meth:`push` audio chunks as they arrive, get frames in order at 25 fps, :meth:`close`.

    See :mod:`nbhelpers.live` for which frames equal one-clip generation. All model work runs on the avatar's
    :class:`~nbhelpers.live.ModelThread`; with ``config.warm_up`` one whisper pass and one render of each batch size
    of :meth:`warm_shapes` run there at construction.

    Args:
        avatar: A prepared :class:`~nbhelpers.avatar.Avatar`.
        config: The session's settings (:class:`~nbhelpers.live.LiveConfig`); None: the defaults.
        on_frame: Called as ``on_frame(n, frame)`` with each (H, W, 3) uint8 BGR frame in order (in the session's
            thread when threaded).
        clock: Monotonic seconds; a fake clock tests pacing without sleeping.

    Raises:
        InputError: ``config.to`` names no container ffmpeg can tell, or its folder is not writable.
    """

    def __init__(self, avatar: Any, config: LiveConfig | None = None, *,
                 on_frame: Callable[[int, np.ndarray], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        config = config or LiveConfig()
        if config.to is not None and "://" not in config.to:  # before the models load
            media.check_writable(Path(config.to).expanduser().parent)
        self.config = config
        self.avatar = avatar
        self.lookahead = int(round(config.lookahead_ms * SAMPLE_RATE / 1000.0))
        self.silence_rms = 10.0 ** (config.silence_db / 20.0)
        self.on_frame = on_frame
        self.clock = clock
        self.timings = Timings()
        self.stats = LiveStats()
        self._t_created = time.perf_counter()
        st = avatar.device_state()
        self._source = st["source"]
        self._models = st["models"]
        self._models_thread = model_thread(avatar)  # runs every whisper pass and render (see ModelThread)
        self._on_cuda = getattr(self._models.device, "type", str(self._models.device)) == "cuda"
        self._pinned = self._models_thread.ring if self._on_cuda else False  # host buffers batches are copied into
        self.batch_size = int(config.batch_size or avatar.config.batch_size or 8)
        h, w = avatar.frame_shape
        self.sink = FFmpegSink(config.to, w, h, encoder=config.encoder) if config.to is not None else None
        self.iterate = (on_frame is None and config.to is None) if config.iterate is None else bool(config.iterate)
        self._out: queue.Queue = queue.Queue(maxsize=config.max_queue if config.threaded else 0)
        # The timeline: 16 kHz float32 samples [base, base + len(buf)).
        self._buf = np.zeros(0, np.float32)
        self._base = 0
        self._inbox: list[np.ndarray] = []
        self._resampler = None
        self._rate: int | None = None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._done = False
        self._next_compute = 0  # first frame not computed
        self._next_emit = 0  # first frame not handed out
        self._ready: deque = deque()  # (n, frame, idle, audio): finished, not handed out yet
        self._more = threading.Event()  # set when frames are added to _ready (wakes the pacer)
        self._prefix = PrefixTokens(avatar.pipe, self._audio, self.stats)  # the whisper context of each group
        self._t0: float | None = None  # clock time of the first push
        self._forced = -1  # real time: frames up to this one are made with the audio there is (starved feed)
        self._error: BaseException | None = None
        self._thread = None
        self._pacer = None  # threaded real time: hands frames out at their times, apart from the rendering
        self.result = None
        _ = avatar.pipe.whisper, avatar.pipe.feature_extractor  # loaded now, not inside the first frame's latency
        if config.silence == "closed":
            self._models_thread.call(self._silent)
        if config.warm_up:
            self._models_thread.call(self._warm_up)
        if config.threaded:
            self._thread = threading.Thread(target=self._worker, name="nbhelpers-live", daemon=True)
            if config.realtime:
                self._pacer = threading.Thread(target=self._pace, name="nbhelpers-live-pacer", daemon=True)
                self._pacer.start()
            self._thread.start()

    # -- input -----------------------------------------------------------------------------------------------------

    def push(self, samples: Any, sample_rate: int = SAMPLE_RATE) -> None:
        """Add a chunk of speech (any length) to the session: (L,) or (L, C) PCM ``samples`` (float in about
        [-1, 1] or int16; channels averaged; a CPU tensor works too) at ``sample_rate`` Hz, resampled to 16 kHz with
        streaming soxr (``soxr_hq``, as :func:`nbhelpers.media.load_audio`), so chunk borders add nothing.

        Raises:
            InputError: Bad samples or rate, or the session is closed.
            NbHelpersError: Whatever stopped the session's thread (raised at the next push).
        """
        self._raise_error()
        if self._closing:
            raise InputError("the live session is closed; make a new one with LiveSession(avatar, config).")
        wave = _as_mono(samples)
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or sample_rate < 1000:
            raise InputError(f"sample_rate must be a whole number of Hz >= 1000; got {sample_rate!r}.")
        wave = self._resample(wave, int(sample_rate))
        with self._lock:
            if self._t0 is None:
                self._t0 = self.clock()
                self.stats.first_push_t = self._t0
            if wave.size:
                self._inbox.append(wave)
            self._wake.notify_all()
        self.poll()  # not threaded: the work is done here

    def _resample(self, wave: np.ndarray, rate: int) -> np.ndarray:
        if rate != self._rate:
            self._flush_resampler()
            self._rate = rate
            if rate != SAMPLE_RATE:
                soxr = require("soxr", "pip install soxr")
                self._resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality="soxr_hq")
        if self._resampler is None:
            return wave
        return np.asarray(self._resampler.resample_chunk(wave, last=False), dtype=np.float32).reshape(-1)

    def _flush_resampler(self) -> None:
        """Queue the resampler's last samples and drop it."""
        if self._resampler is None:
            return
        tail = np.asarray(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True), np.float32)
        self._resampler = None
        with self._lock:
            if tail.size:
                self._inbox.append(tail.reshape(-1))

    # -- output ----------------------------------------------------------------------------------------------------

    def frames(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(n, frame)`` pairs in order: (H, W, 3) uint8 BGR, frame ``n`` is at ``n / 25`` s of the output.

        Threaded: blocks for the next frame until the session is closed and every frame is out. Not threaded:
        yields the frames finished so far (all of them after :meth:`close`)."""
        if not self.iterate:
            raise InputError("this session hands its frames to on_frame / to=; pass iterate=True to also iterate.")
        while True:
            try:
                item = self._out.get(block=self.config.threaded)
            except queue.Empty:  # not threaded: every frame finished so far is out
                return
            if item is _END:
                self._out.put(_END)
                return
            yield item

    __iter__ = frames

    def poll(self) -> None:
        """Not threaded: do the work due now (finish the frames whose audio is complete, hand out those due)."""
        if not self.config.threaded:
            self._step(self.clock())

    def close(self, timeout_s: float = 600.0):
        """Flush: finish every frame of the audio pushed (the tail with the zero padding of a clip's end), hand them
        out, close the sink, and return the session's :class:`~nbhelpers.result.ClipResult` (``kind="stream"``).
        Raises NbHelpersError or FFmpegError: whatever stopped the session or its sink."""
        if self.result is not None:
            return self.result
        self._flush_resampler()
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        try:
            if self.config.threaded:
                self._thread.join(timeout_s)
                if self._pacer is not None:
                    self._pacer.join(timeout_s)
                if self._thread.is_alive() or (self._pacer is not None and self._pacer.is_alive()):
                    raise NbHelpersError(f"the live session did not finish within {timeout_s:.0f} s")
            else:
                self._step(self.clock(), final=True)
            self._raise_error()
        except BaseException:
            if self.sink is not None:
                self.sink.abort()
            raise
        output = self.sink.close() if self.sink is not None else None
        if self.iterate and not self.config.threaded:
            self._out.put(_END)  # the worker thread puts it in threaded mode
        self.result = self._result(output)
        return self.result

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            with self._lock:
                self._closing = True
                self._done = True
                self._error = self._error or exc
                self._wake.notify_all()
            if self.sink is not None:
                self.sink.abort()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    # -- the loop ----------------------------------------------------------------------------------------------------

    def _deadline(self, n: int) -> float:
        return self._t0 + self.config.delay_s + n / FPS

    def _worker(self) -> None:
        try:
            while True:
                self._step(self.clock())
                with self._lock:
                    if self._done:
                        break
                    if self._inbox or (self._closing and not self.config.realtime):
                        continue
                    self._wake.wait(self._next_wake(self.clock()))
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            self._error = exc
            self._done = True
        finally:
            self._more.set()
            if self.iterate and self._pacer is None:
                self._out.put(_END)

    def _pace(self) -> None:
        """Threaded real time: hand each finished frame out at its time (rendering goes on meanwhile)."""
        try:
            while True:
                if self._ready:
                    wait = self._deadline(self._ready[0][0]) - self.clock()
                    if wait > 0:
                        time.sleep(wait)
                        continue
                    self._emit(*self._ready.popleft(), self.clock())
                elif self._done:
                    break
                else:
                    self._more.wait(0.05)
                    self._more.clear()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            self._error = exc
            self._done = True
        finally:
            if self.iterate:
                self._out.put(_END)

    def _next_wake(self, now: float) -> float:
        """Seconds until the worker has something to do without new audio (real time)."""
        if not self.config.realtime or self._t0 is None:
            return 0.5
        due = self._deadline(self._next_compute)
        times = [due - self.config.guard_s, due - self.config.ahead_s]
        if self._ready and self._pacer is None:
            times.append(self._deadline(self._ready[0][0]))
        future = [t - now for t in times if t > now]
        return max(0.0005, min(future)) if future else 0.5

    def _step(self, now: float, final: bool = False) -> None:
        with self._lock:
            closing = self._closing
            if self._inbox:
                self._buf = np.concatenate([self._buf, *self._inbox])
                self._inbox.clear()
            started = self._t0 is not None
        if not started:
            if closing:
                self._done = True
            return
        end = self._base + len(self._buf)
        total = end // SAMPLES_PER_FRAME if closing else None
        if self.config.realtime and not closing:
            end = self._fill_starved(now, end)
        while total is None or self._next_compute < total:
            spans = self._final_groups(now, end, total, closing)
            if not spans:
                break
            self._models_thread.call(self._compute, spans)
            self._next_compute = spans[-1][1]
            self._emit_due(self.clock(), final or not self.config.realtime)
        self._emit_due(self.clock(), final or not self.config.realtime)
        if closing and self._next_compute >= total and (self._pacer is not None or not self._ready):
            self._done = True
        self._trim()

    def _final_groups(self, now: float, end: int, total: int | None, closing: bool) -> list[tuple[int, int, int]]:
        """The groups to make now, ``[(a, b, E), ...]`` from ``_next_compute`` on: one in real time, else every final
        group up to the end of the first one's engine batch (audio that came at once renders in whole batches)."""
        spans: list[tuple[int, int, int]] = []
        a = self._next_compute
        limit = (a // self.batch_size + 1) * self.batch_size
        while total is None or a < total:
            if self.config.realtime and not closing and self._deadline(a) > now + self.config.ahead_s:
                break
            span = self._group(a, end, total)
            if span is None or (spans and span[0] > limit):
                break
            spans.append((a, *span))
            a = span[0]
            if self.config.realtime or a >= limit:
                break
        return spans

    def _group(self, a: int, end: int, total: int | None) -> tuple[int, int] | None:
        """(b, E): frames a..b-1 are final with the audio prefix [0, E), or None when they are not yet."""
        g_end = (a // self.config.hop + 1) * self.config.hop
        need = SAMPLES_PER_FRAME * g_end + RIGHT_CONTEXT + self.lookahead
        if self.config.context == "segment":
            seg_end = (((SAMPLES_PER_FRAME * g_end + RIGHT_CONTEXT) - 1) // SEGMENT_SAMPLES + 1) * SEGMENT_SAMPLES
            need = max(need, seg_end)
        if total is not None:
            return min(g_end, total), min(need, end)
        if end >= need:
            return g_end, need
        if self._forced >= a:  # real time, the feed ran dry: finish up to the starved frame with what there is
            return min(g_end, self._forced + 1), end
        return None

    def _fill_starved(self, now: float, end: int) -> int:
        """Real time: silence for frames whose audio is not there ``guard_s`` before their time; the new end."""
        n = self._next_compute
        while self._deadline(n) - self.config.guard_s <= now:
            g_end = (n // self.config.hop + 1) * self.config.hop
            if end >= SAMPLES_PER_FRAME * g_end + RIGHT_CONTEXT + self.lookahead and self.config.context == "sliding":
                break  # final already: rendered normally
            if end < SAMPLES_PER_FRAME * (n + 1):
                missing = SAMPLES_PER_FRAME * (n + 1) - end
                self._buf = np.concatenate([self._buf, np.zeros(missing, np.float32)])
                end += missing
                self.stats.starved += 1
            self._forced = n
            n += 1
        return end

    def _audio(self, start: int, stop: int) -> np.ndarray:
        lo, hi = max(start, self._base), max(min(stop, self._base + len(self._buf)), self._base)
        return self._buf[lo - self._base:hi - self._base] if hi > lo else np.zeros(0, np.float32)

    def _is_silent(self, n: int, e: int) -> bool:
        if self.config.silence is None:
            return False
        w = self._audio(SAMPLES_PER_FRAME * n - LEFT_CONTEXT, min(e, SAMPLES_PER_FRAME * n + 3 * SAMPLES_PER_FRAME))
        return w.size == 0 or float(np.sqrt(np.mean(np.square(w, dtype=np.float64)))) < self.silence_rms

    def _compute(self, spans: list[tuple[int, int, int]]) -> None:
        """Render the groups ``spans`` (frames a..b-1 of each from the audio prefix [0, E)) in engine batches
        aligned at multiples of the batch size, and queue them for hand-out; on the avatar's :class:`ModelThread`."""
        with flush_denormals(self._models.device):  # per thread (the CPU's FP control), so here on the model thread
            a, b = spans[0][0], spans[-1][1]
            first = a == 0 and self.stats.first_ready_t is None
            if first:
                self.stats.first_ready_t = self.clock()
            idle = np.array([self._is_silent(n, e) for ga, gb, e in spans for n in range(ga, gb)], dtype=bool)
            with self.timings.stage("audio"):  # no tokens for a group of idle frames only
                parts = [None if idle[ga - a:gb - a].all() else self._prefix.tokens(ga, gb, e) for ga, gb, e in spans]
            if first:
                if self._on_cuda:
                    gpu.host_wait(self._models.device)  # frame 0 only: times the whisper part apart from the render
                self.stats.first_tokens_t = self.clock()
            frames: dict[int, np.ndarray] = {}
            need_render = [n for n in range(a, b) if not idle[n - a] or self.config.silence == "closed"]
            if need_render:
                feats = self._features(parts, spans, idle)
                for c0, c1 in _batches(need_render, self.batch_size):
                    for t0, batch in engine.render(self._source, feats, self._models, self.batch_size, c1 - c0,
                                                   timings=self.timings, first_frame=c0, feature_offset=a,
                                                   pinned=self._pinned):
                        for k in range(len(batch)):
                            frames[t0 + k] = np.array(batch[k])  # the pinned buffer is reused: copy
            if self.config.silence == "source":
                for n in range(a, b):
                    if idle[n - a]:
                        frames[n] = np.array(self._source.frames[int(cycle_index(n, self._source.n_frames))])
            if first:
                self.stats.first_rendered_t = self.clock()
            for n in range(a, b):
                audio = self._audio(SAMPLES_PER_FRAME * n, SAMPLES_PER_FRAME * (n + 1)).copy()
                self._ready.append((n, frames[n], bool(idle[n - a]), audio))
            self._more.set()

    def _features(self, parts: list, spans: list[tuple[int, int, int]], idle: np.ndarray):
        """(b - a, 50, 384) tokens of ``spans``: each group's ``parts`` (None: idle only), closed-mouth ones if idle."""
        import torch

        if len(parts) == 1 and parts[0] is not None and not (self.config.silence == "closed" and idle.any()):
            return parts[0]
        silent = self._silent() if self.config.silence == "closed" else None
        ref = next((p for p in parts if p is not None), silent)
        rows = [ref.new_zeros((gb - ga, *ref.shape[-2:])) if part is None else part
                for (ga, gb, _), part in zip(spans, parts, strict=True)]
        feats = torch.cat(rows)  # a new tensor: the idle rows are written below
        if silent is not None and idle.any():
            feats[torch.from_numpy(np.flatnonzero(idle)).to(feats.device)] = silent.to(feats.dtype)
        return feats

    def warm_shapes(self) -> list[int]:
        """Engine batch sizes (frames) this session's schedule renders, the first group's first, so the warm-up can
        run each: the groups over ``lcm(hop, batch_size)`` frames cut at multiples of the batch size (as
        :meth:`_compute` does), and a whole batch when ``realtime`` is False. The tail at :meth:`close` and batches
        merged short of a whole one can still meet a new size."""
        sizes: list[int] = []
        hop, b = self.config.hop, self.batch_size
        for g0 in range(0, math.lcm(hop, b), hop):
            sizes += [c1 - c0 for c0, c1 in _batches(range(g0, g0 + hop), b) if c1 - c0 not in sizes]
        if not self.config.realtime and b not in sizes:
            sizes.append(b)
        return sizes

    def _warm_up(self) -> None:
        """One whisper pass and one render of each size of :meth:`warm_shapes`, once per avatar and size, on its
        :class:`ModelThread`: the first forwards' one-time costs (and cuDNN plans) are paid here, not by frame 0."""
        import torch

        done = self._models_thread.warm
        shapes = self.warm_shapes()  # compiled in the background; eager until ready
        self.avatar.pipe.compile_for(shapes[0], parts=("decoder",))  # the steady size: its own, faster code
        for size in shapes:  # one code for every other batch
            self.avatar.pipe.compile_for(size, parts=("unet", "decoder"), dynamic_batch=True)
        with flush_denormals(self._models.device):
            if "whisper" not in done:
                self._prefix.encode(np.zeros(SAMPLES_PER_FRAME, np.float32))
                done.add("whisper")
            for size in self.warm_shapes():
                if ("render", size) in done:
                    continue
                first = next(self.avatar.pipe.whisper.parameters())
                feats = torch.zeros((size, 10 * WHISPER_LAYERS, WHISPER_DIM), dtype=first.dtype, device=first.device)
                for _ in engine.render(self._source, feats, self._models, size, size, pinned=self._pinned):
                    pass
                done.add(("render", size))
            if self._on_cuda:
                gpu.host_wait(self._models.device)

    def _silent(self):
        """(50, 384) tokens of a frame inside digital silence (the closed-mouth idle frame), kept by the avatar."""
        def make():
            self.stats.whisper_passes += 1
            return self.avatar.pipe.features(np.zeros(SAMPLE_RATE, np.float32))[FPS // 2].clone()

        return self.avatar.keep("live_silent_tokens", make)

    def _emit_due(self, now: float, flush: bool) -> None:
        if self._pacer is not None:
            return
        while self._ready:
            if self.config.realtime and not flush and now < self._deadline(self._ready[0][0]):
                return
            self._emit(*self._ready.popleft(), now)
            now = self.clock()

    def _emit(self, n: int, frame: np.ndarray, idle: bool, audio: np.ndarray, now: float) -> None:
        if n != self._next_emit:
            raise NbHelpersError(f"internal: frame {n} handed out when {self._next_emit} was next")
        if self.config.realtime:
            late = now - self._deadline(n)
            if late > LATE_TOLERANCE_S:
                self.stats.late += 1
            self.stats.max_late_s = max(self.stats.max_late_s, max(0.0, late))
        if n == 0:
            self.stats.first_frame_t = now
        self.stats.emit_t.append(now)
        self.stats.idle += int(idle)
        if self.on_frame is not None:
            self.on_frame(n, frame)
        if self.sink is not None:
            with self.timings.stage("encode_wait"):
                self.sink.write(frame, audio)
        if self.iterate:
            self._out.put((n, frame))
        self._next_emit = n + 1

    def _trim(self) -> None:
        """Drop audio no frame will read again."""
        first_window = max(0, SAMPLES_PER_FRAME * self._next_compute - LEFT_CONTEXT)
        keep = min((first_window // SEGMENT_SAMPLES) * SEGMENT_SAMPLES, SAMPLES_PER_FRAME * self._next_emit)
        if keep - self._base > SEGMENT_SAMPLES // 4:
            self._buf = self._buf[keep - self._base:].copy()
            self._base = keep

    def _result(self, output: Path | None) -> ClipResult:
        a, n = self.avatar, self._next_emit
        return ClipResult(output=output, n_frames=n, source_frames=a.n_frames, no_face_frames=a.n_frames - a.n_faces,
                          fps=FPS, duration_s=n * SAMPLES_PER_FRAME / SAMPLE_RATE, config=a.config,
                          backend=a.backend or "cache", timings=dict(self.timings.seconds),
                          wall_s=time.perf_counter() - self._t_created, kind="stream",
                          notes=tuple(a.pipe.clip_notes()), stats=self.stats.as_dict())


def _batches(ns: Iterable[int], batch_size: int) -> list[tuple[int, int]]:
    """Runs of consecutive frames ``ns`` as (start, stop), cut at multiples of ``batch_size`` (one-clip batches)."""
    out: list[tuple[int, int]] = []
    for n in ns:
        if out and out[-1][1] == n and n % batch_size:
            out[-1] = (out[-1][0], n + 1)
        else:
            out.append((n, n + 1))
    return out


def _as_mono(samples: Any) -> np.ndarray:
    if hasattr(samples, "detach"):
        samples = samples.detach().cpu().numpy()
    arr = np.asarray(samples)
    if arr.dtype == np.int16:
        arr = arr.astype(np.float32) / 32768.0
    elif not np.issubdtype(arr.dtype, np.floating):
        raise InputError(f"samples must be float in about [-1, 1] or int16; got dtype {arr.dtype}.")
    if arr.ndim == 2:
        arr = arr.mean(axis=1)
    if arr.ndim != 1:
        raise InputError(f"samples must be (L,) or (L, channels) PCM; got shape {arr.shape}.")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise InputError("samples hold NaN or inf; the audio source is broken.")
    return arr


def play(session: LiveSession, waveform: np.ndarray, *, chunk_ms: float = 200.0, realtime: bool = True):
    """Push a 16 kHz waveform into ``session`` in chunks, chunk ``i`` at ``i * chunk_ms`` after the first (all at once
    when ``realtime`` is False), as if it arrived in real time; returns ``close()``'s result."""
    step = max(1, int(round(chunk_ms * SAMPLE_RATE / 1000.0)))
    t0 = time.monotonic()
    for i, start in enumerate(range(0, len(waveform), step)):
        if realtime:
            wait = t0 + i * step / SAMPLE_RATE - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        session.push(waveform[start:start + step], SAMPLE_RATE)
    return session.close()
