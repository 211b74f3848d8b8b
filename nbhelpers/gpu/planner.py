"""The planner: device, precision and batch size for a job, with the reason for each, and the report's verdict."""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..config import InferenceConfig
from ..errors import InputError, NbHelpersWarning, plural
from .device import GpuReport, NoGpuError, ShowsRows, _no_cuda_message, colab_gpu_steps, read_report
from .model import (
    CAP_REASONS,
    DEFAULT_FRAME_SIZE,
    MEMORY_MODEL,
    MemoryModel,
    check_kind,
    cpu_frame_seconds,
    cpu_seconds,
    restore_per_frame_gib,
    stage_memory,
)


class PlanWarning(NbHelpersWarning):
    """A plan works but something about it deserves attention (CPU speed, fp16 on the CPU, a tight memory budget)."""


@dataclass(frozen=True)
class Plan(ShowsRows):
    """Device, precision and batch size (frames per UNet/VAE/parsing batch) for one kind of job (as :func:`plan`),
    with the reason for each, keyed ``"device"``, ``"fp16"``, ``"batch_size"``, ``"memory"``. Shows itself.

    ``frame_size`` is the (H, W) pixels assumed; ``budget_gib`` the GPU memory (host RAM on the CPU) the job may use
    and ``predicted_peak_gib`` the worst of ``stage_peaks_gib`` at ``batch_size``, CUDA context excluded (GiB, None
    when unknown or on the CPU); ``warnings`` things to know, in words; ``base_config`` the configuration the plan
    started from (:attr:`config`); ``gpu_name`` and ``free_gib`` feed the verdict (None on the CPU)."""

    kind: str
    device: str
    fp16: bool
    batch_size: int
    weights: str = "full"
    frame_size: tuple[int, int] = DEFAULT_FRAME_SIZE
    n_frames: int | None = None
    budget_gib: float | None = None
    predicted_peak_gib: float | None = None
    stage_peaks_gib: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    base_config: Any = field(default=None, repr=False)
    gpu_name: str | None = None
    free_gib: float | None = None
    landmark_backend: str = "auto"

    @property
    def _title(self) -> str:
        return f"Plan ({self.kind})"

    @property
    def precision(self) -> str:
        return "fp16" if self.fp16 else "fp32"

    @property
    def config(self):
        """The ``config`` given to :func:`plan` (or the defaults) with this plan's device, precision, batch, reasons."""
        base = self.base_config if self.base_config is not None else InferenceConfig()
        return dataclasses.replace(base, device=self.device, fp16=self.fp16, batch_size=self.batch_size,
                                   reasons={**base.reasons, **self.reasons})

    @property
    def verdict(self) -> str:
        """One line, e.g. ``"Tesla T4, 14.7 GiB free: fp16, batch 32"`` or ``"CPU only: fp32, batch 4, ..."``."""
        if self.device.startswith("cuda") and self.gpu_name:
            free = "" if self.free_gib is None else f", {self.free_gib:.1f} GiB free"
            return f"{self.gpu_name}{free}: {self.precision}, batch {self.batch_size}"
        if self.device == "cpu":  # the per-frame time of _cpu_time_note, with what it assumes
            per = cpu_frame_seconds(self.kind, self.weights, self.landmark_backend, self.frame_size)
            tracking = _tracking(self.kind, self.landmark_backend)
            return (f"CPU only: {self.precision}, batch {self.batch_size}, about {per:.1f} s per "
                    + (f"{self.frame_size[1]}x{self.frame_size[0]} frame with {tracking}" if tracking else "frame"))
        return f"{self.device}: {self.precision}, batch {self.batch_size}"

    def _rows(self) -> list[tuple[str, str]]:
        rows = [("verdict", self.verdict), ("kind", f"{self.kind} ({self.weights} weights)"),
                ("device", f"{self.device}: {self.reasons.get('device', '')}"),
                ("precision", f"{self.precision}: {self.reasons.get('fp16', '')}"),
                ("batch size", self.reasons.get("batch_size", str(self.batch_size)))]
        if "memory" in self.reasons:
            rows.append(("memory", self.reasons["memory"]))
        if self.stage_peaks_gib:
            rows.append(("stage peaks", ", ".join(f"{k} {v:.2f} GiB" for k, v in self.stage_peaks_gib.items())))
        rows.extend(("warning", w) for w in self.warnings)
        return rows


