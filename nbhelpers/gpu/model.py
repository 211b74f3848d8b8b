"""The memory and time model: every constant the planner uses, with its source.

The planner predicts the peak GPU memory of each stage of a job as ``fixed + per_frame * batch`` GiB
(:func:`stage_memory`) and picks the largest batch whose worst stage fits the budget. Stages run one after another,
so the job's peak is the maximum over stages, not their sum:

=========  ========  ========================================================  ===============================
kind       stage     fixed part                                                per frame of the batch
=========  ========  ========================================================  ===============================
lipsync    faces     resident + S3FD activations of one full frame             0 (batch 1, full frames)
lipsync    encode    resident: core weights, whisper features, latents, face   VAE encode (masked + reference)
                     models, BiSeNet weights (the job streams its pieces)
lipsync    parsing   resident                                                  BiSeNet activations at 512²
lipsync    generate  resident                                                  UNet + decode + blend (+ restorer)
avatar     faces     S3FD + DWPose + S3FD activations                          0
avatar     encode    VAE weights + latents (the VAE alone)                     VAE encode
avatar     parsing   BiSeNet weights (alone)                                   BiSeNet activations
realtime   generate  core weights + whisper features                           UNet + decode + blend (+ restorer)
=========  ========  ========================================================  ===============================

fp32 multiplies weights and activations by :attr:`MemoryModel.fp32_factor`; the blend term does not change. The
budget is ``(free + cached by this process + models already loaded - workspace [- context]) * (1 -
safety_fraction)``, so a later job on the same pipeline gets the plan of the first.
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
    """The planner's constants, one table: GiB = 2**30 bytes, fp16 figures (times ``fp32_factor`` in fp32).

    Measured figures are in bench/RESULTS.md ("Memory by stage", "Face restoration", "Clip batch"); the others are
    estimates that ``bench/memory.py`` checks. Try other values with :func:`dataclasses.replace`.

    Attributes:
        core_weights_gib: UNet + VAE + Whisper weights, GiB (measured).
        core_fixed_gib: Fixed part of the core's peak (weights + buffers), GiB: the intercept of the measured peaks
            3.06 / 4.25 / 6.62 GiB at batch 8 / 16 / 32.
        core_per_frame_gib: Growth of the core's peak per frame of a UNet + VAE-decode batch, GiB/frame: that line's
            slope (VAE decode of the 256x256 crops dominates).
        vae_weights_gib: sd-vae-ft-mse weights (84 M parameters), GiB.
        encode_per_frame_gib: VAE encode of one frame's masked + reference crops, GiB/frame (measured).
        s3fd_weights_gib: S3FD weights (22 M parameters), GiB; estimate.
        s3fd_bytes_per_pixel: S3FD activations per pixel of the full frame (batch 1, quirk Q18), bytes; estimate (two
            64-channel maps of VGG16's first block plus the input).
        dwpose_gib: DWPose through ONNX Runtime (weights + arena at 288x384), GiB, fp32 whatever the plan; estimate.
        bisenet_weights_gib: BiSeNet weights, GiB; estimate.
        bisenet_per_image_gib: BiSeNet activations per 512x512 crop, GiB/image; estimate.
        blend_bytes_per_pixel: GPU paste-back per full-frame pixel, bytes: 3 (uint8 BGR) x 4 float intermediates
            (frame, resized crop, mask, result); the same in every precision.
        context_gib: CUDA context of a process, GiB; subtracted only when free memory was read outside torch.
        workspace_gib: Kept free for cuBLAS/cuDNN workspaces, lazily loaded kernels and allocator rounding, GiB.
        safety_fraction: Fraction of what remains that the plan leaves unused (fragmentation, a second notebook).
        fp32_factor: fp32 / fp16 ratio of weights and activations.
        tiny_fixed_gib: Fixed part of the tiny test models' peak, GiB.
        tiny_per_frame_gib: Per-frame part of the tiny test models' peak, GiB/frame.
        cap_lipsync: Largest offline batch, frames: at about 0.8 TFLOP per frame (UNet + decode) a batch of 8-16
            already keeps a T4 busy and the CPU side (blend, encode) is the wall, so larger batches add memory,
            first-output latency and OOM-retry cost for no speed.
        cap_avatar: Largest batch of avatar preparation (encode, parsing), frames, as ``cap_lipsync``.
        cap_realtime: Largest realtime batch, frames: the official default (realtime_inference.py:331), 0.8 s of
            video, so the first frame comes after one batch.
        cap_clip: Largest batch of a whole clip from a prepared avatar into a file (``Avatar.generate``, the batch
            runner), frames: nothing waits for its first frame, and the UNet and decode of a 10 s clip took 3.3 ms
            per frame at 64 against 4.4 at 20 and 4.1 at 32 ("Clip batch").
        cap_cpu: Batch on the CPU, frames: a larger one is no faster on 2 cores and shows progress later.
        cpu_ram_fraction: Share of available host RAM a CPU plan may use for models and activations.
        fp16_min_capability: Oldest compute capability given fp16 by default (native half arithmetic).
        restore_gfpgan_per_frame_gib: What the GFPGAN v1.4 face restorer adds to the generate stage per frame in
            bfloat16, weights included, GiB/frame (the peak it added at batch 20, "Face restoration").
        restore_restoreformer_per_frame_gib: The same for RestoreFormer in bfloat16.
        restore_codeformer_per_frame_gib: The same for CodeFormer, always in float32
            (:data:`nbhelpers.restore.FLOAT32_ONLY`).
        bf16_min_capability: Oldest compute capability on which GFPGAN and RestoreFormer run in bfloat16
            (:func:`nbhelpers.restore.run_dtype`); elsewhere they run in float32 and their figure is multiplied by
            ``fp32_factor``.
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
    cap_clip: int = 64
    cap_cpu: int = 4
    cpu_ram_fraction: float = 0.75
    fp16_min_capability: tuple[int, int] = (5, 3)
    restore_gfpgan_per_frame_gib: float = 0.261
    restore_restoreformer_per_frame_gib: float = 0.233
    restore_codeformer_per_frame_gib: float = 0.4575
    bf16_min_capability: tuple[int, int] = (8, 0)


MEMORY_MODEL = MemoryModel()


@dataclass(frozen=True)
class CpuTimes:
    """Seconds of work per stage on a 2-core CPU (fp32), for the estimate of a CPU job's time.

    Face tracking, latents and parsing run once per source frame used, generation once per output frame, and the
    model loading once per job. Face tracking depends on the landmark backend: see :data:`FACE_CPU_TIMES`.

    Attributes:
        fixed_s: Once per job: loading the UNet, VAE, whisper and BiSeNet, whisper on the audio, starting and
            finishing the encoder, seconds.
        latents_s: VAE encode of one source frame's masked and reference crops, seconds per frame.
        parsing_s: Face parsing and blend-mask preparation of one source frame, seconds per frame (the tiny tree
            keeps BiSeNet's full architecture).
        generate_s: UNet + VAE decode + CPU blend of one output frame, seconds per frame.
        source: Where the figures come from.
    """

    fixed_s: float
    latents_s: float
    parsing_s: float
    generate_s: float
    source: str = ""


@dataclass(frozen=True)
class FaceCpuTimes:
    """Seconds of face tracking on a 2-core CPU (fp32) for one landmark backend.

    Per source frame: ``per_frame_s + per_mpix_s * megapixels`` (the detector runs on the full frame; DWPose runs at
    its fixed 288x384 input).

    Attributes:
        load_s: Building the backend, once per job, seconds.
        per_frame_s: Landmarks of one frame, seconds per frame.
        per_mpix_s: The face detector on one full frame, seconds per megapixel (10**6 pixels).
        source: Where the figures come from.
    """

    load_s: float
    per_frame_s: float
    per_mpix_s: float
    source: str = ""

    def seconds(self, frame_size: tuple[int, int]) -> float:
        """Seconds per source frame of size (H, W) pixels."""
        return self.per_frame_s + self.per_mpix_s * frame_size[0] * frame_size[1] / 1e6


#: Per-stage CPU seconds for ``"full"`` and ``"tiny"`` weights: the fastest runs of ``bench/cpu_estimate.py`` on
#: 2 free cores (bench/RESULTS.md, "CPU time estimate"); other work on the same cores makes jobs 2-4x slower.
CPU_TIMES = {
    "full": CpuTimes(fixed_s=8.0, latents_s=9.0, parsing_s=0.33, generate_s=15.0,
                     source="bench/cpu_estimate.py --weights full, 2 cores"),
    "tiny": CpuTimes(fixed_s=5.0, latents_s=0.33, parsing_s=0.33, generate_s=0.28,
                     source="bench/cpu_estimate.py, 2 cores"),
}

#: Face tracking on the CPU by landmark backend (the tiny tree's S3FD and DWPose are full size, so one figure for
#: both weights), from bench/RESULTS.md, "CPU time estimate"; dwpose-onnx and mmpose run the same networks as dwpose.
FACE_CPU_TIMES = {
    "dwpose": FaceCpuTimes(load_s=1.0, per_frame_s=0.4, per_mpix_s=7.0,
                           source="bench/cpu_estimate.py --backend dwpose, 2 cores"),
    "dwpose-onnx": FaceCpuTimes(load_s=1.0, per_frame_s=0.4, per_mpix_s=7.0, source="taken as dwpose"),
    "mmpose": FaceCpuTimes(load_s=1.0, per_frame_s=0.4, per_mpix_s=7.0, source="taken as dwpose"),
    "dlib": FaceCpuTimes(load_s=0.9, per_frame_s=0.0, per_mpix_s=0.1,
                         source="bench/cpu_estimate.py --backend dlib, 2 cores"),
    "boxes": FaceCpuTimes(load_s=0.0, per_frame_s=0.0, per_mpix_s=0.0, source="no detector runs"),
}


def face_cpu_times(landmark_backend: str = "auto") -> FaceCpuTimes:
    """The face-tracking figures of a landmark backend name (``"auto"`` and unknown names: ``"dwpose"``)."""
    return FACE_CPU_TIMES.get(landmark_backend, FACE_CPU_TIMES["dwpose"])


def cpu_seconds(kind: str = "lipsync", n_frames: int = 0, source_frames: int | None = None,
                weights: str = "full", times: CpuTimes | None = None, *, landmark_backend: str = "auto",
                frame_size: tuple[int, int] | None = None) -> dict[str, float]:
    """The CPU time of a job, stage by stage, in seconds.

    With ``u`` source frames used (lipsync: ``min(n_frames, source_frames)``; avatar: ``n_frames``), ``n`` output
    frames, ``t`` from :data:`CPU_TIMES` and ``f`` from :data:`FACE_CPU_TIMES`: ``models`` = ``t.fixed_s`` (avatar:
    half) + ``f.load_s`` (not realtime); ``faces``, ``latents``, ``parsing`` = ``u`` times ``f.seconds(frame_size)``,
    ``t.latents_s``, ``t.parsing_s`` (not realtime); ``generate`` = ``n * t.generate_s`` (not avatar).

    Args:
        kind: ``"lipsync"``, ``"avatar"``, ``"realtime"`` or ``"clip"`` (counted as realtime).
        n_frames: Output frames for lipsync/realtime (audio seconds x 25); source frames for avatar.
        source_frames: Source frames of a lipsync job (25 fps); None assumes at least ``n_frames``.
        weights: ``"full"`` or ``"tiny"``.
        times: Other figures (default ``CPU_TIMES[weights]``).
        landmark_backend: The backend that tracks the faces; ``"auto"`` counts as ``"dwpose"``.
        frame_size: (H, W) of the frames, pixels; None assumes :data:`DEFAULT_FRAME_SIZE`.

    Returns:
        ``{stage: seconds}`` for the stages that run (``models``, ``faces``, ``latents``, ``parsing``, ``generate``).

    Raises:
        InputError: Unknown ``kind`` or ``weights``.
    """
    if kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(map(repr, KINDS))}; got {kind!r}.")
    if weights not in WEIGHTS:
        raise InputError(f"weights must be 'full' or 'tiny'; got {weights!r}.")
    kind = "realtime" if kind == "clip" else kind  # the same work, only its batch cap differs
    t = times or CPU_TIMES[weights]
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

    Raises:
        InputError: Unknown ``kind`` or ``weights``.
    """
    parts = cpu_seconds(kind, 1, None, weights, landmark_backend=landmark_backend, frame_size=frame_size)
    return sum(v for k, v in parts.items() if k != "models")

#: Frame size (H, W) in pixels assumed when ``plan`` is not told the frame size: full HD, so the blend term is
#: not underestimated for common inputs.
DEFAULT_FRAME_SIZE = (1080, 1920)


KINDS = ("lipsync", "avatar", "realtime", "clip")  # clip: realtime's stages, cap_clip
WEIGHTS = ("full", "tiny")


def restore_per_frame_gib(restore: str | None, bf16: bool = True, memory_model: MemoryModel | None = None) -> float:
    """GiB per frame of the batch that a face restorer adds to the generate stage (0 without one).

    Args:
        restore: ``"gfpgan"``, ``"restoreformer"``, ``"codeformer"`` (``InferenceConfig.restore``) or None.
        bf16: Whether GFPGAN and RestoreFormer run in bfloat16 (:func:`nbhelpers.restore.run_dtype`); False
            multiplies their figure by ``fp32_factor``. CodeFormer runs in float32 either way.
        memory_model: Constants (default :data:`MEMORY_MODEL`).

    Raises:
        InputError: An unknown restorer name.
    """
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
    """The memory model's stages of a job: ``{stage: (fixed GiB, GiB per frame of the batch)}``, in the order they run.

    The table of stages is in the module docstring; a stage's peak at batch ``b`` is ``fixed + per_frame * b``.

    Args:
        kind: ``"lipsync"``, ``"avatar"``, ``"realtime"`` or ``"clip"`` (counted as realtime).
        fp16: Half precision (fp32 multiplies weights and activations by ``fp32_factor``).
        frame_size: (H, W) of the full frames, pixels.
        n_frames: Frames of the job (adds whisper features and latents), or None.
        weights: ``"full"`` or ``"tiny"``.
        landmark_backend: ``"dlib"`` and ``"boxes"`` use no GPU face models (the ``faces`` stage is 0).
        memory_model: Constants (default :data:`MEMORY_MODEL`).
        restore: The job's face restorer or None; its :func:`restore_per_frame_gib` joins the ``generate`` stage.
        restore_bf16: Whether GFPGAN / RestoreFormer run in bfloat16.

    Raises:
        InputError: An unknown ``restore`` name.

    Source: docs/official-behaviour.md §0 and §6 (stage order); S3FD at batch 1 on full frames (#q18).
    """
    mm = memory_model or MEMORY_MODEL
    kind = "realtime" if kind == "clip" else kind  # the same stages, only its batch cap differs
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
    gpu_faces = landmark_backend not in ("dlib", "boxes")
    face_models = mm.s3fd_weights_gib * f + mm.dwpose_gib if gpu_faces else 0.0
    faces = face_models + mm.s3fd_bytes_per_pixel * f * pixels / GIB if gpu_faces else 0.0
    parsing = (mm.bisenet_weights_gib * f, mm.bisenet_per_image_gib * f)
    blend = mm.blend_bytes_per_pixel * pixels / GIB
    restorer = restore_per_frame_gib(restore, restore_bf16, mm) if kind != "avatar" else 0.0
    if kind == "lipsync":
        # the job streams its clip in pieces, so every model, the features and the latents are resident in each stage
        resident = core + features + latents + face_models + parsing[0]
        return {"faces": (resident + faces - face_models, 0.0), "encode": (resident, encode_frame),
                "parsing": (resident, parsing[1]), "generate": (resident, core_frame + blend + restorer)}
    if kind == "avatar":
        return {"faces": (faces, 0.0), "encode": (vae + latents, encode_frame), "parsing": parsing}
    return {"generate": (core + features, core_frame + blend + restorer)}
