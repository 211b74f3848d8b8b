"""The memory and time model: every constant the planner uses, with its source.

A stage's peak GPU memory is ``fixed + per_frame * batch`` GiB (:func:`stage_memory`); stages run one after
another, so a job's peak is the largest stage's. lipsync streams its clip in pieces, so every model, the whisper
features and the latents stay resident: its ``faces`` stage adds S3FD's activations on one full frame, ``encode``
the VAE encode per frame, ``parsing`` BiSeNet per frame, ``generate`` UNet + decode + blend (+ a restorer) per
frame. avatar runs faces, then the VAE alone, then BiSeNet alone; realtime and clip only ``generate``, with the
core models and the features resident. fp32 doubles weights and activations (not the blend). The budget is
``(free + cached + models already loaded - workspace [- context]) * (1 - safety_fraction)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from ..constants import AUDIO_TOKENS, LATENT_CHANNELS, LATENT_SIZE, WHISPER_DIM
from ..errors import InputError

T = TypeVar("T")

GIB = 2**30  # bytes per GiB


@dataclass(frozen=True)
class MemoryModel:
    """The planner's constants, fp16 figures (times ``fp32_factor`` in fp32), each field's unit in its comment.

    Measured figures are in bench/RESULTS.md ("Memory by stage", "Face restoration", "Clip batch"); the rest are
    estimates that ``bench/memory.py`` checks. Why each batch cap: :data:`CAP_REASONS` (the CPU's 4: a larger batch
    is no faster on 2 cores)."""

    core_fixed_gib: float = 1.87  # intercept and slope (per frame) of the core's measured peaks 3.06 / 4.25 /
    core_per_frame_gib: float = 0.149  # 6.62 GiB at UNet + VAE-decode batch 8 / 16 / 32
    vae_weights_gib: float = 0.16  # sd-vae-ft-mse (84 M parameters)
    encode_per_frame_gib: float = 0.19  # VAE encode of one frame's masked + reference crops (measured)
    s3fd_weights_gib: float = 0.05  # S3FD (22 M parameters); estimate
    s3fd_bytes_per_pixel: float = 320.0  # S3FD activations per full-frame pixel, bytes (batch 1, quirk Q18); estimate
    dwpose_gib: float = 0.2  # DWPose in ONNX Runtime (weights + arena), fp32 whatever the plan; estimate
    bisenet_weights_gib: float = 0.03  # estimate
    bisenet_per_image_gib: float = 0.05  # activations per 512x512 crop; estimate
    blend_bytes_per_pixel: float = 12.0  # GPU paste-back per full-frame pixel, bytes (uint8 BGR x 4 float copies)
    context_gib: float = 0.4  # CUDA context; subtracted only when free memory was read outside torch
    workspace_gib: float = 0.5  # cuBLAS/cuDNN workspaces, lazily loaded kernels, allocator rounding
    safety_fraction: float = 0.10  # share of what remains that the plan leaves unused
    fp32_factor: float = 2.0  # fp32 / fp16 ratio of weights and activations
    tiny_fixed_gib: float = 0.05  # the tiny test models' peak
    tiny_per_frame_gib: float = 0.01  # and its growth per frame
    cap_lipsync: int = 32  # frames; the caps' reasons are in CAP_REASONS
    cap_avatar: int = 32
    cap_realtime: int = 20
    cap_clip: int = 64
    cap_cpu: int = 4
    cpu_ram_fraction: float = 0.75  # share of available host RAM a CPU plan may use
    fp16_min_capability: tuple[int, int] = (5, 3)  # oldest compute capability given fp16 (native half arithmetic)
    restore_gfpgan_per_frame_gib: float = 0.261  # what each face restorer adds to generate per frame, weights
    restore_restoreformer_per_frame_gib: float = 0.233  # included: GFPGAN v1.4 and RestoreFormer in bfloat16,
    restore_codeformer_per_frame_gib: float = 0.4575  # CodeFormer always in float32
    bf16_min_capability: tuple[int, int] = (8, 0)  # GFPGAN/RestoreFormer in bfloat16 from here (restore.run_dtype)


MEMORY_MODEL = MemoryModel()

# Why each kind's batch stops at its cap in MemoryModel, quoted by the plan's reasons.
_OFFLINE_CAP = ("at about 0.8 TFLOP per frame (UNet + decode) a batch of 8-16 already keeps a T4 busy and the CPU "
                "side (blend, encode) is the wall, so larger batches add memory, first-output latency and "
                "OOM-retry cost for no speed")
CAP_REASONS = {
    "lipsync": _OFFLINE_CAP,
    "avatar": f"as the offline job: {_OFFLINE_CAP}",
    "realtime": ("the official realtime default (realtime_inference.py:331): 0.8 s of video per batch, and the first "
                 "frame comes after one batch"),
    "clip": ("nothing waits for its first frame, and the UNet and decode took 3.3 ms per frame at 64 against 4.4 "
             "at 20 and 4.1 at 32 (bench/RESULTS.md, \"Clip batch\")"),
}


@dataclass(frozen=True)
class CpuTimes:
    """Seconds of work per stage on a 2-core CPU (fp32), for the estimate of a CPU job's time."""

    fixed_s: float  # once per job: loading the models, whisper on the audio, the encoder's start and end
    latents_s: float  # VAE encode of one source frame's masked and reference crops
    parsing_s: float  # face parsing and blend-mask preparation of one source frame (full-size BiSeNet in tiny too)
    generate_s: float  # UNet + VAE decode + CPU blend of one output frame