def snap_batch(n: float) -> int:
    """Snap a batch size ``n`` (frames, any real) down to 1, 2 or a multiple of 4 (which includes realtime's 20)."""
    if not n >= 1:  # also catches NaN
        return 1
    n = int(min(n, 1 << 20))
    return n - n % 4 if n >= 4 else min(n, 2)


def plan(kind: str = "lipsync", report: GpuReport | None = None, config: Any = None, n_frames: int | None = None,
         frame_size: tuple[int, int] | None = None, weights: str = "full",
         memory_model: MemoryModel | None = None, *, source_frames: int | None = None,
         landmark_backend: str | None = None, loaded_gib: float = 0.0, warn: bool = True) -> Plan:
    """Choose device, precision and batch size for a job from the GPU report and the memory model.

    Device: CUDA when torch can use a GPU, else the CPU. Precision: fp16 on CUDA (as the official realtime path;
    the T4 has no fast bf16), fp32 below compute capability 5.3 and on the CPU. Batch: the largest whose worst stage
    (a face restorer included) fits the budget (:mod:`nbhelpers.gpu.model`), snapped by :func:`snap_batch`, at most
    the kind's cap and ``n_frames``. Non-None ``config.device``, ``fp16`` and ``batch_size`` override the choice.

    Args:
        kind: ``"lipsync"`` (offline job), ``"avatar"`` (avatar preparation), ``"realtime"`` (live, from an avatar)
            or ``"clip"`` (a whole clip from an avatar into a file: realtime's memory, a larger cap).
        report: A :class:`GpuReport`; None reads one.
        config: An :class:`~nbhelpers.config.InferenceConfig`; None for the defaults.
        n_frames: Output frames (audio seconds x 25) for lipsync/realtime, source frames for avatar; or None.
        frame_size: (H, W) of the frames, pixels; None assumes :data:`DEFAULT_FRAME_SIZE`.
        weights: ``"full"`` or ``"tiny"`` (test models).
        memory_model: Constants (default :data:`MEMORY_MODEL`).
        source_frames: Source frames of a lipsync job, for the CPU estimate; None: one per output frame.
        landmark_backend: The job's landmark backend, for the CPU estimate; None takes ``config.landmark_backend``.
        loaded_gib: GiB of the stages' models already on the GPU (an earlier job on the same pipeline), added back
            to the usable memory.
        warn: Emit ``Plan.warnings`` as :class:`PlanWarning`; False only records them.

    Raises:
        InputError: Unknown ``kind``/``weights``, a bad ``frame_size``, ``n_frames``, ``loaded_gib`` or ``config``.
        NoGpuError: ``config.device`` asks for CUDA but no CUDA GPU is usable.

    Source: batches 8 offline and 20 realtime (``inference.py:266``, ``realtime_inference.py:331``); fp16
    (``inference.py:53-56``, ``realtime_inference.py:366-368``).
    """
    check_kind(kind, weights)
    config, n_frames, frame_size, size_note = _checked_inputs(config, n_frames, frame_size, loaded_gib)
    mm = memory_model or MEMORY_MODEL
    rep = report if report is not None else read_report()
    reasons: dict[str, str] = {}
    notes: list[str] = []

    if config.device is not None:
        device = str(config.device)
        if device.startswith("cuda") and not rep.has_gpu:
            raise NoGpuError(_no_cuda_message(device))
        reasons["device"] = f"user override ({device})"
    elif rep.has_gpu:
        device = rep.device if rep.device.startswith("cuda") else "cuda"
        reasons["device"] = f"CUDA GPU found: {rep.name or 'unknown'}"
    else:
        device = "cpu"
        reasons["device"] = "no CUDA GPU usable: running on the CPU"
    on_cuda, on_cpu = device.startswith("cuda"), device == "cpu"
    cc = rep.compute_capability
    fp16 = _choose_fp16(config, on_cuda, cc, mm, reasons, notes)

    backend = str(landmark_backend or config.landmark_backend or "auto")
    # a face restorer (config.restore) runs between decode and paste-back: its share joins the generate stage, in
    # bfloat16 where nbhelpers.restore.run_dtype picks it (an fp16 job on compute capability >= 8.0), else float32
    restore = config.restore if kind != "avatar" else None
    restore_bf16 = bool(on_cuda and fp16 and cc is not None and tuple(cc) >= tuple(mm.bf16_min_capability))
    stages = stage_memory(kind, fp16, frame_size, n_frames, weights, backend, mm, restore=restore,
                          restore_bf16=restore_bf16)
    stage_note = size_note if restore is None else (
        f"{size_note}; the generate stage counts {restore_per_frame_gib(restore, restore_bf16, mm):.3f} GiB per frame "
        f"for the {restore} face restorer in {'bfloat16' if restore_bf16 and restore != 'codeformer' else 'float32'}")
    cap = getattr(mm, f"cap_{kind}")
    if on_cuda:
        budget, reasons["memory"] = _gpu_budget(rep, mm, float(loaded_gib))
        auto, why = _fit_batch(stages, budget, cap, kind, "fp16" if fp16 else "fp32", stage_note)
    else:
        budget, auto, why = _cpu_batch(rep, stages, mm, stage_note)
        reasons["memory"] = (f"host RAM: {budget:.1f} GiB usable ({mm.cpu_ram_fraction:.0%} of "
                             f"{rep.host_ram_available_gib:.1f} GiB available)" if budget is not None else
                             "host RAM unknown")
        notes.append(_cpu_time_note(kind, n_frames, source_frames, weights, backend, frame_size,
                                    size_note.replace(" (frame size not given)", "")))
    if n_frames and auto > n_frames:
        auto, why = n_frames, f"{n_frames}: the whole job in one batch ({why})"
    why_auto = why.removeprefix(f"{auto}: ")  # quoted after "the plan would choose {auto}"
    if config.batch_size is not None:
        batch = int(config.batch_size)
        reasons["batch_size"] = f"user override ({batch}); the plan would choose {auto} ({why_auto})"
        if n_frames and batch > n_frames:  # a batch is never longer than the job: say what is really used
            reasons["batch_size"] = (f"{n_frames}: user override ({batch}) is more than the job's {n_frames} frames, "
                                     f"so the whole job is one batch; the plan would choose {auto} ({why_auto})")
            batch = n_frames
    else:
        batch = auto
        reasons["batch_size"] = why

    peaks = {name: a + b * batch for name, (a, b) in stages.items()}
    predicted = max(peaks.values()) if on_cuda else None
    growing = {name: peak for name, peak in peaks.items() if stages[name][1] > 0}
    worst = max(growing, key=growing.get)
    need = growing[worst]
    if on_cuda and budget is not None:
        if need > budget:
            if config.batch_size is not None and batch > 1:
                notes.append(f"batch_size {batch} (user override) is predicted to need {need:.2f} GiB in stage "
                             f"{worst!r}, above the {budget:.2f} GiB budget: out-of-memory is likely; the batch "
                             "will halve when it happens (no frame lost).")
            else:
                notes.append(f"Even batch {batch} is predicted to need {need:.2f} GiB in stage {worst!r}, above "
                             f"the {budget:.2f} GiB budget: out-of-memory is likely. Free GPU memory (close other "
                             "notebooks, restart the runtime) or use a larger GPU.")
        if "faces" in peaks and peaks["faces"] > budget:
            notes.append(f"Face detection on full {frame_size[1]}x{frame_size[0]} frames (S3FD at batch 1) is "
                         f"predicted to need {peaks['faces']:.2f} GiB, above the {budget:.2f} GiB budget: use "
                         "landmark_backend='dlib' or a smaller video.")
    asked = config.batch_size
    if on_cpu and asked is not None and batch > auto:  # a user batch above the plan's, as really run
        used = f"batch_size {asked} (user override" + (f", {batch} for this {n_frames}-frame job)" if batch != asked
                                                       else ")")
        if budget is not None and need > budget:
            notes.append(f"{used} is predicted to need {need:.1f} GiB of host RAM in stage {worst!r}, "
                         f"above the {budget:.1f} GiB usable: the job is likely to run out of memory. Leave the "
                         f"batch size out (the plan would choose {auto}).")
        else:
            notes.append(f"{used} is more than the plan's {auto} on the CPU: it fits in host RAM, but a larger batch "
                         f"is no faster on the CPU and progress shows later. Leave the batch size out for {auto}.")
    for note in notes if warn else ():
        warnings.warn(note, PlanWarning, stacklevel=2)
    return Plan(kind=kind, device=device, fp16=fp16, batch_size=batch, weights=weights, frame_size=frame_size,
                n_frames=n_frames, budget_gib=budget, predicted_peak_gib=predicted, stage_peaks_gib=peaks,
                reasons=reasons, warnings=tuple(notes), base_config=config, gpu_name=rep.name if on_cuda else None,
                free_gib=rep.free_gib if on_cuda else None, landmark_backend=backend)


