"""GPU planning: the device report, automatic precision and batch size, and recovery from out-of-memory.

The GPU module decides once (STYLE.md §11): :func:`report` says what the runtime has, :func:`plan` turns that
into a device, a precision and a batch size with the reason for each, and :func:`batched` runs a stage in ordered
batches that halve on CUDA out-of-memory without losing a frame.

>>> from nbhelpers import gpu
>>> gpu.report()                     # doctest: +SKIP   (GPU, memory, versions, host RAM, verdict)
>>> gpu.check_gpu()                  # doctest: +SKIP   (stops a CPU-only Colab runtime with the fix)
>>> gpu.plan("lipsync").config       # doctest: +SKIP   (InferenceConfig with device, fp16, batch_size, reasons)

Nothing here imports torch at module import; :func:`report` works without torch installed.

Memory model
------------
The planner predicts the peak GPU memory of each stage of a job as ``fixed + per_frame * batch`` (GiB) and picks
the largest batch whose worst stage fits the budget. Stages run one after another and the pipeline releases each
stage's models before the next loads, so the job's peak is the *maximum* over stages, not their sum:

=========  ==========  ===========================================================  ===========================
kind       stage       fixed part (GiB)                                             per frame of the batch (GiB)
=========  ==========  ===========================================================  ===========================
lipsync    faces       S3FD weights + S3FD activations of one full frame + DWPose   0 (batch 1, full frames)
lipsync    encode      resident: core weights (UNet + VAE + Whisper) + whisper      VAE encode, masked + ref
                       features + latents of the job
lipsync    parsing     resident + BiSeNet weights                                   BiSeNet activations, 512²
lipsync    generate    resident                                                     UNet + VAE decode + blend
avatar     faces       as lipsync                                                   0
avatar     encode      VAE weights + latents (the VAE is loaded alone)              VAE encode
avatar     parsing     BiSeNet weights (alone)                                      BiSeNet activations
realtime   generate    core weights + whisper features                              UNet + VAE decode + blend
=========  ==========  ===========================================================  ===========================

The order follows ``pipeline.lipsync`` (faces, then models, features, encode, parsing, generate) and
``avatar.prepare_avatar`` (faces, VAE encode, release, parsing).
fp32 multiplies weights and activations by :attr:`MemoryModel.fp32_factor`; the blend term (full frames) does
not change with precision. The budget is
``(free + this process's cached - workspace [- context]) * (1 - safety_fraction)``.

All constants are in :class:`MemoryModel` below (one table, with sources). ``bench/memory.py`` measures them on
the GPU machine; update the table from its output.
"""

from __future__ import annotations

import dataclasses
import gc
import html
import math
import numbers
import os
import platform
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .constants import AUDIO_TOKENS, LATENT_CHANNELS, LATENT_SIZE, WHISPER_DIM
from .errors import (
    FallbackWarning,
    InputError,
    MissingDependencyError,
    NbHelpersError,
    NbHelpersWarning,
    OutOfMemoryError,
)

T = TypeVar("T")

GIB = 2**30  # bytes per GiB
ALLOCATOR_SETTING = "expandable_segments:True"


def prefer_expandable_segments() -> bool:
    """Ask PyTorch's CUDA caching allocator for expandable segments, unless the allocator is configured already.

    The job's batches have several sizes (VAE encode, UNet, VAE decode, full-frame paste-back), and the default
    allocator keeps the blocks of one size it cannot reuse for the next, so what the process holds grows well
    past what it uses. Measured with ``bench/memory.py`` on an H200 held to a 4 GiB and a 15 GiB card (fp16, full
    v1.5 core, 500 frames): peak reserved 2.95 -> 2.65 GiB at batch 4 (with the CUDA context: 3.63 -> 3.33 GiB,
    under the 3.5 GiB target only with this setting) and 10.03 -> 7.93 GiB at batch 32 (bench/RESULTS.md).

    Runs when :mod:`nbhelpers.gpu` is imported. It sets ``PYTORCH_CUDA_ALLOC_CONF`` for this process and its
    children only when neither ``PYTORCH_CUDA_ALLOC_CONF`` nor ``PYTORCH_ALLOC_CONF`` is set, the platform is
    Linux (Windows has no expandable segments), ``NBHELPERS_ALLOCATOR`` is not ``default`` and CUDA has not
    started in this process (after that, the allocator no longer reads it).

    Returns:
        True when this call set it.

    Source: none (ours); the setting is PyTorch's (``torch.cuda`` memory management notes, since torch 2.1).
    """
    if (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
            or os.environ.get("NBHELPERS_ALLOCATOR", "").lower() == "default" or not sys.platform.startswith("linux")):
        return False
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return False
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_SETTING
    return True


prefer_expandable_segments()

# =====================================================================================================================
# Memory model: every constant the planner uses. GiB = 2**30 bytes; "fp16" figures are multiplied by fp32_factor
# for fp32. Measured figures are from DESIGN.md ("Performance principles": H200, fp16, full v1.5 core, random
# weights); estimates are marked as such and are what bench/memory.py checks.
# =====================================================================================================================


@dataclass(frozen=True)
class MemoryModel:
    """The planner's constants, one table. Replace fields with :func:`dataclasses.replace` to try other values.

    Attributes:
        core_weights_gib: UNet + VAE + Whisper weights in fp16, GiB. Measured: 1.84 (DESIGN.md).
        core_fixed_gib: Fixed part of the core's peak in fp16 (weights + buffers), GiB. Intercept of the line
            through DESIGN.md's measured peaks 3.06 / 4.25 / 6.62 GiB at batch 8 / 16 / 32: 1.87.
        core_per_frame_gib: Growth of the core's peak per frame of a UNet + VAE-decode batch in fp16, GiB/frame.
            Slope of the same line: (6.62 - 3.06) / 24 = 0.149 (VAE decode of 256x256 crops dominates).
        vae_weights_gib: sd-vae-ft-mse weights in fp16, GiB (84 M parameters): 0.16.
        encode_per_frame_gib: VAE encode of one frame's masked + reference crops in fp16, GiB/frame. Measured
            with bench/memory.py (H200, expandable segments): peak reserved 2.65 / 7.93 GiB at batch 4 / 32, a
            slope of 0.188 (the first estimate, the core slope 0.149, was too low).
        s3fd_weights_gib: S3FD face detector weights in fp16, GiB. Estimate 0.05 (22 M parameters).
        s3fd_bytes_per_pixel: S3FD activations per pixel of the full frame it runs on (batch 1, quirk Q18), in
            fp16, bytes. Estimate 320 (two live 64-channel maps of VGG16's first block plus the input).
        dwpose_gib: DWPose through ONNX Runtime (weights + arena at 288x384 crops), GiB. Estimate 0.2; ONNX
            Runtime runs it in fp32 whatever the plan says.
        bisenet_weights_gib: BiSeNet face-parsing weights in fp16, GiB. Estimate 0.03.
        bisenet_per_image_gib: BiSeNet activations per 512x512 crop in fp16, GiB/image. Estimate 0.05.
        blend_bytes_per_pixel: GPU paste-back per full-frame pixel, bytes: 3 (uint8 BGR) x 4 for the float
            intermediates (frame, resized crop, mask, result). Does not scale with precision.
        context_gib: CUDA context of a process, GiB; subtracted only when free memory was read outside torch
            (nvidia-smi or NVML, before this process made its context). T4, torch 2.x: about 0.3-0.4.
        workspace_gib: Kept free for cuBLAS/cuDNN workspaces, kernels loaded lazily on first use and the
            caching allocator's rounding, GiB. Estimate 0.5.
        safety_fraction: Fraction of what remains that the plan leaves unused (fragmentation, a second notebook).
        fp32_factor: fp32 / fp16 ratio of weights and activations: 2.0.
        tiny_fixed_gib: Fixed part of the tiny test models' peak (weights="tiny"), GiB. Estimate 0.05.
        tiny_per_frame_gib: Per-frame part for the tiny models, GiB/frame. Estimate 0.01.
        cap_lipsync: Largest batch of the offline job, frames. 32: at about 0.8 TFLOP per frame (UNet + decode)
            a batch of 8-16 already keeps a T4 busy and DESIGN.md finds the CPU side (blend, encode) to be the
            wall, so larger batches add memory, first-output latency and OOM-retry cost for no speed.
        cap_avatar: Largest batch of avatar preparation (encode, parsing), frames. 32, as above.
        cap_realtime: Largest batch of realtime generation, frames. 20, the official default
            (realtime_inference.py:331): 0.8 s of video per batch, so the first frame comes after one batch.
        cap_cpu: Batch on the CPU, frames. 4: on 2 cores the full UNet takes 2.9-3.6 s at batch 1 and 8-10 s at
            batch 4 (environment-notes), so larger batches do not help and progress shows later.
        cpu_ram_fraction: Share of available host RAM a CPU plan may use for models and activations.
        cpu_seconds_per_frame: End-to-end CPU time per frame at full size, 2 cores, fp32 (environment-notes): 18.
        cpu_seconds_per_frame_tiny: Same with the tiny test models: 2.8 (latents 0.8 + parsing 0.8 + generate
            1.25 s per frame, :data:`CPU_TIMES`; the first figure, 1.5, left out the per-source-frame stages).
        fp16_min_capability: Oldest compute capability given fp16 by default (5.3: native half arithmetic).
    """

    core_weights_gib: float = 1.84
    core_fixed_gib: float = 1.87
    core_per_frame_gib: float = 0.149
    vae_weights_gib: float = 0.16
    encode_per_frame_gib: float = 0.19
    s3fd_weights_gib: float = 0.05
    s3fd_bytes_per_pixel: float = 320.0
    dwpose_gib: float = 0.2
    bisenet_weights_gib: float = 0.03
    bisenet_per_image_gib: float = 0.05
    blend_bytes_per_pixel: float = 12.0
    context_gib: float = 0.4
    workspace_gib: float = 0.5
    safety_fraction: float = 0.10
    fp32_factor: float = 2.0
    tiny_fixed_gib: float = 0.05
    tiny_per_frame_gib: float = 0.01
    cap_lipsync: int = 32
    cap_avatar: int = 32
    cap_realtime: int = 20
    cap_cpu: int = 4
    cpu_ram_fraction: float = 0.75
    cpu_seconds_per_frame: float = 18.0
    cpu_seconds_per_frame_tiny: float = 2.8
    fp16_min_capability: tuple[int, int] = (5, 3)


