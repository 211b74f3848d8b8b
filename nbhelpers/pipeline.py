"""The pipeline object: the models of one MuseTalk version on one device, and the offline job and preview.

:meth:`MuseTalkPipeline.lipsync` follows ``scripts/inference.py`` with the fixes of docs/official-behaviour.md §11:
face-less frames written unchanged (quirk Q7), input read at 25 fps (Q8), crop boxes clamped (Q17), frames on local
disk (Q25), one encode (Q24), a seeded VAE posterior (Q1). Frames are rendered by :mod:`nbhelpers.engine`.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import faces, gpu, media, models, progress, weights
from . import restore as restorers
from .audio import whisper_features
from .blending import materials_for_frames
from .checks import (
    check_audio,
    check_inputs,
    check_video,
    check_weights_dir,
    given_boxes,
    no_face_in_rotated_video,
    one_frame_boxes,
    speech_frames,
    warn_if_silent,
)
from .config import InferenceConfig
from .constants import CROP_SIZE, FPS, PARSING_SIZE, SAMPLE_RATE, WHISPER_DIM
from .display import table_html
from .engine import SourceFaces, Timings, flush_denormals, repaint, run
from .errors import InputError, NbHelpersError, NoFaceError
from .faces.boxes import single_box
from .faces.memory import DetectionMemory
from .framestore import FrameStore, check_disk_for_frames, expected_frames
from .gpu import PlanWarning
from .gpu.compile import BackgroundCompiler, cache_folder
from .gpu.planner import FP16_ON_CPU
from .latents import decode, encode_frames, unet_step
from .offline import StreamedJob
from .parsing import FaceParser
from .result import ClipResult

# A job's config may leave these empty (the pipeline's are used) but not change them.
PIPELINE_FIELDS = ("version", "device", "fp16")
# The models a job can have compiled (MuseTalkPipeline.compile_for).
COMPILED_PARTS = ("unet", "decoder", "encoder", "parser")
# Components __init__ takes, in the order a notebook shows them.
COMPONENTS = ("unet", "vae", "whisper", "feature_extractor", "pe", "face_parser")


@dataclass(frozen=True)
class Preview:
    """One frame repainted before a full run; a four-panel figure in a notebook.

    ``frame`` and ``result`` are (H, W, 3) uint8 BGR, ``face_256`` the (256, 256, 3) generated crop, ``crop_box`` and
    the expanded ``square`` frame pixels, ``landmarks`` (68, 2) float32 (None when boxes were given), ``mask`` the
    (2s, 2s) uint8 blend mask over ``square``, ``audio`` where the tokens came from.
    """

    frame: np.ndarray
    result: np.ndarray
    face_256: np.ndarray
    crop_box: tuple[int, int, int, int]
    landmarks: np.ndarray | None
    mask: np.ndarray
    square: tuple[int, int, int, int]
    audio: str

    def figure(self):
        """A matplotlib Figure (no pyplot): source with box and landmarks, blend mask, generated crop, result."""
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle

        fig = Figure(figsize=(12, 3.6), dpi=90)
        axes = fig.subplots(1, 4)
        x1, y1, x2, y2 = self.crop_box
        axes[0].imshow(self.frame[:, :, ::-1])
        axes[0].add_patch(Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, color="lime", lw=1.5))
        axes[0].axhline((y1 + y2) / 2, xmin=0, xmax=1, color="yellow", lw=0.6, ls="--")
        if self.landmarks is not None:
            axes[0].scatter(self.landmarks[:, 0], self.landmarks[:, 1], s=2, c="cyan")
        axes[0].set_title("crop box (green), midline (yellow)")
        overlay = self.frame[:, :, ::-1].astype(np.float32) / 255
        xs, ys, xe, ye = self.square
        h, w = overlay.shape[:2]
        cx0, cy0, cx1, cy1 = max(xs, 0), max(ys, 0), min(xe, w), min(ye, h)
        m = self.mask[cy0 - ys:cy1 - ys, cx0 - xs:cx1 - xs].astype(np.float32) / 255
        overlay[cy0:cy1, cx0:cx1, 0] = overlay[cy0:cy1, cx0:cx1, 0] * (1 - m) + m
        axes[1].imshow(overlay)
        axes[1].set_title("blend mask (red)")
        axes[2].imshow(self.face_256[:, :, ::-1])
        axes[2].set_title("generated crop 256x256")
        axes[3].imshow(self.result[:, :, ::-1])
        axes[3].set_title("result")
        pad = max(x2 - x1, y2 - y1)
        for ax in (axes[0], axes[1], axes[3]):
            ax.set_xlim(max(x1 - pad // 2, 0), min(x2 + pad // 2, w))
            ax.set_ylim(min(y2 + pad // 2, h), max(y1 - pad // 2, 0))
        for ax in axes:
            ax.set(xticks=[], yticks=[])
        fig.tight_layout()
        return fig

    def _repr_png_(self) -> bytes:
        import io

        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", bbox_inches="tight")
        return buf.getvalue()

    def __repr__(self) -> str:
        return (f"Preview(crop_box={self.crop_box}, square={self.square}, frame={self.frame.shape[1]}x"
                f"{self.frame.shape[0]}, audio={self.audio!r})")


class MuseTalkPipeline(contextlib.AbstractContextManager):
    """The models of one MuseTalk version on one device, each loaded once on first use, and the jobs that use them.

    Make it with :meth:`from_pretrained` (reads the disk), or hand ``__init__`` the weights folder, a complete config
    (its ``device`` and ``fp16`` place the models; None: CPU, fp32) and any components already loaded there
    (diffusers' split).
    """

    def __init__(self, weights_dir: str | os.PathLike, config: InferenceConfig, *, unet: Any = None, vae: Any = None,
                 whisper: Any = None, feature_extractor: Any = None, pe: Any = None, face_parser: Any = None):
        import torch

        self.weights_dir = Path(weights_dir)
        self.config = config
        self.version = config.version
        self.device = torch.device(config.device or "cpu")
        self.dtype = torch.float16 if config.fp16 else torch.float32
        given = zip(COMPONENTS, (unet, vae, whisper, feature_extractor, pe, face_parser), strict=True)
        self._loaded: dict[str, Any] = {k: v for k, v in given if v is not None}
        self._checked: dict[str, tuple[int, int]] = {}  # weight file -> (size, mtime_ns) when last found usable
        self._compiler: BackgroundCompiler | None = None
        self.detections = DetectionMemory()  # face detections of the videos seen, so each video is tracked once

    @classmethod
    def from_pretrained(cls, weights_dir: str | os.PathLike | None = None,
                        config: InferenceConfig | None = None) -> MuseTalkPipeline:
        """Check every file the jobs open in ``weights_dir`` (None: :func:`nbhelpers.weights.default_dir`) and make a
        pipeline over it with the jobs' default ``config``, loading no model. Device and precision left empty are
        planned (:func:`nbhelpers.gpu.plan`; fp16 asked on the CPU warns), the batch size per job. NoGpuError when
        ``config.device`` asks for CUDA and none is usable; WeightsError when the folder or files are missing or not
        weight files (each named, with the download command)."""
        base = config or InferenceConfig()
        gpu.check_device(base.device)
        weights_path = check_weights_dir(weights_dir, base.version, base.landmark_backend)
        plan = gpu.plan(kind="lipsync", config=base.replace(batch_size=None), n_frames=None,
                        weights=_weights_kind(weights_path), warn=False)  # device and precision: no frames known
        if FP16_ON_CPU in plan.warnings:  # job-independent: said at load
            warnings.warn(FP16_ON_CPU, PlanWarning, stacklevel=2)
        planned = plan.config.replace(batch_size=base.batch_size)
        planned.reasons.update(plan.config.reasons)
        if base.batch_size is not None:  # the plan's batch reason is about a batch this config does not hold
            planned.reasons.pop("batch_size", None)
        pipe = cls(weights_path, planned)
        pipe.check_weights()
        return pipe

    def check_weights(self, landmark_backend: str | None = None) -> None:
        """Look inside every weight file a job with ``landmark_backend`` (default the pipeline's) opens, raising
        WeightsError as :func:`nbhelpers.weights.check_job_files`; later calls compare only size and mtime."""
        backend = landmark_backend or self.config.landmark_backend
        entries = weights.job_files(self.version, backend, parsing=True, directory=self.weights_dir)
        keys = []
        for entry in entries:
            path = next((self.weights_dir / p for p in (entry.path, *entry.alternates)
                         if (self.weights_dir / p).is_file()), None)
            st = path.stat() if path is not None else None
            keys.append((entry.path, st.st_size if st else -1, st.st_mtime_ns if st else -1))
        if all(self._checked.get(k[0]) == k[1:] for k in keys):
            return
        weights.check_job_files(self.weights_dir, self.version, backend)
        self._checked.update({k[0]: k[1:] for k in keys})

    # -- the components, loaded on first use ---------------------------------------------------------------------

    def _get(self, name: str, load: Callable[[], Any]) -> Any:
        """The component ``name``, loaded by ``load()`` on first use under :data:`nbhelpers.models.LOAD_LOCK` (one
        model built at a time: accelerate's ``init_empty_weights`` patches ``torch.nn.Module`` process-wide)."""
        if name in self._loaded:
            return self._loaded[name]
        with models.LOAD_LOCK:
            if name not in self._loaded:
                with flush_denormals(self.device):
                    self._loaded[name] = load()
        return self._loaded[name]

    @property
    def unet(self):
        """The MuseTalk ``UNet2DConditionModel`` (loaded on first use). On CUDA its weights are stored
        channels-last, the layout of cuDNN's fastest fp16 convolutions (bench/RESULTS.md, "T4-class GPU")."""
        return self._get("unet", lambda: _channels_last(
            models.load_unet(self.weights_dir, self.version, self.device, self.dtype)))

    @property
    def vae(self):
        """The sd-vae-ft-mse ``AutoencoderKL`` (loaded on first use)."""
        return self._get("vae", lambda: models.load_vae(self.weights_dir, self.device, self.dtype))

    @property
    def whisper(self):
        """The whisper-tiny model; the pipeline uses its encoder (loaded on first use)."""
        return self._get("whisper", lambda: models.load_whisper(self.weights_dir, self.device, self.dtype))

    @property
    def feature_extractor(self):
        """Whisper's log-mel feature extractor (CPU, loaded on first use)."""
        return self._get("feature_extractor", lambda: models.load_feature_extractor(self.weights_dir))

    @property
    def pe(self):
        """The positional encoding of the whisper tokens (384, 5000)."""
        return self._get("pe", lambda: models.PositionalEncoding(WHISPER_DIM, 5000).to(self.device, self.dtype).eval())

    @property
    def face_parser(self):
        """BiSeNet face parsing (:class:`nbhelpers.parsing.FaceParser`, loaded on first use)."""
        return self._get("face_parser", lambda: FaceParser(self.weights_dir, device=self.device, dtype=self.dtype))

    @property
    def models(self):
        """UNet, VAE, whisper, feature extractor and positional encoding as one :class:`nbhelpers.models.Models`."""
        return models.Models(unet=self.unet, vae=self.vae, whisper=self.whisper,
                             feature_extractor=self.feature_extractor, pe=self.pe, device=self.device,
                             dtype=self.dtype, version=self.version, weights_dir=self.weights_dir,
                             tiny=weights.is_tiny(self.weights_dir))

    def restorer(self, name: str):
        """The face restorer ``name`` (``"gfpgan"``, ``"restoreformer"``, ``"codeformer"``), loaded on first use;
        raises what :func:`nbhelpers.restore.load_restorer` raises."""
        restorers.check_name(name)
        return self._get(f"restorer:{name}", lambda: restorers.load_restorer(name, self.weights_dir, self.device,
                                                                             self.dtype))

    def models_for(self, config: InferenceConfig):
        """:attr:`models` with ``config``'s face restorer (``restore``, ``restore_strength``) attached, if any."""
        bundle = self.models
        if config.restore is not None:
            bundle.restorer = self.restorer(config.restore).at(config.restore_strength)
        return bundle

    def landmarks(self, backend: Any = None):
        """The landmark backend ``backend`` (a name, default the pipeline's, kept for later jobs; an object is
        returned as is). Raises what :func:`nbhelpers.faces.get_backend` raises."""
        backend = backend or self.config.landmark_backend
        if not isinstance(backend, str):
            return backend
        key = f"landmarks:{backend}"
        return self._get(key, lambda: faces.get_backend(backend, weights_dir=self.weights_dir, device=str(self.device)))

    def faces(self, video: Any, *, config: InferenceConfig | None = None, backend: Any = None) -> faces.FaceTracks:
        """Every face in ``video`` linked into numbered tracks (:func:`faces.find_tracks`); pick one with ``face=``."""
        config = self.job_config(config)
        return faces.find_tracks(video, self.landmarks(backend or config.landmark_backend), config, self.weights_dir)

    @property
    def loaded(self) -> list[str]:
        """Names of the components loaded so far."""
        return list(self._loaded)

    def preload(self, kind: str = "avatar", *, restore: str | None = None) -> list[str]:
        """Load now (thread-safe) the models of ``kind`` (``"avatar"``, ``"lipsync"``: also the landmark backend) jobs
        and the ``restore`` restorer, and return :attr:`loaded`. InputError for another ``kind``."""
        if kind not in ("avatar", "lipsync"):
            raise InputError(f"kind must be 'avatar' or 'lipsync'; got {kind!r}.")
        self.vae, self.face_parser, self.unet, self.whisper, self.feature_extractor, self.pe  # noqa: B018 - loads
        if kind == "lipsync" and self.config.landmark_backend != "boxes":
            self.landmarks()
        if restore is not None:
            self.restorer(restore)
        return self.loaded

    def warm_up(self, batch_size: int) -> None:
        """CUDA only: run the UNet and VAE decoder once on zeros at ``batch_size`` (a positive int, else InputError)
        frames and whisper on 1 s of silence, so the first clip finds its kernels and handles made."""
        _check_batch(batch_size)
        if self.device.type != "cuda":
            return
        import torch

        self.compile_for(batch_size, parts=("unet", "decoder"))
        unet, vae = self.unet, self.vae
        cfg = unet.config
        side = CROP_SIZE // 2 ** (len(vae.config.block_out_channels) - 1)  # the latent of a 256x256 crop: 32
        with torch.inference_mode():
            latents = torch.zeros(batch_size, int(cfg.in_channels), side, side, device=self.device, dtype=self.dtype)
            tokens = torch.zeros(batch_size, 50, int(cfg.cross_attention_dim), device=self.device, dtype=self.dtype)
            decode(unet_step(unet, self.pe, latents, tokens), vae)
            self.features(np.zeros(SAMPLE_RATE, dtype=np.float32))
        torch.cuda.synchronize(self.device)

    # -- compiled models ------------------------------------------------------------------------------------------

    @property
    def compiler(self) -> BackgroundCompiler:
        """The :class:`~nbhelpers.gpu.compile.BackgroundCompiler` of this pipeline's models (``config.compile``);
        its ``status`` says what is compiled. Its cache folder is :func:`~nbhelpers.gpu.compile.cache_folder`."""
        if self._compiler is None:
            self._compiler = BackgroundCompiler(self.device, self.config.compile, facts=self._compile_facts,
                                                cache_dir=cache_folder(self.weights_dir), on_event=progress.note)
        return self._compiler

    def _compile_facts(self) -> dict[str, Any]:
        return {"version": self.version, "dtype": str(self.dtype), "weights": _weights_kind(self.weights_dir),
                "unet": _file_text(self.weights_dir / models.UNET_FILES[self.version][0]),
                "vae": _file_text(self.weights_dir / models.VAE_DIR / "config.json"), "channels_last_unet": True,
                "upsampling": "transposed", "group_norm": "channel moments"}

    def compile_for(self, batch_size: int, parts: tuple[str, ...] = COMPILED_PARTS, *,
                    dynamic_batch: bool = False, cached_only: bool = False) -> None:
        """Have the models of ``parts`` (any of :data:`COMPILED_PARTS`) compiled in the background for jobs of
        ``batch_size`` frames a batch (the VAE encoder gets twice as many crops); returns at once, jobs run eagerly
        until the compiled code is ready. The UNet and the face parser are compiled for any batch; the VAE's two
        halves for this one, or for any with ``dynamic_batch`` (one compile for many batch sizes, slower code).
        ``cached_only``: only the parts an earlier session's compile cache holds (a stage too short to repay a cold
        compile: BackgroundCompiler.request).
        Nothing on the CPU, with ``config.compile == "off"``, or where :func:`~nbhelpers.gpu.compile.can_compile`
        says no. InputError for a bad ``batch_size`` or part.
        """
        _check_batch(batch_size)
        unknown = set(parts) - set(COMPILED_PARTS)
        if unknown:
            raise InputError(f"parts must be among {COMPILED_PARTS}; got {sorted(unknown)}.")
        if self.config.compile == "off":
            return
        import torch

        comp = self.compiler
        if not comp.enabled:
            return
        b, dev, dt = int(batch_size), self.device, self.dtype
        side = CROP_SIZE // 8  # the latent of a 256x256 crop
        # Examples made as the engine makes its tensors (the VAE encoder's under no_grad), so signatures match.
        with torch.inference_mode():
            if "unet" in parts:
                unet = self.unet
                lat = torch.zeros(b, int(unet.config.in_channels), side, side, device=dev, dtype=dt)
                tokens = torch.zeros(b, 50, int(unet.config.cross_attention_dim), device=dev, dtype=dt)
                comp.request("unet", unet, lat, gpu.device_constant([0], dev), encoder_hidden_states=tokens,
                             cached_only=cached_only)
            if "decoder" in parts:
                z = torch.zeros(b, int(self.vae.config.latent_channels), side, side, device=dev, dtype=dt)
                # Inductor's dynamic-batch decoder ran at two thirds of the static one's speed on a T4-class GPU
                # (bench/RESULTS.md); other shapes compile once they repeat.
                comp.request("vae decoder", self.vae.decoder, z, dynamic_batch=dynamic_batch, cached_only=cached_only)
            if "parser" in parts:
                x = torch.zeros(b, 3, PARSING_SIZE, PARSING_SIZE, device=dev, dtype=dt)
                comp.request("face parser", self.face_parser.net, x, method="parse", cached_only=cached_only)
        if "encoder" in parts:
            with torch.no_grad():
                crops = torch.zeros(2 * b, 3, CROP_SIZE, CROP_SIZE, device=dev, dtype=dt)
            comp.request("vae encoder", self.vae.encoder, crops, grad="no_grad", dynamic_batch=dynamic_batch,
                         cached_only=cached_only)

    # -- steps shared by the jobs ----------------------------------------------------------------------------------

    def job_config(self, config: InferenceConfig | None = None, *, boxes: Any = None) -> InferenceConfig:
        """``config`` (default the pipeline's) with this pipeline's version, device, precision and, for ``"auto"``,
        landmark backend; InputError when ``config`` asks for another version, device or precision (fp16 on a CPU
        pipeline runs in fp32, as the planner's rule for the CPU says)."""
        config = config or self.config
        if boxes is not None and config.landmark_backend != "boxes":
            config = config.replace(landmark_backend="boxes")
        mine = {"version": self.version, "device": self.config.device, "fp16": self.config.fp16}
        clash = [f"{k}={getattr(config, k)!r} (this pipeline: {v!r})" for k, v in mine.items()
                 if getattr(config, k) not in (None, v) and (k, self.device.type) != ("fp16", "cpu")]  # fp32 there
        if clash:
            raise InputError(f"the settings ask for {', '.join(clash)}. A pipeline keeps its models on one device in "
                             "one precision and version: make another with MuseTalkPipeline.from_pretrained(...), or "
                             "move this one with pipe.to(device).")
        if config.landmark_backend == "auto":  # no preference: the pipeline's (whose files it checked)
            mine["landmark_backend"] = self.config.landmark_backend
        filled = config.replace(**mine)
        filled.reasons.update({k: v for k, v in self.config.reasons.items() if k in PIPELINE_FIELDS})
        filled.reasons.update(config.reasons)
        return filled

    def plan(self, kind: str, config: InferenceConfig, n_frames: int | None, frame_size: tuple[int, int] | None,
             source_frames: int | None = None, landmark_backend: str | None = None):
        """``config`` with the batch size of one job on this device (:func:`nbhelpers.gpu.plan`), counting the models
        already held (:meth:`resident_gib`) as free. ``landmark_backend``: the job's (None: the config's)."""
        backend = landmark_backend or config.landmark_backend
        return gpu.plan(kind=kind, config=config, n_frames=n_frames, frame_size=frame_size,
                        weights=_weights_kind(self.weights_dir), source_frames=source_frames,
                        landmark_backend=landmark_backend, loaded_gib=self.resident_gib(kind, backend)).config

    def resident_gib(self, kind: str, landmark_backend: str) -> float:
        """GiB held on this pipeline's GPU by the loaded models that every stage of a ``kind`` job counts in
        :func:`nbhelpers.gpu.stage_memory`: UNet, VAE, whisper and the positional encoding, for ``"lipsync"`` also
        BiSeNet and the GPU face models of ``landmark_backend``; 0 for ``"avatar"`` and on the CPU."""
        if self.device.type != "cuda" or kind not in ("lipsync", "realtime", "clip"):
            return 0.0
        names = ["unet", "vae", "whisper", "pe"]
        if kind == "lipsync":
            names.append("face_parser")
            if landmark_backend not in ("dlib", "boxes"):
                names += [n for n, obj in self._loaded.items() if n.startswith("landmarks:")
                          and landmark_backend in (n.split(":", 1)[1], getattr(obj, "name", None))]
        held = [self._loaded[n] for n in names if n in self._loaded]
        return gpu.module_bytes(*held, device=self.device) / 2**30

    def features(self, waveform: np.ndarray):
        """(T, 50, 384) whisper features on the device of a 16 kHz mono float32 waveform, T = floor(seconds x 25)
        (:func:`nbhelpers.audio.whisper_features`; docs/official-behaviour.md §5)."""
        with flush_denormals(self.device):
            return whisper_features(waveform, self.whisper, fps=FPS, feature_extractor=self.feature_extractor)

    def clip_notes(self, size: tuple[int, int] | None = None) -> tuple[str, ...]:
        """A clip summary's notes: random test weights, and frames of ``size`` (width, height) padded to even sides."""
        notes = ["(random test weights: the mouth is noise)"] if weights.is_tiny(self.weights_dir) else []
        padded = media.padded_size_note(*size) if size is not None else None
        return tuple(notes + ([padded] if padded else []))

    # -- jobs ------------------------------------------------------------------------------------------------------

    def lipsync(self, video: str | os.PathLike, audio: str | os.PathLike, output: str | os.PathLike | None = None, *,
                config: InferenceConfig | None = None, boxes: Any = None, backend: Any = None,
                frame_callback: Callable[[int, np.ndarray], None] | None = None) -> ClipResult:
        """Lip-sync a face video to a speech file and write an MP4 of ``floor(audio seconds x 25)`` frames at 25 fps
        and the source size. Source frames cycle 0..N-1, N-1..0, ... (docs/official-behaviour.md §4.5); only those the
        audio reaches are decoded. ``video``: a face video (read at 25 fps) or photo; ``audio``: any sample rate and
        channels; ``output`` (None: ``results/<video>_<audio>.mp4``; an existing folder: that name in it) is renamed
        into place when complete. ``boxes``: one ``(x1, y1, x2, y2)`` crop box in source pixels for the clip, or one
        box or None per 25 fps frame (:func:`nbhelpers.checks.check_boxes`); None: detect faces with ``backend``
        (None: the one ``config.landmark_backend`` names). ``frame_callback(t, frame)`` gets each (H, W, 3) uint8 BGR
        output frame.

        Raises InputError for a missing or unreadable file or an invalid option (before anything heavy runs),
        WeightsError for missing or corrupt weight files, NoFaceError when no frame has a face (before the UNet
        loads), DiskSpaceError when the local disk cannot hold the decoded frames (checked before decoding),
        FFmpegError when ffmpeg fails.
        Source: ``scripts/inference.py:85-249``, with the fixes of the module docstring.
        """
        t0 = time.perf_counter()
        track_memory = self.device.type == "cuda" and os.environ.get("NBHELPERS_STAGE_MEMORY", "") == "1"
        timings = Timings(peak_gib={} if track_memory else None)
        boxes = given_boxes(boxes)
        config = self.job_config(config, boxes=boxes)

        # 1. checks: files, streams and weights, before anything heavy
        with timings.stage("checks"):
            video_path, audio_path, output_path, _, video_info, _ = check_inputs(
                video, audio, output, config=config, weights_dir=self.weights_dir, boxes=boxes)
            self.check_weights(config.landmark_backend)

        # 2. media: the audio at 16 kHz, then the 25 fps frames it reaches (0..min(n_out, N)-1) to local disk
        with timings.stage("media"):
            waveform = media.load_audio(audio_path)
            n_out = speech_frames(waveform, f"audio {str(audio_path)!r}")
            warn_if_silent(waveform, f"audio {str(audio_path)!r}")
            reader = media.load_video(video_path)
        n_src = min(n_out, expected_frames(video_info, n_out))  # an upper estimate until decoding ends
        check_disk_for_frames(n_src, reader.height, reader.width)
        if boxes is not None and single_box(boxes) is None:  # one per video frame: the first n_out are used
            boxes = list(boxes)[:n_out]
        store = FrameStore(reader.height, reader.width)
        job = StreamedJob(self, config, store, n_out, boxes, timings, source_frames=n_src)
        made = media.missing_folders(output_path.parent)  # removed again if the job stops before writing there
        try:
            # 3. faces: the landmark backend (none for boxes given), built before the plan counts its CPU time
            given = boxes is not None or config.landmark_backend == "boxes"
            with timings.stage("faces"):
                detector = "auto" if given else self.landmarks(backend or config.landmark_backend)
            tracking = "boxes" if given else getattr(detector, "name", None)

            # 4. gpu: the batch size from free memory, frame size and length (a batch given is kept)
            with timings.stage("plan"):
                config = job.config = self.plan("lipsync", config, n_out, (reader.height, reader.width),
                                                source_frames=n_src, landmark_backend=tracking)
            with timings.stage("faces"):  # the face models' compiles are asked for first: their stage comes first
                job.start_tracking(self.detections.wrap(detector, video_path), self.weights_dir,
                                   self.resident_gib("lipsync", tracking or ""), video=video_path, waveform=waveform)
            self.compile_for(int(config.batch_size or 8))  # in the background: the job starts eagerly

            # 5. audio: whisper features, one (50, 384) block per output frame, before the first frame decodes
            with flush_denormals(self.device):
                with timings.stage("audio"):
                    features = self.features(waveform)
                if features.shape[0] != n_out:
                    raise NbHelpersError(f"internal: {features.shape[0]} feature frames for {n_out} output frames")

                # 6. latents, parsing, generate, blending and encode, piece by piece (nbhelpers.offline.StreamedJob)
                with timings.stage("encoder_start"):
                    writer = media.VideoWriter(output_path, store.width, store.height, fps=FPS, audio=audio_path,
                                               encoder=media.choose_encoder(config.encoder))
                decoded = job.decode_ahead(reader)
                with writer:
                    run(job.pieces(decoded), features, None, int(config.batch_size or 8), n_out, writer,
                        frame_callback=frame_callback, timings=timings, desc="generate")
                    finish = time.perf_counter()
                timings.add("encoder_finish", time.perf_counter() - finish)
        except NoFaceError as exc:
            raise no_face_in_rotated_video(exc, video_info) from None
        finally:
            job.close()
            reader.close()
            store.close()
            media.remove_empty(made)
        track = job.track
        return ClipResult(output=Path(writer.path), n_frames=n_out, source_frames=track.n_frames,
                          no_face_frames=track.n_no_face, fps=FPS, duration_s=len(waveform) / SAMPLE_RATE,
                          config=job.config, backend=track.backend, timings=dict(timings.seconds),
                          wall_s=time.perf_counter() - t0, kind="lipsync", turns=tuple(job.turns),
                          notes=self.clip_notes((store.width, store.height)),
                          stats={f"peak_gib_{k}": round(v, 3) for k, v in (timings.peak_gib or {}).items()})

    def preview(self, video: str | os.PathLike, *, config: InferenceConfig | None = None, boxes: Any = None,
                audio: str | os.PathLike | None = None, frame_index: int = 0, backend: Any = None) -> Preview:
        """Repaint one 25 fps frame with the steps of :meth:`lipsync` (options as there; per-frame ``boxes``: the entry
        of ``frame_index``) and the bit-exact CPU blend, to check the crop box and mask. The tokens are the first
        frame's of ``audio``, else seeded random as the official app's "Test Inpainting" (``app.py:35-123``).
        Raises as :meth:`lipsync`, InputError also for a frame index past the end, NoFaceError for no face in that
        frame (pass ``boxes=``).
        """
        import torch

        boxes = given_boxes(boxes)
        config = self.job_config(config, boxes=boxes)

        # 1. checks
        gpu.check_device(config.device)
        video_path, _ = check_video(video)
        audio_path = check_audio(audio)[0] if audio is not None else None
        self.check_weights(config.landmark_backend)
        # 2. media
        frames = media.frames_at(video_path, [int(frame_index)])
        if len(frames) != 1:
            raise InputError(f"frame_index {frame_index} is past the end of {str(video_path)!r}.")
        frame = np.ascontiguousarray(frames[0])[None]
        # 3. faces (no detector is built or loaded for boxes given)
        given = boxes is not None or config.landmark_backend == "boxes"
        detector = "auto" if given else self.landmarks(backend or config.landmark_backend)
        track = faces.track(frame, backend=self.detections.wrap(detector, video_path, int(frame_index)),
                            config=config, boxes=one_frame_boxes(boxes, frame_index), weights_dir=self.weights_dir)
        with flush_denormals(self.device):
            # 4. latents
            latents = encode_frames(frame, track.crop_boxes, [0], self.vae, seed=config.seed,
                                    mode=config.latent_mode, progress=False)
            # 5. audio (or seeded random tokens)
            if audio_path is not None:
                feats = self.features(media.load_audio(audio_path))[:1]
                source_text = f"first frame of {audio_path.name}"
            else:
                g = torch.Generator().manual_seed(int(config.seed))
                feats = torch.randn((1, 50, WHISPER_DIM), generator=g).to(device=self.device, dtype=self.dtype)
                source_text = f"random tokens (seed {config.seed})"
            # 6. parsing, generate and blending
            material = materials_for_frames(frame, track.crop_boxes, [0], self.face_parser, config,
                                            progress=False)[0]
            source = SourceFaces.from_materials(frame, [0], latents, [material])
            result, faces_256 = repaint(source, feats, self.models_for(config), np.arange(1), cpu_blend=True)
        lms = None if not np.isfinite(track.landmarks[0]).all() else track.landmarks[0].astype(np.float32)
        return Preview(frame=frame[0], result=np.array(result[0]), face_256=faces_256[0].cpu().numpy(),
                       crop_box=tuple(int(v) for v in track.crop_boxes[0]), landmarks=lms, mask=material.mask,
                       square=tuple(int(v) for v in material.square), audio=source_text)

    # -- device and memory -----------------------------------------------------------------------------------------

    def to(self, device: str | Any) -> MuseTalkPipeline:
        """Move the UNet, VAE, whisper and positional encoding to ``device`` (fp16 on CUDA, fp32 on the CPU); the
        others are rebuilt there when next used. Returns self; NoGpuError when CUDA is asked and none is usable."""
        import torch

        gpu.check_device(str(device))
        dev = torch.device(device)
        fp16 = dev.type == "cuda"
        dtype = torch.float16 if fp16 else torch.float32
        for name in ("unet", "vae", "whisper", "pe"):
            if name in self._loaded:
                self._loaded[name] = gpu.cast_and_move(self._loaded[name], dev, dtype)
        for name in [n for n in self._loaded if n == "face_parser" or n.startswith(("landmarks:", "restorer:"))]:
            gpu.release(self._loaded.pop(name))
        self.device, self.dtype = dev, dtype
        self.detections.clear()
        self.config = self.config.replace(device=str(dev), fp16=fp16)
        return self

    def release(self) -> float:
        """Drop every loaded model (reloaded when next needed) and empty the CUDA cache; returns GiB freed."""
        loaded = list(self._loaded.values())
        for obj in loaded:
            close = getattr(obj, "close", None)
            if callable(close) and not hasattr(obj, "parameters"):
                with contextlib.suppress(Exception):  # releasing must not fail
                    close()
        self._loaded.clear()
        return gpu.release(*loaded)

    def __exit__(self, *exc) -> None:
        if self._compiler is not None and self._compiler.busy:  # a script or command ending: its compile ends too
            parts = self._compiler.status.parts.values()
            done = sum(p == "compiled" for p in parts)
            progress.note(f"the background compile did not finish before the job ended ({done} of {len(parts)} "
                          "parts compiled). What finished is cached for the next run; the rest compiles again then.")
        self.release()

    def _rows(self) -> list[tuple[str, str]]:
        names = [*COMPONENTS, *(n for n in self._loaded if n.startswith(("landmarks:", "restorer:")))]
        rows = [("weights", str(self.weights_dir)), ("version", self.version), ("device", str(self.device)),
                ("precision", "fp16" if self.config.fp16 else "fp32")]
        rows += [(n, "loaded" if n in self._loaded else "not loaded yet") for n in names]
        if self.device.type == "cuda":
            import torch

            rows.append(("GPU memory held", f"{torch.cuda.memory_allocated(self.device) / 2**30:.2f} GiB"))
        return rows

    def __repr__(self) -> str:
        loaded = ", ".join(self._loaded) or "nothing loaded yet"
        return (f"MuseTalkPipeline({self.version} on {self.device}, {'fp16' if self.config.fp16 else 'fp32'}, "
                f"{self.weights_dir}; {loaded})")

    def _repr_html_(self) -> str:
        return "<b>MuseTalkPipeline</b>" + table_html(self._rows())


def _check_batch(batch_size: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a positive whole number; got {batch_size!r}.")


def _weights_kind(weights_path: Path) -> str:
    return "tiny" if weights.is_tiny(weights_path) else "full"


def _file_text(path: Path) -> str | None:
    """A small config file's text, for a cache key (None when it cannot be read)."""
    try:
        return path.read_text()
    except OSError:
        return None


def _channels_last(module: Any) -> Any:
    """``module`` with its 4-D weights in channels-last memory on CUDA (unchanged on the CPU)."""
    import torch

    if next(module.parameters()).device.type == "cuda":
        module.to(memory_format=torch.channels_last)
    return module


def lipsync(video: str | os.PathLike, audio: str | os.PathLike, output: str | os.PathLike | None = None, *,
            config: InferenceConfig | None = None, weights_dir: str | os.PathLike | None = None, boxes: Any = None,
            backend: Any = None, frame_callback: Callable[[int, np.ndarray], None] | None = None) -> ClipResult:
    """:meth:`MuseTalkPipeline.lipsync` in one call (raising what it raises): inputs checked, then a pipeline made
    over ``weights_dir`` (default :func:`nbhelpers.weights.default_dir`) and released. For several jobs make one."""
    config = config or InferenceConfig()
    boxes = given_boxes(boxes)
    if boxes is not None and config.landmark_backend != "boxes":
        config = config.replace(landmark_backend="boxes")
    check_inputs(video, audio, output, config=config, weights_dir=weights_dir, boxes=boxes)
    with MuseTalkPipeline.from_pretrained(weights_dir, config) as pipe:
        return pipe.lipsync(video, audio, output, config=config, boxes=boxes, backend=backend,
                            frame_callback=frame_callback)


def preview(video: str | os.PathLike, config: InferenceConfig | None = None, *,
            weights_dir: str | os.PathLike | None = None, boxes: Any = None,
            audio: str | os.PathLike | None = None, frame_index: int = 0, backend: Any = None) -> Preview:
    """:meth:`MuseTalkPipeline.preview` in one call (raising what it raises) on a pipeline over ``weights_dir``."""
    config = config or InferenceConfig()
    if boxes is not None and config.landmark_backend != "boxes":
        config = config.replace(landmark_backend="boxes")
    check_video(video)  # before the weights are checked; from_pretrained checks the device
    with MuseTalkPipeline.from_pretrained(weights_dir, config) as pipe:
        return pipe.preview(video, config=config, boxes=boxes, audio=audio, frame_index=frame_index,
                            backend=backend)


__all__ = ["COMPONENTS", "ClipResult", "MuseTalkPipeline", "Preview", "lipsync", "preview"]
