"""The inference settings: how one lip-sync job or avatar runs, for widgets, the CLI and the Python API alike."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..constants import COMPILE_MODES, ENCODERS, LATENT_MODES, VERSIONS
from ..errors import NbHelpersWarning
from .face import FACE_RULE, parse_face
from .fields import check, documented, setting

__all__ = ["LANDMARK_BACKENDS", "LATENT_MODES", "NONCOMMERCIAL_NOTE", "PARSING_MODES", "RESTORERS",
           "InferenceConfig", "warn_licence"]

PARSING_MODES = ("jaw", "raw", "neck")
LANDMARK_BACKENDS = ("auto", "dwpose", "dwpose-onnx", "mmpose", "dlib", "boxes")
RESTORERS = ("gfpgan", "restoreformer", "codeformer")  # face restorers of nbhelpers.restore (restore=None: off)
NONCOMMERCIAL_NOTE = ("CodeFormer is licensed for non-commercial use only (S-Lab License 1.0, "
                      "https://github.com/sczhou/CodeFormer/blob/master/LICENSE): do not use its output commercially. "
                      "GFPGAN and RestoreFormer are Apache-2.0.")
_warned_licence = False


@documented
@dataclass(frozen=True)
class InferenceConfig:
    """How one lip-sync job or avatar runs; each setting is checked when the config is made."""

    version: str = setting("v15", choices=VERSIONS, labels={"v15": "MuseTalk 1.5", "v1": "MuseTalk 1.0"},
                           label="Model version", source="scripts/inference.py --version (official-behaviour §10.1)",
                           help="the MuseTalk model version, not this program's: v15 (MuseTalk 1.5) or v1 (the 1.0 "
                                "weights through the current pipeline)")
    batch_size: int | None = setting(None, unit="frames", ge=1, none="automatic", key=False, label="batch (frames)",
                                     source="8 offline (scripts/inference.py:266), 20 realtime "
                                            "(scripts/realtime_inference.py:331)",
                                     help="frames per UNet/VAE batch; automatic: the planner's choice from the free "
                                          "GPU memory")
    fp16: bool | None = setting(None, none="automatic", flag="--fp16", flag_off="--fp32", key=False,
                                label="precision", help="half precision for the UNet, VAE, whisper and positional "
                                "encoding (--fp32: full precision); automatic: fp16 on a GPU that runs it well, a T4 "
                                "included, fp32 on the CPU")
    device: str | None = setting(None, pattern=r"cpu|cuda(:\d+)?", rule="'cuda', 'cuda:N' (N = 0, 1, ...), 'cpu'",
                                 none="automatic", key=False,
                                 help="where the models run: cuda, cuda:N or cpu; automatic: CUDA when available")
    extra_margin: int = setting(10, unit="pixels", ge=0, le=200, app_range=(0, 40), label="extra_margin (px)",
                                source="scripts/inference.py:170-172; app.py:502-515",
                                help="pixels added below the crop box so that the chin is inside (v15 only)")
    bbox_shift: int = setting(0, unit="pixels", ge=-200, le=200, label="bbox_shift (px)",
                              source="scripts/inference.py:93-94 force 0 for v15, app.py:73,264 do not "
                                     "(official-behaviour Q27)",
                              help="pixels added to landmark 29's y: + moves the repainted half's upper edge down "
                                   "(more mouth openness), - up; both versions, as the official app")
    parsing_mode: str = setting("jaw", choices=PARSING_MODES, label="parsing_mode",
                                source="musetalk/utils/face_parsing/__init__.py:93-108",
                                help="which face-parsing labels form the blend mask: jaw (v15 default, with the "
                                     "cheek widths), raw, neck; v1 always uses raw")
    left_cheek_width: int = setting(90, unit="pixels", ge=0, le=256, app_range=(20, 160), label="left cheek (px)",
                                    source="scripts/inference.py:272",
                                    help="the left cheek band of the jaw mask, in the 512-px parsing space")
    right_cheek_width: int = setting(90, unit="pixels", ge=0, le=256, app_range=(20, 160), label="right cheek (px)",
                                     source="scripts/inference.py:273",
                                     help="the right cheek band of the jaw mask, in the 512-px parsing space")
    landmark_backend: str = setting("auto", choices=LANDMARK_BACKENDS, flag="--backend",
                                    source="musetalk/utils/preprocessing.py:15-23 (DWPose through mmpose)",
                                    help="where the 68 face landmarks come from",
                                    meanings={"auto": "the first usable of mmpose, dwpose, dwpose-onnx, dlib",
                                              "dwpose": "DWPose in torch", "dwpose-onnx": "DWPose on onnxruntime",
                                              "mmpose": "DWPose through mmpose, as the official code",
                                              "dlib": "seconds on a CPU where DWPose takes minutes",
                                              "boxes": "the crop boxes given: no detection"})
    smooth_boxes: int = setting(0, unit="frames", ge=0,
                                help="temporal smoothing window of the crop boxes; 0 = off, the official behaviour")
    seed: int = setting(0, ge=0, lt=2**63, source="models/autoencoders/vae.py:93 samples unseeded "
                                                 "(official-behaviour Q1)",
                        help="seed of the VAE posterior's noise, so that a run repeats exactly (a whole number "
                             "from 0 to 2**63 - 1)")
    latent_mode: str = setting("sample", choices=LATENT_MODES, source="musetalk/models/vae.py:93",
                               help="latents from the VAE posterior: sample (official inference) or mode (its "
                                    "mean, as in training)")
    blur_ratio: float = setting(0.05, gt=0.0, le=0.5, source="musetalk/utils/blending.py:81 (0.05 offline), :134 "
                                                            "(0.1 realtime; official-behaviour Q10)",
                                help="feathering of the blend mask as a fraction of the face square: 0.05 offline "
                                     "(official), 0.1 realtime")
    encoder: str = setting("libx264-veryfast", choices=ENCODERS, label="video encoder",
                           labels={"libx264": "libx264 medium (the official, CRF 18)",
                                   **{c: c.replace("-", " ") for c in ENCODERS if c.startswith("libx264-")},
                                   "auto": "auto (NVENC if it works, else libx264 medium)", "nvenc": "NVENC (GPU)"},
                           source="scripts/inference.py:230-237 (the official: libx264, CRF 18, preset medium)",
                           help="video encoder: libx264-veryfast (CRF 18, the default: the same frames, encoded "
                                "several times faster than medium on 2 cores), libx264 (CRF 18, preset medium, the "
                                "official), libx264-fast ... libx264-ultrafast, nvenc/auto (h264_nvenc when a "
                                "one-frame test encode works, else libx264 medium with a warning)")
    restore: str | None = setting(None, choices=RESTORERS, none="off", label="face restoration",
                                  labels={None: "off", "gfpgan": "GFPGAN v1.4", "restoreformer": "RestoreFormer",
                                          "codeformer": "CodeFormer (non-commercial licence)"},
                                  help="restore the repainted face before paste-back, so only pixels under the blend "
                                       "mask change (not an official MuseTalk step; not cached in avatars). Needs "
                                       "spandrel and the weight set restore-<name>; codeformer is for "
                                       "NON-COMMERCIAL use only (S-Lab License 1.0)")
    restore_strength: float = setting(1.0, ge=0.0, le=1.0, label="restore strength",
                                      help="blend of restored and unrestored face: 0 = unrestored, 1 = restored "
                                           "only; used with restore")
    face: str | int = setting("largest", rule=FACE_RULE, label="face",
                              source="one face per frame officially (musetalk/utils/preprocessing.py:84-111)",
                              help="which face is repainted when the video shows several: largest (the backend's "
                                   "own pick per frame), a track number (from 0, in order of first appearance, left "
                                   "to right), a point x,y or box x1,y1,x2,y2 in frame 0 (x,y@12: in frame 12), or "
                                   "speaker (per stretch of speech, the face whose mouth moves with the audio; "
                                   "lip-sync only). Other faces pass through unchanged")
    compile: str = setting("auto", choices=COMPILE_MODES, key=False,
                           help="torch.compile the UNet, VAE, face parser and (offline) S3FD and DWPose on CUDA in the "
                                "background while the job starts eagerly; 'auto' where compiling can run (Triton, "
                                "compute capability 7.0+) and the GPU limits the job (under 200 TFLOP/s fp16, e.g. a "
                                "T4), 'on' wherever it can run, 'off' never")
    reasons: dict[str, str] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """Why automatic values were chosen (filled by ``gpu.plan``); not compared or hashed."""

    def __post_init__(self) -> None:
        check(self)
        choice = parse_face(self.face)
        if choice.kind in ("largest", "speaker", "track"):  # one spelling per choice (part of the avatar cache key)
            object.__setattr__(self, "face", choice.track if choice.kind == "track" else choice.kind)
        if self.version == "v15" and self.bbox_shift != 0:
            self.reasons.setdefault("bbox_shift", "applied to v15 as the official app does (the scripts force 0)")
        warn_licence(self.restore)  # CodeFormer: non-commercial licence, said once per process

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
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "reasons"}

    def output_settings(self) -> dict[str, Any]:
        """The settings that make what an output is (without device, precision, batch size and compile), as a
        plain dict: the key of a finished output."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("key")}


def warn_licence(name: str | None) -> None:
    """Warn (once per process) that CodeFormer is for non-commercial use only; no effect for the others."""
    global _warned_licence
    if name == "codeformer" and not _warned_licence:
        _warned_licence = True
        warnings.warn(NONCOMMERCIAL_NOTE, NbHelpersWarning, stacklevel=3)
