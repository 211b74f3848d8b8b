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
                                                                                    (+ face restorer, if any)
avatar     faces       as lipsync                                                   0
avatar     encode      VAE weights + latents (the VAE is loaded alone)              VAE encode
avatar     parsing     BiSeNet weights (alone)                                      BiSeNet activations
realtime   generate    core weights + whisper features                              UNet + VAE decode + blend
                                                                                    (+ face restorer, if any)
=========  ==========  ===========================================================  ===========================

The order follows ``pipeline.lipsync`` (faces, then models, features, encode, parsing, generate) and
``avatar.prepare_avatar`` (faces, VAE encode, release, parsing).
fp32 multiplies weights and activations by :attr:`MemoryModel.fp32_factor`; the blend term (full frames) does
not change with precision. The budget is
``(free + this process's cached + models already loaded - workspace [- context]) * (1 - safety_fraction)``: the
models a job's stages count that are already on the GPU (``plan(loaded_gib=...)``, from an earlier job on the same
pipeline) are missing from ``free``, so they are added back and a later job gets the plan of the first.

All constants are in :class:`MemoryModel` below (one table, with sources). ``bench/memory.py`` measures them on
the GPU machine; update the table from its output.

Layout (made by ``tools/split_modules.py`` from the former ``nbhelpers/gpu.py``; each submodule's docstring says
what it owns):

- :mod:`nbhelpers.gpu.allocator`: the CUDA allocator setting made when :mod:`nbhelpers.gpu` is imported.
- :mod:`nbhelpers.gpu.model`: the memory and time model: every constant the planner uses, with its source.
- :mod:`nbhelpers.gpu.device`: the device report: what this runtime has (GPU, memory, driver, versions, host RAM)
  and the checks on it.
- :mod:`nbhelpers.gpu.planner`: the planner: device, precision and batch size for a job, with the reason for each.
- :mod:`nbhelpers.gpu.memory`: peak-memory discipline: releasing models and caches, and measuring what each stage
  held.
- :mod:`nbhelpers.gpu.oom`: recovery from out-of-memory: stages run in ordered batches that halve on OOM without
  losing a frame.

Every name of the former module is importable from here, private ones included. The package is one namespace with
its submodules: setting a name on it (``monkeypatch.setattr(gpu, name, value)``) sets it in every submodule that
holds it, so code that looks the name up at call time sees the new value.
"""

# ruff: noqa: F401 (re-exports)  Made by tools/split_modules.py; edit the submodules, not this list.
from __future__ import annotations

import contextlib
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

from .. import _namespace
from ..constants import AUDIO_TOKENS, LATENT_CHANNELS, LATENT_SIZE, WHISPER_DIM
from ..errors import (
    FallbackWarning,
    InputError,
    MissingDependencyError,
    NbHelpersError,
    NbHelpersWarning,
    OutOfMemoryError,
)
from .allocator import ALLOCATOR_SETTING, prefer_expandable_segments
from .device import (
    COLAB_GPU_STEPS,
    NVIDIA_SMI_TIMEOUT_S,
    GpuProcess,
    GpuReport,
    NoGpuError,
    _device_index,
    _driver_info,
    _env_flag,
    _host_ram_gib,
    _in_colab,
    _no_cuda_message,
    _number,
    _nvidia_smi_info,
    _nvml,
    _nvml_free,
    _nvml_info,
    _nvml_query,
    _read_report,
    _read_torch_cuda,
    _run_nvidia_smi,
    _same_uuid,
    check_device,
    check_gpu,
    free_memory_by_index,
    report,
)
from .memory import (
    _CONSTANTS,
    _PEAK_SEEN,
    MODULE_SEARCH_DEPTH,
    PeakMemory,
    StageMemory,
    _cuda,
    _empty_cache,
    _release_one,
    _remember_peak,
    cast_and_move,
    device_constant,
    empty_cache,
    host_wait,
    memory_scope,
    module_bytes,
    peak_memory,
    release,
    reset_peak,
    to_device,
    usable_bytes,
)
from .model import (
    CPU_TIMES,
    DEFAULT_FRAME_SIZE,
    FACE_CPU_TIMES,
    GIB,
    KINDS,
    MEMORY_MODEL,
    WEIGHTS,
    CpuTimes,
    FaceCpuTimes,
    MemoryModel,
    T,
    cpu_frame_seconds,
    cpu_seconds,
    face_cpu_times,
    restore_per_frame_gib,
    stage_memory,
)
from .oom import _batched, batched, is_oom
from .planner import (
    _CAP_REASONS,
    _OFFLINE_CAP,
    Plan,
    PlanWarning,
    _cpu_batch,
    _cpu_time_note,
    _duration,
    _fit_batch,
    _gpu_budget,
    plan,
    snap_batch,
)

_SUBMODULES = ("allocator", "model", "device", "planner", "memory", "oom")

_namespace.share(__name__, _SUBMODULES)