MEMORY_MODEL = MemoryModel()


@dataclass(frozen=True)
class CpuTimes:
    """Seconds of work per stage on a 2-core CPU (fp32), for the planner's estimate of how long a CPU job takes.

    A job's time is not one figure per output frame: the latents and the face parsing run once per *source* frame
    used (``min(output frames, source frames)``), generation once per output frame, and loading the models once
    (issue 14 item 11: 1.5 s per output frame predicted 75 s for a tiny-model job that took 207 s).

    Attributes:
        fixed_s: Loading the models plus whisper on the clip's audio, seconds.
        latents_s: VAE encode of one source frame's masked and reference crops, seconds per frame.
        parsing_s: BiSeNet face parsing and blend-mask preparation of one source frame, seconds per frame (the
            same network for real and tiny weights: the tiny tree keeps BiSeNet's full architecture).
        generate_s: UNet + VAE decode + CPU blend of one output frame, seconds per frame.
        source: Where the figures come from.
    """

    fixed_s: float
    latents_s: float
    parsing_s: float
    generate_s: float
    source: str = ""


#: Per-stage CPU figures, ``"full"`` and ``"tiny"`` weights. Tiny: process CPU time of each stage of three
#: ``lipsync`` runs here (2 cores, 576x768 clip; 40 source / 50 output frames and 10 / 100 with dlib, 20 / 20 with
#: DWPose ONNX + S3FD): models + audio 5.6-6.3 s, latents 0.71-0.85 s, parsing 0.59-0.91 s per source frame,
#: generate + blend 1.22-1.52 s per output frame. (Face tracking, before the plan, is not counted: dlib took
#: 0.08-0.14 s per frame, S3FD + DWPose ONNX 6 s per 576x768 frame.) Full: environment-notes (UNet 8-10 s per batch of 4, VAE encode 3 s per crop and decode 7 s per frame,
#: UNet build 8 s), parsing as measured for tiny. The figures are CPU seconds: on two free cores a stage can
#: finish up to about 1.7x sooner, and other work sharing the cores makes it slower.
CPU_TIMES = {
    "full": CpuTimes(fixed_s=12.0, latents_s=6.0, parsing_s=0.8, generate_s=9.3,
                     source="environment-notes (2 cores, fp32) + parsing measured here"),
    "tiny": CpuTimes(fixed_s=6.0, latents_s=0.8, parsing_s=0.8, generate_s=1.25,
                     source="stage CPU times of two tiny-model lipsync runs here (2 cores)"),
}


def cpu_seconds(kind: str = "lipsync", n_frames: int = 0, source_frames: int | None = None,
                weights: str = "full", times: CpuTimes | None = None) -> dict[str, float]:
    """The CPU time of a job's stages after face tracking, stage by stage, in seconds.

    Args:
        kind: ``"lipsync"`` (models, latents and parsing of the source frames used, generation), ``"avatar"``
            (latents and parsing of every source frame) or ``"realtime"`` (models and generation).
        n_frames: Output frames for lipsync/realtime (audio seconds x 25); source frames for avatar.
        source_frames: Source frames of the video (25 fps) for lipsync; None assumes at least ``n_frames``, so
            that every output frame has its own source frame (the longest case).
        weights: ``"full"`` or ``"tiny"``.
        times: Other figures (default ``CPU_TIMES[weights]``).

    Returns:
        ``{stage: seconds}`` with the stages that run (``models``, ``latents``, ``parsing``, ``generate``).

    Raises:
        InputError: Unknown ``kind`` or ``weights``.

    Source: none in the official code; the figures are documented at :data:`CPU_TIMES`.
    """
    if kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(map(repr, KINDS))}; got {kind!r}.")
    if weights not in WEIGHTS:
        raise InputError(f"weights must be 'full' or 'tiny'; got {weights!r}.")
    t = times or CPU_TIMES[weights]
    n = max(0, int(n_frames or 0))
    if kind == "avatar":
        return {"models": t.fixed_s / 2, "latents": n * t.latents_s, "parsing": n * t.parsing_s}
    if kind == "realtime":
        return {"models": t.fixed_s, "generate": n * t.generate_s}
    used = n if source_frames is None else min(n, max(0, int(source_frames)))
    return {"models": t.fixed_s, "latents": used * t.latents_s, "parsing": used * t.parsing_s,
            "generate": n * t.generate_s}

#: Frame size (H, W) in pixels assumed when ``plan`` is not told the frame size: full HD, so the blend term is
#: not underestimated for common inputs.
DEFAULT_FRAME_SIZE = (1080, 1920)

#: Seconds allowed for one ``nvidia-smi`` call before the report says "unknown".
NVIDIA_SMI_TIMEOUT_S = 10.0

KINDS = ("lipsync", "avatar", "realtime")
WEIGHTS = ("full", "tiny")

COLAB_GPU_STEPS = "Runtime > Change runtime type > T4 GPU > Save, then run the notebook again from the top"


class NoGpuError(NbHelpersError, RuntimeError):
    """No CUDA GPU is usable and the caller did not allow the CPU (``allow_cpu`` / ``NBHELPERS_ALLOW_CPU=1``)."""


class PlanWarning(NbHelpersWarning):
    """A plan works but something about it deserves attention (CPU speed, fp16 on CPU, a tight memory budget)."""


# =====================================================================================================================
# Device report
# =====================================================================================================================


@dataclass(frozen=True)
class GpuProcess:
    """One process the driver lists on the GPU.

    Attributes:
        pid: Process id as the driver sees it (in containers, a host pid).
        name: Process name, or ``""`` when the driver does not say.
        used_gib: GPU memory it holds, GiB, or None when the driver does not say.
    """

    pid: int
    name: str = ""
    used_gib: float | None = None


