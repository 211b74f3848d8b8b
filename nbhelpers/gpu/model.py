"""The memory and time model: every constant the planner uses, with its source.

Owns :class:`MemoryModel` (peak GPU memory per stage as ``fixed + per_frame * batch``, a face restorer's share
included: :func:`restore_per_frame_gib`),
:class:`CpuTimes` / :data:`CPU_TIMES`, :class:`FaceCpuTimes` / :data:`FACE_CPU_TIMES`, :func:`cpu_seconds` and
:func:`cpu_frame_seconds` (how long a CPU job takes), and
:func:`stage_memory` (the model evaluated for one stage and batch).

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from ..constants import AUDIO_TOKENS, LATENT_CHANNELS, LATENT_SIZE, WHISPER_DIM
from ..errors import InputError

T = TypeVar("T")

GIB = 2**30  # bytes per GiB


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
        cap_clip: Largest batch of a whole clip generated from a prepared avatar into a file
            (``Avatar.generate``, the batch runner), frames. 64: nothing waits for its first frame, and on an
            H200 the UNet and decode of a 10 s clip took 3.3 ms per frame at 64 against 4.4 at 20 and 4.1 at 32
            (bench/RESULTS.md, "Clip batch"), the UNet's cost per batch spread over more frames.
        cap_cpu: Batch on the CPU, frames. 4: on 2 cores the full UNet takes 2.9-3.6 s at batch 1 and 8-10 s at
            batch 4 (environment-notes), so larger batches do not help and progress shows later.
        cpu_ram_fraction: Share of available host RAM a CPU plan may use for models and activations.
        fp16_min_capability: Oldest compute capability given fp16 by default (5.3: native half arithmetic).
        restore_gfpgan_per_frame_gib: What the GFPGAN v1.4 face restorer adds to the generate stage per frame of
            the batch, in bfloat16, GiB/frame. Measured with bench/restore.py (bench/RESULTS.md, "Face
            restoration": H200, the avatar path, 576x768, batch 20): peak +5.22 GiB, 5.22 / 20 = 0.261. The
            weights (0.17 GiB) are inside that figure, not a fixed part: a restorer already loaded for an
            earlier job is then counted a second time, a few hundred MiB on the safe side.
        restore_restoreformer_per_frame_gib: The same for RestoreFormer in bfloat16: +4.66 GiB at batch 20, 0.233.
        restore_codeformer_per_frame_gib: The same for CodeFormer, which always runs in float32 (spandrel's
            CodeFormer fails in bfloat16, nbhelpers.restore.FLOAT32_ONLY): +9.15 GiB at batch 20, 0.4575.
        bf16_min_capability: Oldest compute capability on which GFPGAN and RestoreFormer run in bfloat16 (8.0,
            :func:`nbhelpers.restore.run_dtype`); below it, on the CPU and in an fp32 job they run in float32 and
            their figure is multiplied by ``fp32_factor``.
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
    """Seconds of work per stage on a 2-core CPU (fp32), for the planner's estimate of how long a CPU job takes.

    A job's time is not one figure per output frame: face tracking, the latents and the face parsing run once per
    *source* frame used (``min(output frames, source frames)``), generation once per output frame, and loading the
    models once (issue 14 item 11: 1.5 s per output frame predicted 75 s for a tiny-model job that took 207 s).
    Face tracking depends on the landmark backend, not on the weights: see :data:`FACE_CPU_TIMES`.

    Attributes:
        fixed_s: Once per job: loading the UNet, VAE, whisper and BiSeNet, whisper on the clip's audio (one
            30 s window for short clips), starting and finishing the encoder, seconds.
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


