"""Inference settings: one frozen dataclass that widgets, the CLI and the Python API all produce and consume."""

from __future__ import annotations

import dataclasses
import numbers
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from .constants import ENCODERS, VERSIONS
from .errors import InputError, NbHelpersWarning

PARSING_MODES = ("jaw", "raw", "neck")
LANDMARK_BACKENDS = ("auto", "dwpose", "dwpose-onnx", "mmpose", "dlib", "boxes")
LATENT_MODES = ("sample", "mode")
RESTORERS = ("gfpgan", "restoreformer", "codeformer")  # face restorers of nbhelpers.restore (restore=None: off)
NONCOMMERCIAL_NOTE = ("CodeFormer is licensed for non-commercial use only (S-Lab License 1.0, "
                      "https://github.com/sczhou/CodeFormer/blob/master/LICENSE): do not use its output commercially. "
                      "GFPGAN and RestoreFormer are Apache-2.0.")
_warned_licence = False


@dataclass(frozen=True)
class InferenceConfig:
    """How one lip-sync job or avatar runs. Validated at construction.

    Attributes:
        version: ``"v15"`` (MuseTalk 1.5, default) or ``"v1"`` (1.0 weights through the current pipeline).
            Source: ``scripts/inference.py`` ``--version``.
        batch_size: Frames per UNet/VAE batch; None lets :func:`nbhelpers.gpu.plan` choose from free memory.
            Official defaults: 8 offline (``inference.py:266``), 20 realtime (``realtime_inference.py:331``).
        fp16: Half precision for UNet, VAE, whisper and the positional encoding; None = fp16 on CUDA, fp32 on CPU.
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"``; None picks CUDA when available.
        extra_margin: Pixels added below the crop box's bottom edge (v15 only), default 10
            (``inference.py:170-172``).
        bbox_shift: Pixels added to landmark 29's y, which moves the upper edge of the repainted half down (+) or up
            (-); default 0. Applied to both versions: the official scripts force 0 for v1.5 (``inference.py:93-94``)
            while the official app applies it to v1.5 too (``app.py:73,264``, quirk Q27); this package follows the
            app, so v1.5 users can tune it.
        parsing_mode: Face-parsing mask: ``"jaw"`` (v15 default), ``"raw"`` (v1), or ``"neck"``
            (``face_parsing/__init__.py:93-108``).
        left_cheek_width: Jaw mode cheek band in 512-px parsing space, default 90 (``inference.py:272``).
        right_cheek_width: Same on the right, default 90 (``inference.py:273``).
        landmark_backend: ``"auto"``, ``"dwpose"``, ``"dwpose-onnx"``, ``"mmpose"``, ``"dlib"``, or ``"boxes"``
            (user boxes).
        smooth_boxes: Temporal smoothing window of crop boxes in frames (0 = off, the official behaviour).
        seed: Seed of the generator that samples the VAE posterior. The official code samples with no seed
            (quirk Q1); a seed makes runs reproducible.
        latent_mode: ``"sample"`` (official inference, ``vae.py:93``) or ``"mode"`` (the posterior mean, as training).
        blur_ratio: Feathering of the blend mask, kernel ``int(ratio * 2s // 2 * 2) + 1``: 0.05 is the official
            offline value (``blending.py:81``), 0.1 the official realtime one (``blending.py:134``, quirk Q10). The
            avatar uses the same default as the offline job so both give the same frames.
        encoder: How the output video is encoded (``nbhelpers.media.choose_encoder``): ``"libx264"`` (default, the
            official offline choice: CRF 18, preset medium, ``inference.py:230-237``), ``"libx264-fast"``,
            ``"libx264-faster"``, ``"libx264-veryfast"``, ``"libx264-superfast"``, ``"libx264-ultrafast"`` (same
            CRF, faster presets: larger files or slightly lower quality), ``"nvenc"`` or ``"auto"`` (h264_nvenc on
            the GPU when a one-frame test encode succeeds, else libx264 medium with a warning that says why).
        restore: Face restoration of the generated 256x256 crop before paste-back (so only pixels under the blend
            mask change): None (default, off: the official behaviour), ``"gfpgan"`` (GFPGAN v1.4),
            ``"restoreformer"`` or ``"codeformer"`` (non-commercial licence; a warning says so when chosen). Needs
            spandrel and the optional weight set ``restore-<name>`` (:mod:`nbhelpers.restore`). Not an official
            MuseTalk step; not cached in avatars (one avatar renders with or without it).
        restore_strength: Blend of restored and unrestored face, 0..1 (default 1 = restored only); used only with
            ``restore``.
        reasons: Why automatic values were chosen (filled by ``gpu.plan``); not compared or hashed.
    """

    version: str = "v15"
    batch_size: int | None = None
    fp16: bool | None = None
    device: str | None = None
    extra_margin: int = 10
    bbox_shift: int = 0
    parsing_mode: str = "jaw"
    left_cheek_width: int = 90
    right_cheek_width: int = 90
    landmark_backend: str = "auto"
    smooth_boxes: int = 0
    seed: int = 0
    latent_mode: str = "sample"
    blur_ratio: float = 0.05
    encoder: str = "libx264"
    restore: str | None = None
    restore_strength: float = 1.0
    compile: str = "auto"  # torch.compile on small GPUs in the background: auto, on, off (nbhelpers.gpu.compile)
    reasons: dict[str, str] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        _choice("compile", self.compile, ("auto", "on", "off"))
        _choice("version", self.version, VERSIONS)
        _choice("parsing_mode", self.parsing_mode, PARSING_MODES)
        _choice("landmark_backend", self.landmark_backend, LANDMARK_BACKENDS)
        _choice("latent_mode", self.latent_mode, LATENT_MODES)
        _choice("encoder", self.encoder, ENCODERS)
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise InputError(f"batch_size must be a positive integer or None (automatic); got {self.batch_size!r}.")
        if not 0 <= int(self.extra_margin) <= 200:
            raise InputError(f"extra_margin must be between 0 and 200 pixels; got {self.extra_margin!r}. "
                             "The official app offers 0-40 (default 10).")
        for name in ("left_cheek_width", "right_cheek_width"):
            value = getattr(self, name)
            if not 0 <= int(value) <= 256:
                raise InputError(f"{name} must be between 0 and 256 (512-px parsing space); got {value!r}. "
                                 "The official app offers 20-160 (default 90).")
        if not -200 <= int(self.bbox_shift) <= 200:
            raise InputError(f"bbox_shift must be between -200 and 200 pixels; got {self.bbox_shift!r}.")
        if self.version == "v15" and self.bbox_shift != 0:
            # The official scripts force 0 for v1.5 (inference.py:93-94); the app does not (Q27). We follow the
            # app and allow it, since users tune it, and say so.
            self.reasons.setdefault("bbox_shift", "applied to v15 as the official app does (the scripts force 0)")
        if not 0.0 < float(self.blur_ratio) <= 0.5:
            raise InputError(f"blur_ratio must be in (0, 0.5]; got {self.blur_ratio!r}. Official: 0.05 offline, "
                             "0.1 realtime.")
        if self.smooth_boxes < 0:
            raise InputError(f"smooth_boxes must be >= 0 frames; got {self.smooth_boxes!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)
                                      or self.seed < 0):
            # the latent sampler takes a seed >= 0 (latents._base_seed): refused here, before any job starts
            raise InputError(f"seed must be a whole number >= 0; got {self.seed!r}.")
        if self.restore is not None:
            _choice("restore", self.restore, RESTORERS + (None,))
            warn_licence(self.restore)  # CodeFormer: non-commercial licence, said once per process
        if isinstance(self.restore_strength, bool) or not isinstance(self.restore_strength, (int, float)) \
                or not 0.0 <= float(self.restore_strength) <= 1.0:
            raise InputError(f"restore_strength must be a number from 0 (unrestored) to 1 (fully restored); got "
                             f"{self.restore_strength!r}.")
        if self.device is not None and not _DEVICE.fullmatch(str(self.device)):
            raise InputError(f"device must be 'cuda', 'cuda:N' (N = 0, 1, ...), 'cpu' or None (automatic); got "
                             f"{self.device!r}.")

    @property
    def effective_extra_margin(self) -> int:
        """Pixels added below the crop box: ``extra_margin`` for v15, 0 for v1 (``inference.py:170-172``)."""
        return int(self.extra_margin) if self.version == "v15" else 0

    @property
    def effective_parsing_mode(self) -> str:
        """Parsing mode used: v1 always ``raw`` (``inference.py:223-226``), v15 ``parsing_mode``."""
        return self.parsing_mode if self.version == "v15" else "raw"

    def replace(self, **changes: Any) -> InferenceConfig:
        """A copy with some fields changed (validated again). The copy has its own ``reasons`` dict."""
        changes.setdefault("reasons", dict(self.reasons))
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (without ``reasons``), e.g. for a cache fingerprint."""
        d = dataclasses.asdict(self)
        d.pop("reasons")
        return d


_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InputError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}.")


def warn_licence(name: str | None) -> None:
    """Warn (once per process) that CodeFormer is for non-commercial use only; no effect for the others."""
    global _warned_licence
    if name == "codeformer" and not _warned_licence:
        _warned_licence = True
        warnings.warn(NONCOMMERCIAL_NOTE, NbHelpersWarning, stacklevel=3)