@dataclass(frozen=True)
class GpuReport:
    """What this runtime has: GPU, memory, versions, host RAM. Shows itself as text and as an HTML table.

    Build one with :func:`report`; tests build fakes directly, e.g.
    ``GpuReport(has_gpu=True, device="cuda:0", name="Tesla T4", compute_capability=(7, 5), total_gib=15.0,
    free_gib=14.7)``.

    Attributes:
        has_gpu: True when torch can use a CUDA GPU.
        has_torch: False when torch could not be imported (then nothing can run; ``verdict`` says so).
        device: ``"cuda:0"`` (the GPU reported) or ``"cpu"``.
        name: GPU name (``"Tesla T4"``), or None.
        compute_capability: ``(major, minor)``, e.g. ``(7, 5)`` for the T4, or None.
        total_gib: GPU memory, GiB, or None.
        free_gib: Free GPU memory as the driver reports it, GiB, or None. Read through torch, so this process's
            CUDA context is already taken out of it.
        reserved_gib: Memory this process's torch caching allocator holds, GiB.
        allocated_gib: Part of ``reserved_gib`` that live tensors use, GiB.
        other_processes: Processes the driver lists on this GPU other than this one; None when unknown.
        other_processes_source: ``"nvml"``, ``"nvidia-smi"`` or ``"unknown"``.
        memory_source: Where total/free came from: ``"torch"`` (CUDA context included), ``"nvml"``,
            ``"nvidia-smi"`` (context not yet made) or ``"none"``.
        gpu_count: CUDA devices torch sees.
        driver_version: NVIDIA driver version, or None.
        cuda_version: CUDA version torch was built with (``torch.version.cuda``), or None.
        torch_version: ``torch.__version__``, or None when torch is not installed.
        python_version: Python version, e.g. ``"3.11.7"``.
        host_ram_total_gib: Host RAM, GiB, or None.
        host_ram_available_gib: Host RAM available without swapping, GiB, or None.
        colab: True in Google Colab.
        notes: Odd states met while reading (driver warnings, failed queries), in words.
    """

    has_gpu: bool = False
    has_torch: bool = True
    device: str = "cpu"
    name: str | None = None
    compute_capability: tuple[int, int] | None = None
    total_gib: float | None = None
    free_gib: float | None = None
    reserved_gib: float = 0.0
    allocated_gib: float = 0.0
    other_processes: tuple[GpuProcess, ...] | None = None
    other_processes_source: str = "unknown"
    memory_source: str = "torch"
    gpu_count: int = 0
    driver_version: str | None = None
    cuda_version: str | None = None
    torch_version: str | None = None
    python_version: str = field(default_factory=platform.python_version)
    host_ram_total_gib: float | None = None
    host_ram_available_gib: float | None = None
    colab: bool = False
    notes: tuple[str, ...] = ()

    @property
    def outside_torch_gib(self) -> float | None:
        """GPU memory held outside this process's torch allocator, GiB: ``total - free - reserved``.

        This is this process's CUDA context plus what other processes hold; None when memory is unknown.
        """
        if self.total_gib is None or self.free_gib is None:
            return None
        return max(0.0, self.total_gib - self.free_gib - self.reserved_gib)

    @property
    def others_gib(self) -> float | None:
        """GPU memory held by the other processes the driver lists, GiB; None when unknown."""
        if self.other_processes is None:
            return None
        return sum(p.used_gib or 0.0 for p in self.other_processes)

    @property
    def verdict(self) -> str:
        """One line: the GPU, its free memory and what :func:`plan` would choose for a lip-sync job.

        E.g. ``"Tesla T4, 14.7 GiB free: fp16, batch 32"``.
        """
        if not self.has_torch:
            return "torch is not installed: run the setup cell first (Colab has torch preinstalled)"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PlanWarning)
                p = plan("lipsync", report=self)
        except Exception as exc:  # noqa: BLE001 - a display must never fail
            return f"no plan could be made ({type(exc).__name__}: {exc})"
        return p.verdict

    def require_gpu(self, allow_cpu: bool | None = None) -> GpuReport:
        """Stop early when there is no usable CUDA GPU, with the fix in words.

        Call this before anything large is downloaded. Returns ``self`` so that ``report().require_gpu()`` chains.

        Args:
            allow_cpu: True lets a CPU-only runtime through (CI, tiny models). None reads the environment
                variable ``NBHELPERS_ALLOW_CPU`` (``1``/``true``/``yes`` allow).

        Returns:
            This report.

        Raises:
            MissingDependencyError: torch is not installed (whatever ``allow_cpu`` says: nothing can run).
            NoGpuError: No CUDA GPU is usable and the CPU is not allowed. The message gives the Colab steps
                (Runtime > Change runtime type > T4 GPU > Save) and the escape hatch.

        Source: none (the official scripts fail later inside ``.cuda()`` calls, reference §6 "Devices").
        """
        if self.has_gpu:
            return self
        if not self.has_torch:
            raise MissingDependencyError(
                "torch is not installed, so nothing can run. On Colab torch is preinstalled: restart the runtime "
                "(Runtime > Restart session). Elsewhere install it first, e.g.:\n    pip install torch")
        if allow_cpu is None:
            allow_cpu = _env_flag("NBHELPERS_ALLOW_CPU")
        if allow_cpu:
            return self
        why = "; ".join(self.notes) if self.notes else "torch.cuda.is_available() is False"
        where = (f"In Google Colab: {COLAB_GPU_STEPS}." if self.colab else
                 f"In Google Colab: {COLAB_GPU_STEPS}. Elsewhere: check that `nvidia-smi` lists a GPU and that "
                 "torch is a CUDA build (torch.version.cuda is not None).")
        raise NoGpuError(
            f"No CUDA GPU is usable in this runtime (torch {self.torch_version or 'version unknown'}; {why}). "
            "MuseTalk needs a GPU: "
            f"on the CPU one frame takes about {MEMORY_MODEL.cpu_seconds_per_frame:.0f} s. {where} "
            "To run on the CPU anyway (CI, tiny models), pass allow_cpu=True or set the environment variable "
            "NBHELPERS_ALLOW_CPU=1.")

    def _rows(self) -> list[tuple[str, str]]:
        rows: list[tuple[str, str]] = []
        if self.has_gpu or self.name:
            cc = f", compute capability {self.compute_capability[0]}.{self.compute_capability[1]}" \
                if self.compute_capability else ""
            usable = "" if self.has_gpu else " (not usable by torch)"
            rows.append(("GPU", f"{self.name or 'unknown'} ({self.device}){cc}{usable}"))
        else:
            rows.append(("GPU", "none (CPU only)"))
        if self.total_gib is not None and self.free_gib is not None:
            mem = (f"{self.total_gib:.1f} GiB total, {self.free_gib:.1f} GiB free, "
                   f"{self.reserved_gib:.2f} GiB reserved by this process")
            outside = self.outside_torch_gib
            if outside is not None and self.memory_source == "torch":
                mem += f", {outside:.2f} GiB outside torch (CUDA context + other processes)"
            rows.append(("memory", mem))
            if self.other_processes is None:
                rows.append(("other processes", "unknown"))
            elif not self.other_processes:
                rows.append(("other processes", f"none listed ({self.other_processes_source})"))
            else:
                listed = ", ".join(
                    f"{p.name or 'pid'} {p.pid}: " + ("?" if p.used_gib is None else f"{p.used_gib:.2f} GiB")
                    for p in self.other_processes)
                rows.append(("other processes", f"{self.others_gib:.2f} GiB ({listed}; {self.other_processes_source})"))
        versions = [f"driver {self.driver_version or 'unknown'}",
                    f"CUDA {self.cuda_version or 'none'} (torch build)",
                    f"torch {self.torch_version or 'not installed'}",
                    f"Python {self.python_version}"]
        rows.append(("versions", ", ".join(versions)))
        if self.host_ram_total_gib is not None:
            avail = "" if self.host_ram_available_gib is None else f", {self.host_ram_available_gib:.1f} GiB available"
            rows.append(("host RAM", f"{self.host_ram_total_gib:.1f} GiB total{avail}"))
        else:
            rows.append(("host RAM", "unknown"))
        rows.append(("runtime", "Google Colab" if self.colab else "not Colab"))
        for note in self.notes:
            rows.append(("note", note))
        rows.append(("verdict", self.verdict))
        return rows

    def __str__(self) -> str:
        rows = self._rows()
        width = max(len(k) for k, _ in rows)
        return "GPU report\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in self._rows())
        return f"<table><caption style='text-align:left'><b>GPU report</b></caption>{body}</table>"


def report(device: str | int | None = None) -> GpuReport:
    """Read what this runtime has: GPU name, compute capability, memory, other processes, versions, host RAM.

    Never raises on odd driver states (a driver too old for torch, a busy or lost GPU, a hanging ``nvidia-smi``):
    what could not be read is None or ``"unknown"`` and ``notes`` says why. Works without torch installed (then
    ``torch_version`` is None and ``verdict`` says so). Reading free memory through torch makes this process's
    CUDA context (about 0.3-0.4 GiB) if it did not exist yet.

    Args:
        device: The CUDA device to report: None (torch's current device), an index, or ``"cuda"``/``"cuda:N"``.

    Returns:
        A :class:`GpuReport` (frozen; ``str()`` gives text, notebooks show an HTML table).

    Raises:
        InputError: ``device`` is not a CUDA device name or index, or names a device that does not exist.

    Source: none in the official code, which assumes ``cuda:0`` everywhere (reference §6 "Devices").
    """
    notes: list[str] = []
    values: dict[str, Any] = {"python_version": platform.python_version(), "colab": _in_colab()}
    values["host_ram_total_gib"], values["host_ram_available_gib"] = _host_ram_gib()
    index = _device_index(device)
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError from a broken CUDA install
        torch = None
        values["has_torch"] = False
        notes.append(f"torch is not installed ({type(exc).__name__}: {exc})")
    uuid = None
    if torch is not None:
        values["torch_version"] = str(torch.__version__)
        values["cuda_version"] = getattr(torch.version, "cuda", None)
        if values["cuda_version"] is None:
            notes.append(f"this torch ({torch.__version__}) is a CPU-only build")
        uuid = _read_torch_cuda(torch, index, values, notes)
    info = _driver_info(uuid, index, notes)
    values["driver_version"] = info.get("driver_version")
    if "processes" in info:
        values["other_processes"] = info["processes"]
        values["other_processes_source"] = info["source"]
    if not values.get("has_gpu") and info.get("name") and "total_gib" not in values:
        # torch cannot use the GPU (or is missing) but the driver sees one: show it, for the diagnosis.
        values.update(name=info["name"], total_gib=info.get("total_gib"), free_gib=info.get("free_gib"),
                      memory_source=info["source"])
    return GpuReport(notes=tuple(notes), **values)


_read_report = report  # plan()'s parameter named ``report`` hides the function


def _no_cuda_message(device: str) -> str:
    return (f"config.device is {device!r} but no CUDA GPU is usable in this runtime. In Google Colab: "
            f"{COLAB_GPU_STEPS}. Or set device=None (automatic) or 'cpu'.")