def _checked_inputs(config: Any, n_frames: Any, frame_size: Any,
                    loaded_gib: Any) -> tuple[InferenceConfig, int | None, tuple[int, int], str]:
    """``plan``'s arguments checked: (config, n_frames, (H, W), the frame size in words). InputError otherwise."""
    if config is None:
        config = InferenceConfig()
    elif not isinstance(config, InferenceConfig):
        raise InputError(f"config must be an InferenceConfig or None; got {type(config).__name__}. "
                         "Build one with nbhelpers.InferenceConfig(...).")
    if n_frames is not None:
        if isinstance(n_frames, bool) or not isinstance(n_frames, numbers.Integral) or n_frames < 0:
            raise InputError(f"n_frames must be a whole number >= 0 or None; got {n_frames!r}.")
        n_frames = int(n_frames)
    if isinstance(loaded_gib, bool) or not isinstance(loaded_gib, numbers.Real) or not loaded_gib >= 0:
        raise InputError(f"loaded_gib must be a number of GiB >= 0; got {loaded_gib!r}.")
    given = frame_size is not None
    try:
        values = tuple(frame_size) if given else DEFAULT_FRAME_SIZE
    except TypeError:
        values = ()
    if len(values) != 2 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
                                   for v in values):
        raise InputError(f"frame_size must be (height, width) in pixels, two positive integers; got {frame_size!r}.")
    size = (int(values[0]), int(values[1]))
    return config, n_frames, size, f"{size[1]}x{size[0]} frames" + ("" if given else " assumed (frame size not given)")