@dataclass(frozen=True)
class FaceCpuTimes:
    """Seconds of face tracking on a 2-core CPU (fp32) for one backend: ``per_frame_s + per_mpix_s * megapixels`` per
    source frame (the detector runs on the full frame, the landmark model at its fixed input), plus ``load_s`` once."""

    load_s: float
    per_frame_s: float
    per_mpix_s: float

    def seconds(self, frame_size: tuple[int, int]) -> float:
        """Seconds per source frame of size (H, W) pixels."""
        return self.per_frame_s + self.per_mpix_s * frame_size[0] * frame_size[1] / 1e6


#: Per-stage CPU seconds by ``bench/cpu_estimate.py --weights`` (full, tiny), its fastest runs on 2 free cores
#: (bench/RESULTS.md, "CPU time estimate"); other work on the same cores makes jobs 2-4x slower.
CPU_TIMES = {
    "full": CpuTimes(fixed_s=8.0, latents_s=9.0, parsing_s=0.33, generate_s=15.0),
    "tiny": CpuTimes(fixed_s=5.0, latents_s=0.33, parsing_s=0.33, generate_s=0.28),
}

#: Face tracking on the CPU by landmark backend (the tiny tree's S3FD and DWPose are full size, so one figure for
#: both weights): ``bench/cpu_estimate.py --backend dwpose`` and ``--backend dlib`` (bench/RESULTS.md, "CPU time
#: estimate"); dwpose-onnx and mmpose run the same networks as dwpose, and boxes runs no detector.
FACE_CPU_TIMES = {
    "dwpose": FaceCpuTimes(load_s=1.0, per_frame_s=0.4, per_mpix_s=7.0),
    "dwpose-onnx": FaceCpuTimes(load_s=1.0, per_frame_s=0.4, per_mpix_s=7.0),
    "mmpose": FaceCpuTimes(load_s=1.0, per_frame_s=0.4, per_mpix_s=7.0),
    "dlib": FaceCpuTimes(load_s=0.9, per_frame_s=0.0, per_mpix_s=0.1),
    "boxes": FaceCpuTimes(load_s=0.0, per_frame_s=0.0, per_mpix_s=0.0),
}


def face_cpu_times(landmark_backend: str = "auto") -> FaceCpuTimes:
    """The face-tracking figures of a landmark backend name (``"auto"`` and unknown names: ``"dwpose"``)."""
    return FACE_CPU_TIMES.get(landmark_backend, FACE_CPU_TIMES["dwpose"])


def cpu_seconds(kind: str = "lipsync", n_frames: int = 0, source_frames: int | None = None,
                weights: str = "full", *, landmark_backend: str = "auto",
                frame_size: tuple[int, int] | None = None) -> dict[str, float]:
    """The CPU time of a job of ``kind`` (``"clip"`` counted as realtime), ``{stage: seconds}`` for the stages that run.

    ``n_frames`` are output frames (audio seconds x 25), or source frames for an avatar; a lipsync job tracks, encodes
    and parses ``min(n_frames, source_frames)`` source frames (``source_frames`` None: ``n_frames``) of
    ``frame_size`` (H, W) pixels (None: :data:`DEFAULT_FRAME_SIZE`). Raises InputError: unknown ``kind`` or ``weights``.
    """
    check_kind(kind, weights)
    kind = "realtime" if kind == "clip" else kind  # the same work, only its batch cap differs
    t = CPU_TIMES[weights]
    f = face_cpu_times(landmark_backend)
    per_face = f.seconds(frame_size or DEFAULT_FRAME_SIZE)
    n = max(0, int(n_frames or 0))
    if kind == "realtime":
        return {"models": t.fixed_s, "generate": n * t.generate_s}
    used = n if kind == "avatar" or source_frames is None else min(n, max(0, int(source_frames)))
    parts = {"models": (t.fixed_s / 2 if kind == "avatar" else t.fixed_s) + (f.load_s if used else 0.0),
             "faces": used * per_face, "latents": used * t.latents_s, "parsing": used * t.parsing_s}
    if kind == "lipsync":
        parts["generate"] = n * t.generate_s
    return parts


def cpu_frame_seconds(kind: str = "lipsync", weights: str = "full", landmark_backend: str = "auto",
                      frame_size: tuple[int, int] | None = None) -> float:
    """Seconds per frame of a long CPU job: :func:`cpu_seconds` for one frame, without the model loading.
    Raises InputError: unknown ``kind`` or ``weights``."""
    parts = cpu_seconds(kind, 1, None, weights, landmark_backend=landmark_backend, frame_size=frame_size)
    return sum(v for k, v in parts.items() if k != "models")