def check_device(device: str | None) -> None:
    """Stop a job that asks for a CUDA device this runtime does not have, before any frame is decoded.

    Args:
        device: ``config.device``: None (automatic), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Raises:
        NoGpuError: ``device`` names CUDA and torch sees no CUDA GPU, or fewer than N + 1 of them.

    Source: none (ours); :func:`plan` applies the same rule later, after the faces stage.
    """
    if device is None or not str(device).startswith("cuda"):
        return
    try:
        import torch
    except ImportError:
        count = 0
    else:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(str(device).partition(":")[2] or 0)
    if count == 0:
        raise NoGpuError(_no_cuda_message(device))
    if index >= count:
        raise NoGpuError(f"config.device is {device!r} but this runtime has {count} CUDA GPU(s) (cuda:0 to "
                         f"cuda:{count - 1}). Pick one of those, or device=None (automatic).")


def check_gpu(allow_cpu: bool | None = None, device: str | int | None = None) -> GpuReport:
    """:func:`report` then :meth:`GpuReport.require_gpu`: stop a CPU-only runtime before any download.

    Args:
        allow_cpu: True lets a CPU-only runtime through; None reads ``NBHELPERS_ALLOW_CPU``.
        device: CUDA device to report (see :func:`report`).

    Returns:
        The report.

    Raises:
        NoGpuError: No usable CUDA GPU and the CPU not allowed (the message gives the Colab steps).
        MissingDependencyError: torch is not installed.
        InputError: Bad ``device``.

    Source: none (the official scripts assume ``cuda:0``, reference §6 "Devices").
    """
    return report(device).require_gpu(allow_cpu)


def _device_index(device: str | int | None) -> int | None:
    if device is None or isinstance(device, bool):
        if isinstance(device, bool):
            raise InputError(f"device must be None, a CUDA index or 'cuda:N'; got {device!r}.")
        return None
    if isinstance(device, int):
        if device < 0:
            raise InputError(f"device must be a CUDA index >= 0; got {device!r}.")
        return device
    text = str(device).strip().lower()
    if text == "cuda":
        return None
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise InputError(f"device must be None, a CUDA index, 'cuda' or 'cuda:N'; got {device!r}. "
                     "The report describes a CUDA GPU; for the CPU call report() with no device.")


