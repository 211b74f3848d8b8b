"""The batch worker: one loaded pipeline on one device, run as a Ray actor (a plain class, importable without Ray),
and how many jobs a worker runs at once. Its calls return plain dicts, errors included, so the batch goes on."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from .. import progress
from ..avatar import load_avatar, prepare_avatar
from ..config import InferenceConfig
from ..gpu.model import MEMORY_MODEL, stage_memory
from ..pipeline import MuseTalkPipeline
from .results import error_text


class _JobGate:
    """A worker's render gate as one job holds it, marking ``job <name> rendering`` and ``... rendered``."""

    def __init__(self, gate: threading.BoundedSemaphore, mark):
        self.gate, self.mark = gate, mark

    def acquire(self) -> None:
        self.gate.acquire()
        self.mark("rendering")

    def release(self) -> None:
        self.mark("rendered")
        self.gate.release()


class BatchWorker:
    """One loaded pipeline over ``weights_dir`` on ``device`` (``"cuda"``, the GPU Ray assigned, or ``"cpu"``), run as a
    Ray actor by :func:`nbhelpers.batch.run`, with base settings ``config`` (InferenceConfig fields as a dict) and
    ``threads`` torch CPU threads. ``render_slots`` clips and preparations use the device at once; other jobs read their
    audio and start their encoder meanwhile. A failed call returns ``{"ok": False, "error", "seconds", "worker"}``."""

    def __init__(self, weights_dir: str, config: dict[str, Any], device: str, threads: int, render_slots: int):
        self._events: list[tuple[str, float]] = [("start", time.time())]  # wall clock: the driver aligns them
        # torch only: diffusers and transformers skip their Flax and TensorFlow classes (read at import)
        for switch in ("USE_FLAX", "USE_TF"):
            os.environ.setdefault(switch, "0")
        progress.configure(disable=True)  # the driver shows the bars
        import torch

        torch.set_num_threads(int(threads))
        base = self._config(config)
        self.pipe = MuseTalkPipeline.from_pretrained(weights_dir, base.replace(device=device))
        self.name = f"{socket.gethostname()}/{os.getpid()} {self.pipe.device}"
        self._mark("pipeline")
        self.avatars: OrderedDict[str, Any] = OrderedDict()
        self.keep_avatars = 2  # besides those in use: a job may run beside another one (BatchConfig.jobs_per_worker)
        self._lock = threading.Lock()  # the avatars, their use counts and the jobs' progress
        self._in_use: dict[str, int] = {}
        self._ready: set[str] = set()  # avatars whose device state is made (the first job makes it, alone)
        self._key_locks: dict[str, threading.Lock] = {}
        self._progress: dict[str, int] = {}
        self._job_started = threading.Event()  # a clip has started: it warms the kernels, warm_up is not needed
        self._render_gate = threading.BoundedSemaphore(int(render_slots))
        # The models load in a thread, face parser and VAE first (all the first avatar needs), the UNet, whisper and
        # the warm-up while that avatar is prepared.
        self._preload = threading.Thread(target=self._load_and_warm, args=(base,), name="batch-preload", daemon=True)
        self._preload.start()

    def _load_and_warm(self, base: Any) -> None:
        """Load every model an avatar job uses, then warm them up at a clip's batch unless a clip has started."""
        with contextlib.suppress(Exception):  # a failure is left to the job that needs the model
            for model in ("face_parser", "vae", "unet", "whisper", "feature_extractor", "pe"):  # preload()'s models
                getattr(self.pipe, model)
                self._mark(f"loaded {model}")
            self.pipe.preload("avatar", restore=base.restore)
            if self._job_started.is_set():
                self._mark("warm-up skipped (a clip started)")
                return
            self.pipe.warm_up(self.pipe.plan("clip", self.pipe.job_config(base), None, None).batch_size)
            self._mark("warm")

    def _mark(self, event: str) -> None:
        self._events.append((event, time.time()))

    def events(self) -> list[tuple[str, float]]:
        """``(event, time.time())`` of what this worker did: start, pipeline, each model loaded, warm,
        ``prepare <key>``, ``job <name>`` and its ``ready``, ``rendering``, ``rendered`` and ``done``."""
        return list(self._events)

    def describe(self) -> str:
        """``host/pid device``."""
        return self.name

    def close(self) -> None:
        """Close every avatar this worker holds (their frames on disk go with them)."""
        with self._lock:
            avatars = list(self.avatars.values())
            self.avatars.clear()
            self._ready.clear()
        for avatar in avatars:
            with contextlib.suppress(Exception):  # closing is tidying: a failure must not fail the batch
                avatar.close()
        self._mark("closed")

    def progress(self) -> dict[str, int]:
        """``{job name: frames finished so far}`` of the jobs running now."""
        with self._lock:
            return dict(self._progress)

    def _config(self, config: dict[str, Any]) -> InferenceConfig:
        """A call's settings (InferenceConfig fields as a dict), device and precision left to this worker's pipeline."""
        return InferenceConfig(**config).replace(device=None, fp16=None)

    def _keep(self, key: str, avatar: Any) -> None:
        """Keep ``avatar`` as the most recent; close the oldest ones beyond ``keep_avatars`` that no job uses."""
        closing = []
        with self._lock:
            previous = self.avatars.get(key)
            if previous is not None and previous is not avatar:  # prepared again: the new one serves new jobs
                self._ready.discard(key)
                if not self._in_use.get(key):
                    closing.append(previous)
            self.avatars[key] = avatar
            self.avatars.move_to_end(key)
            idle = [k for k in self.avatars if not self._in_use.get(k) and k != key]
            while len(self.avatars) > self.keep_avatars and idle:
                old = idle.pop(0)
                closing.append(self.avatars.pop(old))
                self._ready.discard(old)
        for old in closing:
            old.close()

    def prepare(self, key: str, video: str, directory: str, config: dict[str, Any],
                box: tuple[int, int, int, int] | None) -> dict[str, Any]:
        """Prepare (or load from the cache) the avatar of ``video`` in ``directory``: ``{"ok": True,
        "loaded_from_cache", "seconds", "worker", "timings"}``."""
        t0 = time.perf_counter()
        self._mark(f"prepare {key[:8]}")
        try:
            with self._render_gate:
                avatar = prepare_avatar(video, directory, self.pipe, config=self._config(config), boxes=box)
            self._keep(key, avatar)
            self._mark(f"prepare {key[:8]} done")
            return {"ok": True, "loaded_from_cache": bool(avatar.loaded_from_cache),
                    "seconds": time.perf_counter() - t0, "worker": self.name,
                    "timings": dict(avatar.prepare_timings)}
        except Exception as exc:  # noqa: BLE001 - recorded for the job, the batch goes on
            return {"ok": False, "error": error_text(exc), "seconds": time.perf_counter() - t0, "worker": self.name}

    def generate(self, key: str, directory: str, config: dict[str, Any], name: str, audio: str, output: str,
                 exit_at_frame: int | None = None) -> dict[str, Any]:
        """Generate one job's clip from the avatar in ``directory`` (loaded once per worker, keyed ``key``) with the
        job's ``config`` dict, from ``audio`` into ``output``; ``name`` labels its progress, and ``exit_at_frame``
        (tests and bench) makes the process exit after that frame as a killed worker would. Returns ``{"ok": True,
        "frames", "seconds", "worker", "timings"}``."""
        t0 = time.perf_counter()
        with self._lock:
            self._progress[name] = 0
            self._in_use[key] = self._in_use.get(key, 0) + 1
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        self._mark(f"job {name}")
        self._job_started.set()

        def on_frame(t: int, frame: Any) -> None:
            with self._lock:
                self._progress[name] = t + 1
            if exit_at_frame is not None and t >= exit_at_frame:
                os._exit(3)

        try:
            with key_lock:  # one thread loads the avatar and makes its device state; a second job waits for it
                avatar = self.avatars.get(key)
                avatar = load_avatar(directory, self.pipe, config=self._config(config)) if avatar is None else avatar
                self._keep(key, avatar)
                if key not in self._ready:
                    avatar.load_models()
                    self._ready.add(key)
            self._mark(f"job {name} ready")
            gate = _JobGate(self._render_gate, lambda what: self._mark(f"job {name} {what}"))
            result = avatar.generate(audio, output=output, frame_callback=on_frame, render_gate=gate)
            self._mark(f"job {name} done")
            return {"ok": True, "frames": int(result.n_frames), "seconds": time.perf_counter() - t0,
                    "worker": self.name, "timings": {k: round(float(v), 4) for k, v in result.timings.items()
                                                     if not k.startswith("peak_gib")}}
        except Exception as exc:  # noqa: BLE001 - recorded for the job, the batch goes on
            return {"ok": False, "error": error_text(exc), "seconds": time.perf_counter() - t0, "worker": self.name}
        finally:
            with self._lock:
                self._progress.pop(name, None)
                self._in_use[key] -= 1


