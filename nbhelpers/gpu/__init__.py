"""GPU planning: :func:`report` says what the runtime has, :func:`plan` chooses device, precision and batch size
with the reason for each, :func:`batched` runs a stage in ordered batches that halve on CUDA out-of-memory.
Nothing here imports torch at import; importing it sets the CUDA allocator (:func:`prefer_expandable_segments`)."""

from __future__ import annotations

from .device import COLAB_GPU_STEPS, GpuProcess, GpuReport, NoGpuError, check_device, free_memory_by_index
from .memory import (
    ALLOCATOR_SETTING,
    PeakMemory,
    StageMemory,
    cast_and_move,
    device_constant,
    empty_cache,
    host_wait,
    memory_scope,
    module_bytes,
    peak_memory,
    prefer_expandable_segments,
    release,
    reset_peak,
    to_device,
    usable_bytes,
)
from .model import (
    CPU_TIMES,
    FACE_CPU_TIMES,
    GIB,
    KINDS,
    MEMORY_MODEL,
    CpuTimes,
    FaceCpuTimes,
    MemoryModel,
    cpu_frame_seconds,
    cpu_seconds,
    face_cpu_times,
    restore_per_frame_gib,
    stage_memory,
)
from .oom import batched, is_oom
from .planner import Plan, PlanWarning, check_gpu, plan, report, snap_batch

__all__ = ["ALLOCATOR_SETTING", "COLAB_GPU_STEPS", "CPU_TIMES", "FACE_CPU_TIMES", "GIB", "KINDS", "MEMORY_MODEL",
           "CpuTimes", "FaceCpuTimes", "GpuProcess", "GpuReport", "MemoryModel", "NoGpuError", "PeakMemory", "Plan",
           "PlanWarning", "StageMemory", "batched", "cast_and_move", "check_device", "check_gpu", "cpu_frame_seconds",
           "cpu_seconds", "device_constant", "empty_cache", "face_cpu_times", "free_memory_by_index", "host_wait",
           "is_oom", "memory_scope", "module_bytes", "peak_memory", "plan", "prefer_expandable_segments", "release",
           "report", "reset_peak", "restore_per_frame_gib", "snap_batch", "stage_memory", "to_device", "usable_bytes"]