def _read_torch_cuda(torch: Any, index: int | None, values: dict[str, Any], notes: list[str]) -> str | None:
    """Fill the CUDA fields of ``values`` from torch; return the device UUID (for NVML) when known."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            available = bool(torch.cuda.is_available())
        except Exception as exc:  # noqa: BLE001
            available = False
            notes.append(f"torch.cuda.is_available() failed ({type(exc).__name__}: {exc})")
    for w in caught:
        notes.append(f"torch warned: {str(w.message).strip()}")
    if not available:
        return None
    try:
        count = int(torch.cuda.device_count())
        values["gpu_count"] = count
        if index is None:
            index = int(torch.cuda.current_device())
    except Exception as exc:  # noqa: BLE001
        notes.append(f"CUDA is available but the devices could not be counted ({type(exc).__name__}: {exc})")
        return None
    if index >= count:
        raise InputError(f"device cuda:{index} does not exist: torch sees {count} CUDA device(s) "
                         f"(cuda:0..cuda:{count - 1}). Pass device=None for the current one.")
    uuid = None
    try:
        props = torch.cuda.get_device_properties(index)
        values.update(device=f"cuda:{index}", name=str(props.name),
                      compute_capability=(int(props.major), int(props.minor)),
                      total_gib=props.total_memory / GIB)
        uuid = str(getattr(props, "uuid", "") or "") or None
    except Exception as exc:  # noqa: BLE001
        notes.append(f"the properties of cuda:{index} could not be read ({type(exc).__name__}: {exc})")
        return None
    try:
        free, total = torch.cuda.mem_get_info(index)
        values.update(free_gib=free / GIB, total_gib=total / GIB, memory_source="torch",
                      reserved_gib=torch.cuda.memory_reserved(index) / GIB,
                      allocated_gib=torch.cuda.memory_allocated(index) / GIB)
    except Exception as exc:  # noqa: BLE001 - e.g. a GPU in exclusive mode held by another process
        notes.append(f"the free memory of cuda:{index} could not be read ({type(exc).__name__}: {exc}); "
                     "the GPU may be busy, lost or held by another process")
        values.update(name=values.get("name"), memory_source="none")
        return uuid
    values["has_gpu"] = True
    return uuid


def _driver_info(uuid: str | None, index: int | None, notes: list[str]) -> dict[str, Any]:
    """Driver version and other processes on the GPU from NVML (nvidia-ml-py), else ``nvidia-smi``, else {}."""
    info = _nvml_info(uuid, index, notes)
    if info is None:
        info = _nvidia_smi_info(uuid, index, notes)
    return info or {}


def _same_uuid(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    def norm(u: str) -> str:
        u = u.strip().lower()
        return u[4:] if u.startswith("gpu-") else u
    return norm(a) == norm(b)


def _nvml_info(uuid: str | None, index: int | None, notes: list[str]) -> dict[str, Any] | None:
    try:
        import pynvml
    except Exception:  # noqa: BLE001 - not installed (the usual case) or broken
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        notes.append(f"NVML could not start ({exc})")
        return None
    info: dict[str, Any] = {"source": "nvml"}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        info["driver_version"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        handle = None
        if uuid:
            for candidate in (uuid, f"GPU-{uuid}"):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(candidate)
                    break
                except Exception:  # noqa: BLE001
                    continue
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index or 0)
        name = pynvml.nvmlDeviceGetName(handle)
        info["name"] = name.decode() if isinstance(name, bytes) else str(name)
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        info["total_gib"], info["free_gib"] = mem.total / GIB, mem.free / GIB
        me = os.getpid()
        procs = []
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if int(p.pid) == me:
                continue
            used = getattr(p, "usedGpuMemory", None)
            try:
                pname = pynvml.nvmlSystemGetProcessName(p.pid)
                pname = pname.decode() if isinstance(pname, bytes) else str(pname)
            except Exception:  # noqa: BLE001
                pname = ""
            procs.append(GpuProcess(int(p.pid), os.path.basename(pname), None if used is None else used / GIB))
        info["processes"] = tuple(procs)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"NVML query failed ({type(exc).__name__}: {exc})")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return info


def _run_nvidia_smi(exe: str, query: str, notes: list[str]) -> list[list[str]] | None:
    try:
        done = subprocess.run([exe, f"--query-{query}", "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=NVIDIA_SMI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        notes.append(f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s")
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        notes.append(f"nvidia-smi could not run ({exc})")
        return None
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines()
        notes.append(f"nvidia-smi exited with status {done.returncode}" + (f": {said[0]}" if said else ""))
        return None
    return [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _nvidia_smi_info(uuid: str | None, index: int | None, notes: list[str]) -> dict[str, Any] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    gpus = _run_nvidia_smi(exe, "gpu=uuid,driver_version,name,memory.total,memory.free", notes)
    if gpus is None:
        return None
    info: dict[str, Any] = {"source": "nvidia-smi"}
    rows = [r for r in gpus if len(r) >= 5]
    if not rows:
        return info
    chosen = next((r for r in rows if _same_uuid(r[0], uuid)), None)
    if chosen is None:
        chosen = rows[index or 0] if (index or 0) < len(rows) else rows[0]
    gpu_uuid = chosen[0]
    info["driver_version"] = chosen[1] or None
    info["name"] = chosen[2] or None
    total, free = _number(chosen[3]), _number(chosen[4])
    if total is not None and free is not None:
        info["total_gib"], info["free_gib"] = total / 1024, free / 1024  # MiB -> GiB
    apps = _run_nvidia_smi(exe, "compute-apps=gpu_uuid,pid,process_name,used_memory", notes)
    if apps is None:
        return info
    me = os.getpid()
    procs = []
    for r in apps:
        if len(r) < 4 or "no running" in r[0].lower():
            continue
        pid = _number(r[1])
        if pid is None or int(pid) == me or (len(rows) > 1 and not _same_uuid(r[0], gpu_uuid)):
            continue
        used = _number(r[3])
        procs.append(GpuProcess(int(pid), os.path.basename(r[2]), None if used is None else used / 1024))
    info["processes"] = tuple(procs)
    return info


def _host_ram_gib() -> tuple[float | None, float | None]:
    """(total, available) host RAM in GiB from /proc/meminfo, else psutil, else (None, None)."""
    try:
        fields: dict[str, float] = {}
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    fields[key] = float(parts[0]) * 1024 / GIB  # kB -> GiB
        if "MemTotal" in fields:
            return fields["MemTotal"], fields.get("MemAvailable")
    except (OSError, ValueError):
        pass
    try:
        import psutil

        vm = psutil.virtual_memory()
        return vm.total / GIB, vm.available / GIB
    except Exception:  # noqa: BLE001
        return None, None


def _in_colab() -> bool:
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


# =====================================================================================================================
# Planning
# =====================================================================================================================


@dataclass(frozen=True)
class Plan:
    """Device, precision and batch size for one kind of job, with the reason for each. Shows itself.

    Attributes:
        kind: ``"lipsync"`` (offline job), ``"avatar"`` (avatar preparation) or ``"realtime"``.
        device: ``"cuda:0"``, ``"cuda"``, ``"cpu"``, ... (what the job should use).
        fp16: True for half precision (UNet, VAE, Whisper, positional encoding).
        batch_size: Frames per UNet/VAE batch (and per parsing / blend batch).
        weights: ``"full"`` or ``"tiny"`` (test models).
        frame_size: (H, W) pixels of the frames the plan assumed.
        n_frames: Frames of the job, or None when not given.
        budget_gib: GPU memory (or host RAM on the CPU) the plan lets the job use, GiB; None when unknown.
        predicted_peak_gib: The memory model's peak at ``batch_size`` (worst stage), GiB, excluding the CUDA
            context; None on the CPU.
        stage_peaks_gib: Predicted peak of each stage at ``batch_size``, GiB.
        reasons: Why each value was chosen: keys ``"device"``, ``"fp16"``, ``"batch_size"``, ``"memory"``.
        warnings: Things to know, in words (CPU speed, fp16 falling back to fp32, a tight budget).
        base_config: The configuration the plan started from (user overrides); see :attr:`config`.
    """

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

    @property
    def precision(self) -> str:
        """``"fp16"`` or ``"fp32"``."""
        return "fp16" if self.fp16 else "fp32"

    @property
    def headroom_gib(self) -> float | None:
        """GiB of the budget the plan leaves unused at its peak (``budget - predicted peak``), >= 0.

        What a caller may still spend on optional caches (e.g. keeping an avatar's source frames on the GPU);
        None on the CPU or when free memory is unknown.
        """
        if self.budget_gib is None or self.predicted_peak_gib is None:
            return None
        return max(0.0, self.budget_gib - self.predicted_peak_gib)

    @property
    def config(self):
        """An :class:`~nbhelpers.config.InferenceConfig` with ``device``, ``fp16`` and ``batch_size`` filled.

        Every other field comes from the ``config`` given to :func:`plan` (or the defaults), and ``reasons`` holds
        this plan's reasons (over the given config's own).
        """
        from .config import InferenceConfig

        base = self.base_config if self.base_config is not None else InferenceConfig()
        return dataclasses.replace(base, device=self.device, fp16=self.fp16, batch_size=self.batch_size,
                                   reasons={**base.reasons, **self.reasons})

    @property
    def verdict(self) -> str:
        """One line, e.g. ``"Tesla T4, 14.7 GiB free: fp16, batch 32"`` or ``"CPU only: fp32, batch 4, ..."``."""
        if self.device.startswith("cuda") and self.gpu_name:
            free = "" if self.free_gib is None else f", {self.free_gib:.1f} GiB free"
            return f"{self.gpu_name}{free}: {self.precision}, batch {self.batch_size}"
        if self.device == "cpu":
            per = (MEMORY_MODEL.cpu_seconds_per_frame_tiny if self.weights == "tiny"
                   else MEMORY_MODEL.cpu_seconds_per_frame)
            return f"CPU only: {self.precision}, batch {self.batch_size} (about {per:g} s per frame)"
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

    def __str__(self) -> str:
        rows = self._rows()
        width = max(len(k) for k, _ in rows)
        return f"Plan ({self.kind})\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in self._rows())
        return f"<table><caption style='text-align:left'><b>Plan ({html.escape(self.kind)})</b></caption>{body}</table>"


def snap_batch(n: float) -> int:
    """Snap a batch size down to 1, 2, or a multiple of 4 (4, 8, 12, ..., 20, ..., 32).

    Multiples of 4 waste little memory (a power-of-two rule would drop 31 to 16) and include the official
    realtime default 20; below 4 only powers of two are used.

    Args:
        n: Largest batch that fits, frames (any real number; below 1 gives 1).

    Returns:
        The snapped batch size, >= 1.

    Source: none; the official batch sizes are fixed (8 offline, 20 realtime: ``inference.py:266``,
    ``realtime_inference.py:331``).
    """
    if not n >= 1:  # also catches NaN
        return 1
    n = int(math.floor(min(n, 1 << 20)))
    if n < 4:
        return 2 if n >= 2 else 1
    return n - n % 4


def stage_memory(kind: str, fp16: bool = True, frame_size: tuple[int, int] = DEFAULT_FRAME_SIZE,
                 n_frames: int | None = None, weights: str = "full", landmark_backend: str = "auto",
                 memory_model: MemoryModel | None = None) -> dict[str, tuple[float, float]]:
    """The memory model's stages of a job: ``{stage: (fixed GiB, GiB per frame of the batch)}``.

    See the module docstring for the table of stages. Peak of a stage at batch ``b`` = ``fixed + per_frame * b``.

    Args:
        kind: ``"lipsync"``, ``"avatar"`` or ``"realtime"``.
        fp16: Half precision (fp32 multiplies weights and activations by ``fp32_factor``).
        frame_size: (H, W) of the full frames, pixels.
        n_frames: Frames of the job (adds whisper features and cached latents), or None.
        weights: ``"full"`` or ``"tiny"``.
        landmark_backend: ``"dlib"`` and ``"boxes"`` use no GPU face models (``faces`` stage is 0).
        memory_model: Constants (default :data:`MEMORY_MODEL`).

    Returns:
        Dict of stage name -> (fixed_gib, per_frame_gib), in the order the stages run.

    Source: DESIGN.md "Performance principles" (measured peaks); stage order from reference §0 and §6 (S3FD at
    batch 1 on full frames: quirk Q18, ``api.py:72``).
    """
    mm = memory_model or MEMORY_MODEL
    f = 1.0 if fp16 else mm.fp32_factor
    bytes_per_value = 2 if fp16 else 4
    h, w = frame_size
    pixels = h * w
    n = n_frames or 0
    features = n * AUDIO_TOKENS * WHISPER_DIM * bytes_per_value / GIB if kind != "avatar" else 0.0
    latents = n * LATENT_CHANNELS * LATENT_SIZE * LATENT_SIZE * bytes_per_value / GIB if kind != "realtime" else 0.0
    if weights == "tiny":
        core, vae, core_frame, encode_frame = (mm.tiny_fixed_gib * f, mm.tiny_fixed_gib * f,
                                               mm.tiny_per_frame_gib * f, mm.tiny_per_frame_gib * f)
    else:
        core, vae, core_frame, encode_frame = (mm.core_fixed_gib * f, mm.vae_weights_gib * f,
                                               mm.core_per_frame_gib * f, mm.encode_per_frame_gib * f)
    faces = 0.0 if landmark_backend in ("dlib", "boxes") else (
        mm.s3fd_weights_gib * f + mm.dwpose_gib + mm.s3fd_bytes_per_pixel * f * pixels / GIB)
    parsing = (mm.bisenet_weights_gib * f, mm.bisenet_per_image_gib * f)
    blend = mm.blend_bytes_per_pixel * pixels / GIB
    if kind == "lipsync":
        # pipeline.lipsync: faces before any model loads; then UNet + VAE + Whisper stay loaded, with the whisper
        # features and the latents, through encode, parsing and generate.
        resident = core + features + latents
        return {"faces": (faces, 0.0), "encode": (resident, encode_frame),
                "parsing": (resident + parsing[0], parsing[1]), "generate": (resident, core_frame + blend)}
    if kind == "avatar":
        # avatar.prepare_avatar: faces; the VAE alone for encode (released after); BiSeNet alone for parsing.
        return {"faces": (faces, 0.0), "encode": (vae + latents, encode_frame), "parsing": parsing}
    # realtime (Avatar.generate): the three core models, the features of the clip, and the blend of full frames.
    return {"generate": (core + features, core_frame + blend)}


def plan(kind: str = "lipsync", report: GpuReport | None = None, config: Any = None, n_frames: int | None = None,
         frame_size: tuple[int, int] | None = None, weights: str = "full",
         memory_model: MemoryModel | None = None, *, source_frames: int | None = None) -> Plan:
    """Choose device, precision and batch size for a job from the GPU report and the memory model.

    - device: CUDA when torch can use a GPU, else the CPU; ``config.device`` overrides ("user override").
    - precision: fp16 on CUDA (the T4 has no fast bf16, and fp16 is what the official realtime path runs),
      fp32 below compute capability 5.3 and on the CPU (fp16 asked on the CPU falls back to fp32, with a
      warning); ``config.fp16`` overrides.
    - batch size: the largest batch whose worst stage fits the budget (see the module docstring), snapped by
      :func:`snap_batch`, at most the kind's cap (32 offline and avatar, 20 realtime, 4 on the CPU) and at most
      ``n_frames``; ``config.batch_size`` overrides, with a warning when the model predicts it does not fit.

    Args:
        kind: ``"lipsync"`` (offline job), ``"avatar"`` (avatar preparation) or ``"realtime"`` (generation from
            a prepared avatar).
        report: A :class:`GpuReport`; None calls :func:`report`. Tests pass fakes built directly.
        config: An :class:`~nbhelpers.config.InferenceConfig` whose non-None ``device``/``fp16``/``batch_size``
            are user overrides, and whose other fields :attr:`Plan.config` keeps; None for the defaults.
        n_frames: Frames of the job: output frames (audio seconds x 25) for lipsync/realtime, source frames for
            avatar; None when not known yet.
        frame_size: (H, W) of the video frames, pixels; None assumes 1080x1920 (:data:`DEFAULT_FRAME_SIZE`).
        weights: ``"full"`` (the official models) or ``"tiny"`` (test models).
        memory_model: Constants of the memory model (default :data:`MEMORY_MODEL`).
        source_frames: Source frames of a lipsync job (25 fps), for the CPU time estimate (:func:`cpu_seconds`);
            None assumes one source frame per output frame.

    Returns:
        A :class:`Plan`; ``plan(...).config`` is the filled :class:`~nbhelpers.config.InferenceConfig`.

    Raises:
        InputError: Unknown ``kind``/``weights``, a bad ``frame_size`` or ``n_frames``, or ``config`` not an
            InferenceConfig.
        NoGpuError: ``config.device`` asks for CUDA but no CUDA GPU is usable.

    Warns:
        PlanWarning: For each entry of ``Plan.warnings`` (CPU speed, fp16 on the CPU, a tight budget).

    Source: batch defaults 8 offline and 20 realtime (``inference.py:266``, ``realtime_inference.py:331``);
    fp16 casts (``inference.py:53-56``, ``realtime_inference.py:366-368``).
    """
    from .config import InferenceConfig

    if kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(map(repr, KINDS))}; got {kind!r}.")
    if weights not in WEIGHTS:
        raise InputError(f"weights must be 'full' or 'tiny'; got {weights!r}.")
    if config is None:
        config = InferenceConfig()
    elif not isinstance(config, InferenceConfig):
        raise InputError(f"config must be an InferenceConfig or None; got {type(config).__name__}. "
                         "Build one with nbhelpers.InferenceConfig(...).")
    if n_frames is not None:
        if isinstance(n_frames, bool) or not isinstance(n_frames, numbers.Integral) or n_frames < 0:
            raise InputError(f"n_frames must be a whole number >= 0 or None; got {n_frames!r}.")
        n_frames = int(n_frames)
    if frame_size is None:
        frame_size = DEFAULT_FRAME_SIZE
        size_note = f"{frame_size[0]}x{frame_size[1]} frames assumed (frame size not given)"
    else:
        try:
            values = tuple(frame_size)
        except TypeError:
            values = ()
        if len(values) != 2 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0
                                       for v in values):
            raise InputError(f"frame_size must be (height, width) in pixels, two positive integers; got "
                             f"{frame_size!r}.")
        frame_size = (int(values[0]), int(values[1]))
        size_note = f"{frame_size[0]}x{frame_size[1]} frames"
    mm = memory_model or MEMORY_MODEL
    rep = report if report is not None else _read_report()
    reasons: dict[str, str] = {}
    notes: list[str] = []

    # 1. Device.
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
    on_cuda = device.startswith("cuda")
    on_cpu = device == "cpu"

    # 2. Precision.
    cc = rep.compute_capability
    if on_cuda:
        if config.fp16 is not None:
            fp16 = bool(config.fp16)
            reasons["fp16"] = f"user override ({'fp16' if fp16 else 'fp32'})"
        elif cc is not None and tuple(cc) < tuple(mm.fp16_min_capability):
            fp16 = False
            reasons["fp16"] = (f"fp32: compute capability {cc[0]}.{cc[1]} has no native half arithmetic "
                               f"(fp16 needs {mm.fp16_min_capability[0]}.{mm.fp16_min_capability[1]} or newer)")
        else:
            fp16 = True
            cc_text = f"compute capability {cc[0]}.{cc[1]}" if cc else "compute capability unknown"
            reasons["fp16"] = (f"fp16 on CUDA ({cc_text}): halves weights and activations and is what the official "
                               "realtime path runs; bf16 is not used, the T4 (7.5) has no fast bf16")
    elif on_cpu:
        fp16 = False
        if config.fp16:
            reasons["fp16"] = "fp32: fp16 was asked but the device is the CPU, so it falls back to fp32"
            notes.append("fp16 was asked but the device is the CPU: fp16 falls back to fp32 (half-precision "
                         "convolutions on the CPU are slow or missing).")
        else:
            reasons["fp16"] = "fp32 on the CPU (half precision is slow or missing there)"
    else:
        fp16 = bool(config.fp16) if config.fp16 is not None else False
        reasons["fp16"] = ("user override" if config.fp16 is not None else
                           f"fp32 on {device} (no memory model for this device)")

    # 3. Batch size.
    stages = stage_memory(kind, fp16, frame_size, n_frames, weights, config.landmark_backend, mm)
    cap = {"lipsync": mm.cap_lipsync, "avatar": mm.cap_avatar, "realtime": mm.cap_realtime}[kind]
    budget: float | None = None
    precision = "fp16" if fp16 else "fp32"
    if on_cuda:
        budget, reasons["memory"] = _gpu_budget(rep, mm)
        auto, why = _fit_batch(stages, budget, cap, kind, precision, size_note)
    elif on_cpu:
        cap = mm.cap_cpu
        budget, auto, why = _cpu_batch(rep, stages, mm, kind, size_note)
        reasons["memory"] = (f"host RAM: {budget:.1f} GiB usable ({mm.cpu_ram_fraction:.0%} of "
                             f"{rep.host_ram_available_gib:.1f} GiB available)" if budget is not None else
                             "host RAM unknown")
        per = mm.cpu_seconds_per_frame_tiny if weights == "tiny" else mm.cpu_seconds_per_frame
        total = ""
        if n_frames:  # stage by stage (issue 14 item 11): latents and parsing count source frames, not output
            parts = cpu_seconds(kind, n_frames, source_frames, weights)
            frames = f"{n_frames} frames" + (f" from {min(n_frames, source_frames)} source frames"
                                             if kind == "lipsync" and source_frames is not None else "")
            total = (f"; {frames} take about {_duration(sum(parts.values()))} after face tracking ("
                     + ", ".join(f"{k} {_duration(v)}" for k, v in parts.items() if v) + ")")
        size = "with the tiny test models" if weights == "tiny" else "at full size"
        notes.append(f"Running on the CPU: about {per:g} s per frame {size} (2 cores, fp32){total}. "
                     f"Use a GPU runtime for real jobs (Colab: {COLAB_GPU_STEPS}).")
    else:
        auto, why = min(4, cap), f"{device} has no memory model: a conservative 4"
    if n_frames and auto > n_frames:
        auto, why = n_frames, f"{n_frames}: the whole job in one batch ({why})"
    if config.batch_size is not None:
        batch = int(config.batch_size)
        reasons["batch_size"] = f"user override ({batch}); the plan would choose {auto}: {why}"
        if n_frames and batch > n_frames:  # a batch is never longer than the job: say what is really used
            reasons["batch_size"] = (f"{n_frames}: user override ({batch}) is more than the job's {n_frames} "
                                     f"frames, so the whole job is one batch; the plan would choose {auto}: {why}")
            batch = n_frames
    else:
        batch = auto
        reasons["batch_size"] = why

    peaks = {name: a + b * batch for name, (a, b) in stages.items()}
    predicted = max(peaks.values()) if on_cuda else None
    if on_cuda and budget is not None:
        growing = {name: peak for name, peak in peaks.items() if stages[name][1] > 0}
        worst = max(growing, key=growing.get) if growing else None
        if worst is not None and growing[worst] > budget:
            need = growing[worst]
            if config.batch_size is not None and batch > 1:
                notes.append(f"batch_size {batch} (user override) is predicted to need {need:.2f} GiB in stage "
                             f"{worst!r}, above the {budget:.2f} GiB budget: out-of-memory is likely; the batch "
                             "will halve when it happens (no frame lost).")
            else:
                notes.append(f"Even batch {batch} is predicted to need {need:.2f} GiB in stage {worst!r}, above "
                             f"the {budget:.2f} GiB budget: out-of-memory is likely. Free GPU memory (close other "
                             "notebooks, restart the runtime) or use a larger GPU.")
        if "faces" in peaks and peaks["faces"] > budget:
            notes.append(f"Face detection on full {frame_size[0]}x{frame_size[1]} frames (S3FD at batch 1) is "
                         f"predicted to need {peaks['faces']:.2f} GiB, above the {budget:.2f} GiB budget: use "
                         "landmark_backend='dlib' or a smaller video.")
    if on_cpu and config.batch_size is not None:
        # issue 14 item 11: a user batch on the CPU is checked against host RAM as it is against GPU memory
        growing = {name: peak for name, peak in peaks.items() if stages[name][1] > 0}
        worst = max(growing, key=growing.get) if growing else None
        if budget is not None and worst is not None and growing[worst] > budget and batch > 1:
            notes.append(f"batch_size {batch} (user override) is predicted to need {growing[worst]:.1f} GiB of host "
                         f"RAM in stage {worst!r}, above the {budget:.1f} GiB usable: the job is likely to run out "
                         f"of memory. Leave the batch size out (the plan would choose {auto}).")
        elif batch > mm.cap_cpu:
            notes.append(f"batch_size {batch} (user override) is more than {mm.cap_cpu}: on the CPU a larger batch "
                         "is no faster, and progress shows later.")
    for note in notes:
        warnings.warn(note, PlanWarning, stacklevel=2)
    return Plan(kind=kind, device=device, fp16=fp16, batch_size=batch, weights=weights, frame_size=frame_size,
                n_frames=n_frames, budget_gib=budget, predicted_peak_gib=predicted, stage_peaks_gib=peaks,
                reasons=reasons, warnings=tuple(notes), base_config=config, gpu_name=rep.name if on_cuda else None,
                free_gib=rep.free_gib if on_cuda else None)


def _gpu_budget(rep: GpuReport, mm: MemoryModel) -> tuple[float | None, str]:
    if rep.free_gib is None:
        return None, "free GPU memory unknown"
    cached = max(0.0, rep.reserved_gib - rep.allocated_gib)
    usable = rep.free_gib + cached
    parts = [f"{rep.free_gib:.1f} GiB free"]
    if cached > 0.005:
        parts.append(f"+ {cached:.2f} GiB cached by this process")
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
    best, limiting = math.inf, None
    for name, (a, b) in stages.items():
        if b <= 0:
            continue
        fits = (budget - a) / b
        if fits < best:
            best, limiting = fits, name
    a, b = stages[limiting] if limiting else (0.0, 0.0)
    model = (f"stage {limiting!r} needs {a:.2f} GiB + {b:.3f} GiB per frame ({precision}, {size_note})"
             if limiting else "no stage grows with the batch")
    if best < 1:
        return 1, f"1: {model}; the {budget:.2f} GiB budget does not fit even one frame"
    if best >= cap:
        return cap, (f"{cap}: {model}; the {budget:.2f} GiB budget fits {int(best)} frames; capped at {cap} for "
                     f"{kind} (larger batches add memory and latency, not speed)")
    snapped = snap_batch(best)
    return snapped, (f"{snapped}: {model}; the {budget:.2f} GiB budget fits {int(best)} frames, snapped to "
                     f"{snapped} (1, 2 or a multiple of 4)")


def _cpu_batch(rep: GpuReport, stages: dict[str, tuple[float, float]], mm: MemoryModel, kind: str,
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
    shown = "no" if fits < 1 else ("more than 999" if fits > 999 else str(int(fits)))
    return budget, batch, (f"{batch}: fp32 on the CPU: stage {limiting!r} needs {a:.2f} GiB + {b:.3f} GiB per frame "
                           f"of host RAM ({size_note}); {budget:.1f} GiB usable fits {shown} frames; CPU batches "
                           f"are at most {cap} (a larger batch is no faster on the CPU)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# =====================================================================================================================
# Out-of-memory fallback
# =====================================================================================================================


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` is an out-of-memory error: torch's CUDA/MPS ``OutOfMemoryError`` (also raised by
    ``set_per_process_memory_fraction``), a RuntimeError saying "out of memory" or "CUBLAS_STATUS_ALLOC_FAILED",
    the CPU allocator's "can't allocate memory", or this package's :class:`~nbhelpers.errors.OutOfMemoryError`
    (so an inner :func:`batched` that failed at batch 1 makes an outer one halve).

    Args:
        exc: Any exception.

    Returns:
        Whether retrying with a smaller batch may succeed.

    Source: none (the official code has no out-of-memory handling; failure kind F13).
    """
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "CudaOutOfMemoryError"):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc).lower()
    return ("out of memory" in text or "cublas_status_alloc_failed" in text or "can't allocate memory" in text)