@dataclass(frozen=True)
class FaceCpuTimes:
    """Seconds of face tracking on a 2-core CPU (fp32) for one landmark backend.

    Per source frame: ``per_frame_s + per_mpix_s * megapixels`` (the face detector runs on the full frame, so its
    share grows with the pixels; the landmark model of the DWPose backends runs at its fixed 288x384 input).

    Attributes:
        load_s: Building the backend (its networks), once per job, seconds.
        per_frame_s: Landmarks of one frame, independent of the frame size, seconds per frame.
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


#: Per-stage CPU figures, ``"full"`` and ``"tiny"`` weights: wall seconds of each stage as ``ClipResult.timings``
#: gives them, measured with ``bench/cpu_estimate.py`` on the development machine, 2026-12-02 (2 cores, fp32, torch
#: 2 threads; the shared 576x768 clip cut to 10-40 source and 25-60 output frames; the table and conditions are in
#: bench/RESULTS.md, "CPU time estimate"). The figures are the fastest runs, when the two cores were free (load
#: about 2): other engineers' work sharing the cores (load 3.5-5.5) made the same jobs 2-4x slower, which no
#: per-frame figure can predict. Tiny: fixed 4.8-5.2 s (whisper load + audio 3.0, models 1.3, encoder 0.4-0.6),
#: latents 0.31-0.36, parsing 0.28-0.38 s per source frame, generate 0.23-0.41 s per output frame. Full (full-size
#: random weights, boxes given, 2 source / 3 output frames, batch 3; the fastest of three runs, at load 3.65, none
#: on free cores): fixed 5.4-10 s, latents 8.7-9.4 s per source frame, generate 14.7-15.7 s per output frame.
CPU_TIMES = {
    "full": CpuTimes(fixed_s=8.0, latents_s=9.0, parsing_s=0.33, generate_s=15.0,
                     source="bench/cpu_estimate.py --weights full, 2 cores, 2026-12-02 (bench/RESULTS.md)"),
    "tiny": CpuTimes(fixed_s=5.0, latents_s=0.33, parsing_s=0.33, generate_s=0.28,
                     source="bench/cpu_estimate.py, 2 cores, 2026-12-02 (bench/RESULTS.md)"),
}

#: Face tracking on the CPU by landmark backend (the same for tiny and full weights: the tiny tree's S3FD and
#: DWPose are full size). ``"auto"`` is taken as ``"dwpose"``, the automatic choice wherever torch runs and its
#: weights are there (:func:`nbhelpers.faces.get_backend`); the offline job passes the backend it really built.
#: Measured here, 2026-12-02, 2 cores, on 576x768 frames (0.44 megapixels): dwpose builds in 1.0 s, S3FD takes
#: 3.1 s per full frame at batch 1 (7.0 s per megapixel) and DWPose 0.3 s per frame, 3.5 s per frame in all
#: (the offline job: 35.7 s for 10 frames, backend built); dlib builds in 0.8 s and takes 0.044 s per frame
#: (0.1 s per megapixel; the job: 1.3 s for 10 frames, 2.7 s for 40). dwpose-onnx and mmpose run the same
#: networks and are taken as dwpose (not measured).
FACE_CPU_TIMES = {
    "dwpose": FaceCpuTimes(load_s=1.0, per_frame_s=0.4, per_mpix_s=7.0,
                           source="bench/cpu_estimate.py --backend dwpose + S3FD/DWPose split, 2 cores, 2026-12-02"),
    "dwpose-onnx": FaceCpuTimes(load_s=1.0, per_frame_s=0.4, per_mpix_s=7.0, source="taken as dwpose"),
    "mmpose": FaceCpuTimes(load_s=1.0, per_frame_s=0.4, per_mpix_s=7.0, source="taken as dwpose"),
    "dlib": FaceCpuTimes(load_s=0.9, per_frame_s=0.0, per_mpix_s=0.1,
                         source="bench/cpu_estimate.py --backend dlib, 2 cores, 2026-12-02"),
    "boxes": FaceCpuTimes(load_s=0.0, per_frame_s=0.0, per_mpix_s=0.0, source="no detector runs"),
}


def face_cpu_times(landmark_backend: str = "auto") -> FaceCpuTimes:
    """The face-tracking figures of a landmark backend name (``"auto"`` and unknown names: ``"dwpose"``)."""
    return FACE_CPU_TIMES.get(landmark_backend, FACE_CPU_TIMES["dwpose"])


def cpu_seconds(kind: str = "lipsync", n_frames: int = 0, source_frames: int | None = None,
                weights: str = "full", times: CpuTimes | None = None, *, landmark_backend: str = "auto",
                frame_size: tuple[int, int] | None = None) -> dict[str, float]:
    """The CPU time of a job, stage by stage, in seconds, face tracking included.

    With ``u`` source frames used (lipsync: ``min(n_frames, source_frames)``; avatar: ``n_frames``) and ``n``
    output frames, from :data:`CPU_TIMES` ``t`` and :data:`FACE_CPU_TIMES` ``f``:

    - ``models`` = ``t.fixed_s`` (avatar: half, no UNet or whisper) + ``f.load_s`` (not for realtime);
    - ``faces`` = ``u * f.seconds(frame_size)``; ``latents`` = ``u * t.latents_s``; ``parsing`` =
      ``u * t.parsing_s`` (not for realtime: a prepared avatar has them);
    - ``generate`` = ``n * t.generate_s`` (not for avatar).

    Args:
        kind: ``"lipsync"``, ``"avatar"``, ``"realtime"`` or ``"clip"`` (counted as realtime).
        n_frames: Output frames for lipsync/realtime (audio seconds x 25); source frames for avatar.
        source_frames: Source frames of the video (25 fps) for lipsync; None assumes at least ``n_frames``, so
            that every output frame has its own source frame (the longest case).
        weights: ``"full"`` or ``"tiny"``.
        times: Other figures (default ``CPU_TIMES[weights]``).
        landmark_backend: The backend that tracks the faces (``"dwpose"``, ``"dlib"``, ``"boxes"``, ...);
            ``"auto"`` counts as ``"dwpose"`` (:func:`face_cpu_times`).
        frame_size: (H, W) of the video frames, pixels; None assumes :data:`DEFAULT_FRAME_SIZE`.

    Returns:
        ``{stage: seconds}`` with the stages that run (``models``, ``faces``, ``latents``, ``parsing``,
        ``generate``).

    Raises:
        InputError: Unknown ``kind`` or ``weights``.

    Source: none in the official code; the figures are documented at :data:`CPU_TIMES` and
    :data:`FACE_CPU_TIMES`.
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
    """Seconds per frame of a long CPU job (models loaded once, one source frame per output frame).

    The per-frame part of :func:`cpu_seconds`: faces + latents + parsing + generate for lipsync, generate for
    realtime, faces + latents + parsing per source frame for avatar.

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
        bf16: Whether GFPGAN and RestoreFormer run in bfloat16 (an fp16 job on a GPU of compute capability 8.0 or
            newer, :func:`nbhelpers.restore.run_dtype`); False multiplies their figure by ``fp32_factor``.
            CodeFormer runs in float32 either way.
        memory_model: Constants (default :data:`MEMORY_MODEL`).

    Returns:
        GiB per frame of the batch, >= 0.

    Raises:
        InputError: An unknown restorer name.

    Source: bench/RESULTS.md "Face restoration" (measured peaks added at batch 20), see :class:`MemoryModel`.
    """
    if restore is None:
        return 0.0
    mm = memory_model or MEMORY_MODEL
    per = {"gfpgan": mm.restore_gfpgan_per_frame_gib, "restoreformer": mm.restore_restoreformer_per_frame_gib,
           "codeformer": mm.restore_codeformer_per_frame_gib}.get(restore)
    if per is None:
        raise InputError(f"restore must be 'gfpgan', 'restoreformer', 'codeformer' or None; got {restore!r}.")
    # CodeFormer runs, and was measured, in float32 whatever the job's precision
    return per if bf16 or restore == "codeformer" else per * mm.fp32_factor