#: The plan's warning when fp16 was asked on the CPU; it holds for every job, so a pipeline says it at load.
FP16_ON_CPU = ("fp16 was asked but the device is the CPU: fp16 falls back to fp32 (half-precision convolutions on "
               "the CPU are slow or missing).")


def _choose_fp16(config: InferenceConfig, on_cuda: bool, cc: Any, mm: MemoryModel, reasons: dict[str, str],
                 notes: list[str]) -> bool:
    """fp16 or fp32, its reason put in ``reasons`` (and a note when fp16 was asked on the CPU)."""
    if on_cuda and config.fp16 is not None:
        fp16 = bool(config.fp16)
        reasons["fp16"] = f"user override ({'fp16' if fp16 else 'fp32'})"
    elif on_cuda and cc is not None and tuple(cc) < tuple(mm.fp16_min_capability):
        fp16 = False
        reasons["fp16"] = (f"fp32: compute capability {cc[0]}.{cc[1]} has no native half arithmetic "
                           f"(fp16 needs {mm.fp16_min_capability[0]}.{mm.fp16_min_capability[1]} or newer)")
    elif on_cuda:
        fp16 = True
        cc_text = f"compute capability {cc[0]}.{cc[1]}" if cc else "compute capability unknown"
        reasons["fp16"] = (f"fp16 on CUDA ({cc_text}): halves weights and activations and is what the official "
                           "realtime path runs; bf16 is not used, the T4 (7.5) has no fast bf16")
    else:
        fp16 = False
        if config.fp16:
            reasons["fp16"] = "fp32: fp16 was asked but the device is the CPU, so it falls back to fp32"
            notes.append(FP16_ON_CPU)
        else:
            reasons["fp16"] = "fp32 on the CPU (half precision is slow or missing there)"
    return fp16