def batched(n_items: int, batch_size: int, step: Callable[[slice], T], *, stage: str = "batch",
            on_oom: Callable[[], None] | None = None) -> Iterator[tuple[slice, T]]:
    """Run ``step`` over ``range(n_items)`` in consecutive slices, halving the batch on out-of-memory.

    Items are processed strictly in order and each exactly once: when ``step(slice(i, i + b))`` raises an
    out-of-memory error (:func:`is_oom`), the failed call's references are dropped, the caches are emptied,
    ``b`` is halved and the *same* start ``i`` is retried, so no item is lost or reordered and nothing before
    ``i`` is recomputed. The batch that failed is halved (its real length: at the end of a stage, or when
    ``n_items < batch_size``, that is less than ``batch_size``), and the smaller size is kept for the rest of the
    stage (memory that ran out once is likely to run out again). Each halving emits a ``RuntimeWarning`` that says what happened.

    Args:
        n_items: Number of items (frames) to process, >= 0.
        batch_size: Initial items per call, >= 1.
        step: Called with a ``slice`` of item indices; returns that batch's result. It must not keep partial
            effects of a failed call (write results only from what it returns).
        stage: Stage name used in the warning (e.g. ``"generate"``).
        on_oom: Called after an out-of-memory error, outside the ``except`` block (so the failed call's tensors
            are already unreferenced), before retrying. Default: :func:`empty_cache` (``gc.collect()`` and
            ``torch.cuda.empty_cache()``).

    Yields:
        ``(slice, result)`` for each batch, in order. The loop does not keep a batch's result once the next
        batch starts; drop yours too (``del``) when it is large.

    Raises:
        InputError: ``n_items`` < 0 or ``batch_size`` < 1 (checked before the first call).
        OutOfMemoryError: When a batch of 1 still runs out of memory.

    Source: the official loop ``datagen`` batches in order with a fixed size (``utils.py:49-74``,
    ``inference.py:187-206``); the halving is ours (failure kind F13).
    """
    if isinstance(n_items, bool) or not isinstance(n_items, int) or n_items < 0:
        raise InputError(f"n_items must be a whole number >= 0; got {n_items!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number >= 1; got {batch_size!r}.")
    return _batched(n_items, batch_size, step, stage, on_oom)