def worker_gib(config: Any, jobs: int = 1) -> float:
    """GiB of GPU memory one batch worker running ``jobs`` jobs at once may take at its peak (planner's memory model).

    Every avatar model resident, then the larger of a clip's generate stage and an avatar's encode (each job adding its
    batch's share), plus the CUDA context and workspaces, for 1920x1080 frames; ``config.fp16=False`` doubles it.
    Source: :mod:`nbhelpers.gpu.model`."""
    mm = MEMORY_MODEL
    fp16 = config.fp16 is not False
    clip_a, clip_b = stage_memory("clip", fp16=fp16)["generate"]
    enc_a, enc_b = stage_memory("avatar", fp16=fp16)["encode"]
    core = mm.core_fixed_gib * (1.0 if fp16 else mm.fp32_factor)  # the UNet, whisper and VAE stay loaded
    peak = max(clip_a + jobs * clip_b * mm.cap_clip, core + enc_a + jobs * enc_b * mm.cap_avatar)
    return peak + mm.context_gib + mm.workspace_gib


def choose_jobs_per_worker(config: Any, free_gib: Mapping[int, float] | None, workers_per_gpu: int, *,
                           joining: bool) -> tuple[int, str]:
    """``(jobs per worker, why)`` when ``BatchConfig.jobs_per_worker`` is None: two (a second job renders while the
    first one's encoder tail runs) when every GPU's free memory (``free_gib``, ``{index: GiB}``) holds
    ``workers_per_gpu`` workers' peaks with two jobs each (:func:`worker_gib`) within the planner's margin; one on the
    CPU, when the memory is unknown, when ``joining`` a cluster, or otherwise."""
    if config.device == "cpu":
        return 1, ""
    if joining or not free_gib:
        return 1, "1 job at once per worker (--jobs-per-worker 2 for two)"
    need, least = workers_per_gpu * worker_gib(config, jobs=2), min(free_gib.values())
    if need <= least * (1.0 - MEMORY_MODEL.safety_fraction):
        return 2, f"2 jobs at once per worker ({need:.1f} GiB of peaks fit)"
    return 1, f"1 job at once per worker: two each would need {need:.1f} GiB"