#: Frame size (H, W) in pixels assumed when ``plan`` is not told the frame size: full HD, so the blend term is
#: not underestimated for common inputs.
DEFAULT_FRAME_SIZE = (1080, 1920)


KINDS = ("lipsync", "avatar", "realtime", "clip")  # clip: realtime's stages, cap_clip
WEIGHTS = ("full", "tiny")


def check_kind(kind: str, weights: str) -> None:
    """Raise :class:`InputError` for a ``kind`` not in :data:`KINDS` or ``weights`` not in :data:`WEIGHTS`."""
    if kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(map(repr, KINDS))}; got {kind!r}.")
    if weights not in WEIGHTS:
        raise InputError(f"weights must be 'full' or 'tiny'; got {weights!r}.")


def restore_per_frame_gib(restore: str | None, bf16: bool = True, memory_model: MemoryModel | None = None) -> float:
    """GiB per frame of the batch that a face restorer (``InferenceConfig.restore``, or None: 0) adds to ``generate``;
    GFPGAN's and RestoreFormer's times ``fp32_factor`` unless ``bf16``, CodeFormer's always (it runs in float32).
    Raises InputError: an unknown restorer name."""
    if restore is None:
        return 0.0
    mm = memory_model or MEMORY_MODEL
    per = {"gfpgan": mm.restore_gfpgan_per_frame_gib, "restoreformer": mm.restore_restoreformer_per_frame_gib,
           "codeformer": mm.restore_codeformer_per_frame_gib}.get(restore)
    if per is None:
        raise InputError(f"restore must be 'gfpgan', 'restoreformer', 'codeformer' or None; got {restore!r}.")
    return per if bf16 or restore == "codeformer" else per * mm.fp32_factor


def stage_memory(kind: str, fp16: bool = True, frame_size: tuple[int, int] = DEFAULT_FRAME_SIZE,
                 n_frames: int | None = None, weights: str = "full", landmark_backend: str = "auto",
                 memory_model: MemoryModel | None = None, restore: str | None = None,
                 restore_bf16: bool = True) -> dict[str, tuple[float, float]]:
    """The stages of a job, ``{stage: (fixed GiB, GiB per frame of the batch)}`` in the order they run (module doc).

    ``frame_size`` is (H, W) of the full frames, pixels; ``n_frames`` (or None) adds whisper features and latents;
    the ``landmark_backend`` ``"dlib"`` and ``"boxes"`` use no GPU face models; ``restore`` (or None) adds
    :func:`restore_per_frame_gib` (``restore_bf16``: GFPGAN / RestoreFormer in bfloat16) to ``generate``.
    Raises InputError: an unknown ``restore`` name.
    Source: docs/official-behaviour.md §0 and §6 (stage order); S3FD at batch 1 on full frames (quirk Q18)."""
    mm = memory_model or MEMORY_MODEL
    kind = "realtime" if kind == "clip" else kind  # the same stages, only its batch cap differs
    f = 1.0 if fp16 else mm.fp32_factor
    bytes_per_value = 2 if fp16 else 4
    pixels = frame_size[0] * frame_size[1]
    n = n_frames or 0
    features = n * AUDIO_TOKENS * WHISPER_DIM * bytes_per_value / GIB if kind != "avatar" else 0.0
    latents = n * LATENT_CHANNELS * LATENT_SIZE * LATENT_SIZE * bytes_per_value / GIB if kind != "realtime" else 0.0
    core, vae, core_frame, encode_frame = (f * v for v in (
        (mm.tiny_fixed_gib, mm.tiny_fixed_gib, mm.tiny_per_frame_gib, mm.tiny_per_frame_gib) if weights == "tiny"
        else (mm.core_fixed_gib, mm.vae_weights_gib, mm.core_per_frame_gib, mm.encode_per_frame_gib)))
    gpu_faces = landmark_backend not in ("dlib", "boxes")
    face_models = mm.s3fd_weights_gib * f + mm.dwpose_gib if gpu_faces else 0.0
    faces = face_models + mm.s3fd_bytes_per_pixel * f * pixels / GIB if gpu_faces else 0.0
    parsing = (mm.bisenet_weights_gib * f, mm.bisenet_per_image_gib * f)
    blend = mm.blend_bytes_per_pixel * pixels / GIB
    restorer = restore_per_frame_gib(restore, restore_bf16, mm) if kind != "avatar" else 0.0
    if kind == "lipsync":  # every model, the features and the latents are resident in each stage (module doc)
        resident = core + features + latents + face_models + parsing[0]
        return {"faces": (resident + faces - face_models, 0.0), "encode": (resident, encode_frame),
                "parsing": (resident, parsing[1]), "generate": (resident, core_frame + blend + restorer)}
    if kind == "avatar":
        return {"faces": (faces, 0.0), "encode": (vae + latents, encode_frame), "parsing": parsing}
    return {"generate": (core + features, core_frame + blend + restorer)}