def stage_memory(kind: str, fp16: bool = True, frame_size: tuple[int, int] = DEFAULT_FRAME_SIZE,
                 n_frames: int | None = None, weights: str = "full", landmark_backend: str = "auto",
                 memory_model: MemoryModel | None = None, restore: str | None = None,
                 restore_bf16: bool = True) -> dict[str, tuple[float, float]]:
    """The memory model's stages of a job: ``{stage: (fixed GiB, GiB per frame of the batch)}``.

    See the module docstring for the table of stages. Peak of a stage at batch ``b`` = ``fixed + per_frame * b``.

    Args:
        kind: ``"lipsync"``, ``"avatar"``, ``"realtime"`` or ``"clip"`` (counted as realtime).
        fp16: Half precision (fp32 multiplies weights and activations by ``fp32_factor``).
        frame_size: (H, W) of the full frames, pixels.
        n_frames: Frames of the job (adds whisper features and cached latents), or None.
        weights: ``"full"`` or ``"tiny"``.
        landmark_backend: ``"dlib"`` and ``"boxes"`` use no GPU face models (``faces`` stage is 0).
        memory_model: Constants (default :data:`MEMORY_MODEL`).
        restore: The face restorer of the job (``InferenceConfig.restore``) or None; it runs between VAE decode
            and paste-back, so its :func:`restore_per_frame_gib` is added to the ``generate`` stage (lipsync and
            realtime; avatar preparation generates nothing).
        restore_bf16: Whether GFPGAN / RestoreFormer run in bfloat16 (see :func:`restore_per_frame_gib`).

    Returns:
        Dict of stage name -> (fixed_gib, per_frame_gib), in the order the stages run.

    Raises:
        InputError: An unknown ``restore`` name.

    Source: DESIGN.md "Performance principles" (measured peaks); stage order from reference §0 and §6 (S3FD at
    batch 1 on full frames: quirk Q18, ``api.py:72``).
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
        # pipeline.lipsync streams its clip in pieces (faces, encode, parsing, generate for each piece), so the
        # face models, BiSeNet, UNet + VAE + Whisper, the whisper features and the latents are all resident while
        # any stage runs; S3FD's batch is sized to what is left (pipeline.fit_face_batches), at least one frame.
        resident = core + features + latents + face_models + parsing[0]
        return {"faces": (resident + faces - face_models, 0.0), "encode": (resident, encode_frame),
                "parsing": (resident, parsing[1]), "generate": (resident, core_frame + blend + restorer)}
    if kind == "avatar":
        # avatar.prepare_avatar: faces; the VAE alone for encode (released after); BiSeNet alone for parsing.
        return {"faces": (faces, 0.0), "encode": (vae + latents, encode_frame), "parsing": parsing}
    # realtime (Avatar.generate): the three core models, the features of the clip, and the blend of full frames.
    return {"generate": (core + features, core_frame + blend + restorer)}