def _tracking(kind: str, backend: str) -> str:
    """How a CPU job of ``kind`` finds its faces, in words ("" for realtime and clip jobs, which track none)."""
    name = "dwpose (auto)" if backend == "auto" else backend
    return "" if kind in ("realtime", "clip") else (
        "no face tracking (boxes given)" if backend == "boxes" else f"face tracking by {name}")


def _cpu_time_note(kind: str, n_frames: int | None, source_frames: int | None, weights: str, backend: str,
                   frame_size: tuple[int, int], size_note: str) -> str:
    """The CPU warning: the job's time stage by stage when its length is known, else seconds per frame; and dlib's
    time where it saves a tenth or more (of a job of a minute or more)."""
    models = "the tiny test models" if weights == "tiny" else "the full-size models"
    tracking = _tracking(kind, backend)
    where = f"2 cores, fp32, {models}, {size_note}" + (f", {tracking}" if tracking else "")

    def seconds(name: str) -> tuple[dict[str, float], float]:  # (the job's stages, its total or s per frame)
        parts = cpu_seconds(kind, n_frames or 1, source_frames if n_frames else None, weights,
                            landmark_backend=name, frame_size=frame_size)
        return parts, sum(v for k, v in parts.items() if n_frames or k != "models")

    parts, total = seconds(backend)
    if n_frames:  # faces, latents and parsing count source frames, generate output frames
        frames = plural(n_frames, "frame") + (f" from {plural(min(n_frames, source_frames), 'source frame')}"
                                              if kind == "lipsync" and source_frames is not None else "")
        what = (f"{frames} take{'s' if n_frames == 1 else ''} about {_duration(total)} ("
                + ", ".join(f"{k} {_duration(v)}" for k, v in parts.items() if v) + ")")
    else:
        what = f"about {total:.1f} s per frame, plus {_duration(parts['models'])} to load the models"
    dlib = seconds("dlib")[1]
    if tracking and dlib <= 0.9 * total and (total >= 60 or not n_frames):
        what += ("; with landmark_backend='dlib' (dlib's landmarks, not DWPose's) about "
                 + (_duration(dlib) if n_frames else f"{dlib:.1f} s per frame"))
    return (f"Running on the CPU ({where}): {what}. Use a GPU runtime for real jobs (Colab: {colab_gpu_steps()}).")


def _gpu_budget(rep: GpuReport, mm: MemoryModel, loaded_gib: float = 0.0) -> tuple[float | None, str]:
    """The GPU budget of a plan, GiB, and its reason (the formula is in :mod:`nbhelpers.gpu.model`)."""
    if rep.free_gib is None:
        return None, "free GPU memory unknown"
    cached = max(0.0, rep.reserved_gib - rep.allocated_gib)
    loaded = min(loaded_gib, rep.allocated_gib) if rep.memory_source == "torch" else loaded_gib
    usable = rep.free_gib + cached + max(0.0, loaded)
    parts = [f"{rep.free_gib:.1f} GiB free"]
    if cached > 0.005:
        parts.append(f"+ {cached:.2f} GiB cached by this process")
    if loaded > 0.005:
        parts.append(f"+ {loaded:.2f} GiB of models already loaded on the GPU (counted in the stages' fixed part, "
                     "so not counted twice)")
    parts.append(f"- {mm.workspace_gib:.2f} GiB for cuBLAS/cuDNN workspaces and lazily loaded kernels")
    usable -= mm.workspace_gib
    if rep.memory_source != "torch":
        usable -= mm.context_gib
        parts.append(f"- {mm.context_gib:.2f} GiB for the CUDA context")
    budget = max(0.0, usable) * (1.0 - mm.safety_fraction)
    return budget, " ".join(parts) + f", less a {mm.safety_fraction:.0%} margin = {budget:.2f} GiB budget"