def _batched(n_items: int, size: int, step: Callable[[slice], T], stage: str,
             on_oom: Callable[[], None] | None) -> Iterator[tuple[slice, T]]:
    start = 0
    while start < n_items:
        stop = min(start + size, n_items)
        failed = False
        try:
            result = step(slice(start, stop))
        except Exception as exc:  # noqa: BLE001 - re-raised unless it is an OOM
            if not is_oom(exc):
                raise
            failed = True
        if failed:
            # Outside the except block: the exception and its traceback (which holds the failed call's frames
            # and their tensors) are gone, so emptying the cache can return that memory.
            (on_oom or empty_cache)()
            tried = stop - start  # may be less than size at the end of the stage, or when n_items < batch_size
            if tried == 1:
                raise OutOfMemoryError(
                    f"{stage}: the GPU ran out of memory even at batch size 1 (item {start}). Free GPU memory "
                    "(close other notebooks, restart the runtime) or run on a larger GPU.")
            new_size = max(1, tried // 2)
            warnings.warn(f"{stage}: CUDA out of memory at batch size {tried} (items {start}-{stop - 1}); "
                          f"retrying from item {start} at batch size {new_size}, kept for the rest of the stage. "
                          "No frame is lost.", FallbackWarning, stacklevel=2)
            size = new_size
            continue
        yield slice(start, stop), result
        result = None  # do not hold batch k's output (GPU frames) while batch k+1 runs
        start = stop


# =====================================================================================================================
# Peak-memory discipline
# =====================================================================================================================

_PEAK_SEEN: dict[int, float] = {}  # device index -> largest max_memory_reserved seen before a reset (bytes)


def _cuda(device: Any = None):
    """(torch, device index) when CUDA is usable, else (None, None). Never raises."""
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None, None
    try:
        if not torch.cuda.is_available():
            return None, None
        if device is None:
            return torch, torch.cuda.current_device()
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if dev.type != "cuda":
            return None, None
        return torch, dev.index if dev.index is not None else torch.cuda.current_device()
    except Exception:  # noqa: BLE001
        return None, None


def empty_cache() -> None:
    """Run ``gc.collect()`` and return the caching allocator's unused blocks to the driver.

    ``torch.cuda.empty_cache()`` when CUDA is usable; a no-op on the CPU or without torch.

    Source: none (the official scripts keep every model loaded, quirk Q25).
    """
    gc.collect()
    torch, _ = _cuda()
    if torch is not None:
        torch.cuda.empty_cache()


_empty_cache = empty_cache  # the name batched() used first


def release(*objects: Any) -> float:
    """Give up the memory of models and tensors that a stage no longer needs, then empty the caches.

    A function cannot delete the caller's variables, so this empties the objects themselves: each
    ``torch.nn.Module`` is moved to the ``meta`` device (its weights are gone: load it again to reuse it), each
    tensor's storage is replaced by an empty one, lists/dicts/sets are emptied after their items are released,
    and the modules and tensors held by an object's attributes (e.g. a ``Models`` dataclass) are released one
    level deep. Then ``gc.collect()`` and ``torch.cuda.empty_cache()``. Still ``del`` your own names.

    Args:
        *objects: Modules, tensors, containers of them, or objects holding them; anything else is ignored.

    Returns:
        GiB returned to the driver (drop of ``torch.cuda.memory_reserved``), 0.0 on the CPU.

    Source: none (the official scripts keep every model loaded, quirk Q25).
    """
    torch, index = _cuda()
    before = torch.cuda.memory_reserved(index) if torch is not None else 0
    for obj in objects:
        _release_one(obj, depth=0)
    empty_cache()
    after = torch.cuda.memory_reserved(index) if torch is not None else 0
    return max(0, before - after) / GIB


def _release_one(obj: Any, depth: int) -> None:
    torch = sys.modules.get("torch")
    if obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if torch is not None:
        if isinstance(obj, torch.nn.Module):
            try:
                obj.to(device="meta")
            except Exception:  # noqa: BLE001 - modules that refuse .to(); gc may still free them
                pass
            return
        if isinstance(obj, torch.Tensor):
            try:
                with torch.no_grad():
                    obj.data = torch.empty(0, dtype=obj.dtype, device=obj.device)
            except Exception:  # noqa: BLE001
                pass
            return
    if depth > 1:
        return
    if isinstance(obj, (list, dict, set)):
        items = list(obj.values()) if isinstance(obj, dict) else list(obj)
        for item in items:
            _release_one(item, depth + 1)
        obj.clear()
        return
    if isinstance(obj, tuple):
        for item in obj:
            _release_one(item, depth + 1)
        return
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        for value in list(attrs.values()):
            _release_one(value, depth + 1)


@dataclass
class StageMemory:
    """Memory of one stage, filled when its :func:`memory_scope` exits.

    Attributes:
        stage: Stage name.
        peak_reserved_gib: ``torch.cuda.max_memory_reserved`` during the stage, GiB (0 on the CPU).
        peak_allocated_gib: ``torch.cuda.max_memory_allocated`` during the stage, GiB.
        reserved_after_gib: Reserved after the stage's release, GiB (what the next stage starts from).
        held: Objects registered with :meth:`hold`, released at exit.
    """

    stage: str
    peak_reserved_gib: float = 0.0
    peak_allocated_gib: float = 0.0
    reserved_after_gib: float = 0.0
    held: list[Any] = field(default_factory=list, repr=False)

    def hold(self, obj: T) -> T:
        """Register an object to be :func:`release`-d when the scope exits.

        Args:
            obj: A model, tensor, container of them, or an object holding them.

        Returns:
            ``obj`` itself, so that ``model = scope.hold(load(...))`` reads naturally.
        """
        self.held.append(obj)
        return obj

    def __str__(self) -> str:
        return (f"{self.stage}: peak {self.peak_reserved_gib:.2f} GiB reserved "
                f"({self.peak_allocated_gib:.2f} GiB allocated), {self.reserved_after_gib:.2f} GiB after release")


@contextmanager
def memory_scope(stage: str, device: Any = None) -> Iterator[StageMemory]:
    """Measure one stage's peak GPU memory and release what it held when it ends.

    On entry the peak counters are reset (the job's overall peak is kept for :func:`peak_memory`). On exit —
    also after an error — the objects registered with ``scope.hold(...)`` are released (:func:`release`),
    ``gc.collect()`` and ``torch.cuda.empty_cache()`` run, and the returned record is filled. Works on the CPU
    (all figures 0).

    >>> with memory_scope("faces") as scope:          # doctest: +SKIP
    ...     detector = scope.hold(load_s3fd(...))
    ...     boxes = detect(frames, detector)
    >>> print(scope)                                  # doctest: +SKIP

    Args:
        stage: Stage name.
        device: CUDA device (None: current).

    Yields:
        A :class:`StageMemory`, filled at exit.

    Source: none (the official scripts keep every model loaded, quirk Q25).
    """
    record = StageMemory(stage)
    torch, index = _cuda(device)
    if torch is not None:
        _remember_peak(torch, index)
        torch.cuda.reset_peak_memory_stats(index)
    try:
        yield record
    finally:
        if torch is not None:
            record.peak_reserved_gib = torch.cuda.max_memory_reserved(index) / GIB
            record.peak_allocated_gib = torch.cuda.max_memory_allocated(index) / GIB
        held, record.held = record.held, []
        release(*held)
        del held
        if torch is not None:
            record.reserved_after_gib = torch.cuda.memory_reserved(index) / GIB


def _remember_peak(torch: Any, index: int) -> None:
    _PEAK_SEEN[index] = max(_PEAK_SEEN.get(index, 0), torch.cuda.max_memory_reserved(index))


@dataclass(frozen=True)
class PeakMemory:
    """Peak GPU memory of this process so far.

    Attributes:
        reserved_gib: Largest ``torch.cuda.max_memory_reserved`` seen (across :func:`memory_scope` resets), GiB.
        allocated_gib: ``torch.cuda.max_memory_allocated`` since the last reset, GiB.
        context_gib: Estimate of this process's CUDA context (plus lazily loaded kernels), GiB: ``total - free
            - reserved`` now, less what other processes the driver lists hold; None on the CPU.
    """

    reserved_gib: float = 0.0
    allocated_gib: float = 0.0
    context_gib: float | None = None

    @property
    def total_gib(self) -> float:
        """``reserved_gib + context_gib``: what the GPU gave this process at its peak, GiB."""
        return self.reserved_gib + (self.context_gib or 0.0)

    def __str__(self) -> str:
        ctx = "unknown" if self.context_gib is None else f"{self.context_gib:.2f} GiB"
        return (f"peak {self.reserved_gib:.2f} GiB reserved + context {ctx} = {self.total_gib:.2f} GiB "
                f"({self.allocated_gib:.2f} GiB allocated)")


def peak_memory(device: Any = None, others_gib: float | None = None) -> PeakMemory:
    """Read this process's peak GPU memory, for benchmarks: max reserved + an estimate of the CUDA context.

    Args:
        device: CUDA device (None: current).
        others_gib: GiB other processes hold on the device, subtracted from the context estimate; None reads
            the driver's list (NVML or nvidia-smi) when available, else assumes 0.

    Returns:
        A :class:`PeakMemory` (all zeros and ``context_gib=None`` without CUDA).

    Source: none (benchmark helper; DESIGN.md's peaks are ``max_memory_reserved``).
    """
    torch, index = _cuda(device)
    if torch is None:
        return PeakMemory()
    _remember_peak(torch, index)
    reserved = torch.cuda.memory_reserved(index)
    free, total = torch.cuda.mem_get_info(index)
    if others_gib is None:
        info = _driver_info(None, index, [])
        others_gib = sum(p.used_gib or 0.0 for p in info.get("processes", ()))
    context = max(0.0, (total - free - reserved) / GIB - others_gib)
    return PeakMemory(reserved_gib=_PEAK_SEEN[index] / GIB,
                      allocated_gib=torch.cuda.max_memory_allocated(index) / GIB, context_gib=context)


def reset_peak(device: Any = None) -> None:
    """Forget the peaks so far (torch's counters and the one :func:`peak_memory` keeps across scopes).

    Args:
        device: CUDA device (None: current); nothing happens without CUDA.

    Source: none (benchmark helper).
    """
    torch, index = _cuda(device)
    if torch is not None:
        _PEAK_SEEN.pop(index, None)
        torch.cuda.reset_peak_memory_stats(index)


def cast_and_move(module: Any, device: Any, dtype: Any = None) -> Any:
    """Move a model to ``device`` and cast it to ``dtype``, tensor by tensor, never holding a full extra copy.

    Each parameter and buffer is converted on its own (``nn.Module._apply``, as ``Module.to`` does), so at most
    one tensor exists twice at any moment. The cast runs on the CPU side: a tensor going from the CPU (or a
    memory-mapped checkpoint) to the GPU is cast there first and then copied, so the GPU never holds fp32 weights
    of an fp16 model (the official ``.to(device)`` then ``.half()`` holds all 3.7 GiB of fp32 weights on the GPU
    first), and host RAM never holds a second full copy either. A tensor going to the CPU is copied first and
    cast there; GPU-to-GPU, a narrowing cast runs before the copy and a widening one after. Only floating-point
    tensors change dtype (integer buffers such as position ids keep theirs). It calls ``nn.Module._apply``
    directly, so the warnings that diffusers and transformers add to their ``.to`` overrides are not triggered.

    Args:
        module: A ``torch.nn.Module`` (changed in place).
        device: Target device (``"cuda"``, ``"cuda:0"``, ``"cpu"``, a ``torch.device``).
        dtype: Target floating dtype (``torch.float16``, ``torch.float32``), or None to keep each tensor's.

    Returns:
        ``module`` (the same object, training/eval mode unchanged), on ``device`` in ``dtype``.

    Raises:
        InputError: ``module`` is not a ``torch.nn.Module`` or ``dtype`` is not a floating dtype.

    Source: the official code moves to the GPU and then calls ``.half()`` (``inference.py:53-56``); this avoids
    the fp32 copy on the GPU (failure kind F13). ``nbhelpers.models`` loads the same way (per-tensor ``.to``).
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise InputError(f"module must be a torch.nn.Module; got {type(module).__name__}.")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InputError(f"dtype must be a floating torch dtype (torch.float16, torch.float32) or None; got "
                         f"{dtype!r}.")
    target = torch.device(device)

    def convert(t):
        want = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        if want == t.dtype:
            return t.to(device=target)
        cast_first = t.device.type == "cpu" or (
            target.type != "cpu" and torch.finfo(want).bits < torch.finfo(t.dtype).bits)
        if cast_first:
            return t.to(dtype=want).to(device=target)
        return t.to(device=target).to(dtype=want)

    with torch.no_grad():
        module._apply(convert)
    return module