def _fit_batch(stages: dict[str, tuple[float, float]], budget: float | None, cap: int, kind: str, precision: str,
               size_note: str) -> tuple[int, str]:
    if budget is None:
        fallback = min(8, cap)
        return fallback, f"free memory unknown: the official offline default {fallback} (inference.py:266)"
    growing = {name: ab for name, ab in stages.items() if ab[1] > 0}  # each kind has encode or generate, which grow
    limiting = min(growing, key=lambda name: (budget - growing[name][0]) / growing[name][1])
    a, b = growing[limiting]
    best = (budget - a) / b
    model = f"stage {limiting!r} needs {a:.2f} GiB + {b:.3f} GiB per frame ({precision}, {size_note})"
    if best < 1:
        return 1, f"1: {model}; the {budget:.2f} GiB budget does not fit even one frame"
    if best >= cap:
        return cap, (f"{cap}: {model}; the {budget:.2f} GiB budget fits {int(best)} frames; capped at {cap} for "
                     f"{kind} ({CAP_REASONS[kind]})")
    snapped = snap_batch(best)
    return snapped, (f"{snapped}: {model}; the {budget:.2f} GiB budget fits {plural(int(best), 'frame')}, snapped to "
                     f"{snapped} (1, 2 or a multiple of 4)")


def _cpu_batch(rep: GpuReport, stages: dict[str, tuple[float, float]], mm: MemoryModel,
               size_note: str) -> tuple[float | None, int, str]:
    cap = mm.cap_cpu
    if rep.host_ram_available_gib is None:
        return None, cap, f"{cap}: CPU batch (host RAM unknown)"
    budget = rep.host_ram_available_gib * mm.cpu_ram_fraction
    growing = {name: ab for name, ab in stages.items() if ab[1] > 0}
    limiting = min(growing, key=lambda name: (budget - growing[name][0]) / growing[name][1])
    a, b = growing[limiting]
    fits = (budget - a) / b
    batch = min(cap, snap_batch(fits))
    shown = "no frames" if fits < 1 else ("more than 999 frames" if fits > 999 else plural(int(fits), "frame"))
    return budget, batch, (f"{batch}: fp32 on the CPU: stage {limiting!r} needs {a:.2f} GiB + {b:.3f} GiB per frame "
                           f"of host RAM ({size_note}); {budget:.1f} GiB usable fits {shown}; CPU batches "
                           f"are at most {cap} (a larger batch is no faster on the CPU)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def report(device: str | int | None = None) -> GpuReport:
    """:func:`~nbhelpers.gpu.device.read_report` with the ``verdict`` of :func:`plan` for a lip-sync job.
    Raises InputError: ``device`` is not a CUDA device name or index, or names a device that does not exist."""
    rep = read_report(device)
    verdict = "torch is not installed: run the setup cell first (Colab has torch preinstalled)"
    if rep.has_torch:
        try:
            verdict = plan("lipsync", report=rep, warn=False).verdict
        except Exception as exc:  # noqa: BLE001 - a display must never fail
            verdict = f"no plan could be made ({type(exc).__name__}: {exc})"
    return dataclasses.replace(rep, verdict=verdict)


def check_gpu(allow_cpu: bool | None = None, device: str | int | None = None) -> GpuReport:
    """:func:`report` of ``device``, then :meth:`GpuReport.require_gpu` with ``allow_cpu``: stop a CPU-only runtime.
    Raises NoGpuError, MissingDependencyError, InputError: as those two."""
    return report(device).require_gpu(allow_cpu)
