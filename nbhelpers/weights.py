"""The weight files: a manifest, a cache folder, downloads that survive real networks, and verification.

The layout is the official ``models/`` folder (reference §1.1), relative to one *weights dir*::

    musetalkV15/unet.pth  musetalkV15/musetalk.json        (core, v1.5 UNet, about 3.4 GB)
    sd-vae/config.json    sd-vae/diffusion_pytorch_model.safetensors   (or the official .bin)
    whisper/config.json   whisper/model.safetensors (or pytorch_model.bin)   whisper/preprocessor_config.json
    dwpose/dw-ll_ucoco_384.pth                           (faces: DWPose for the default dwpose backend and mmpose)
    dwpose/dw-ll_ucoco_384.onnx                          (faces-onnx: only for the optional dwpose-onnx backend)
    face-parse-bisent/79999_iter.pth                     (parsing)
    s3fd/s3fd-619a316812.pth                             (s3fd: the face box detector)
    musetalk/pytorch_model.bin  musetalk/musetalk.json   (v1: MuseTalk 1.0, only when asked)
    syncnet/latentsync_syncnet.pt                        (syncnet: training only, only when asked)
    syncnet/syncnet_v2.model                             (quality: the LSE-D / LSE-C score, only when asked)
    restore/GFPGANv1.4.pth  restore/RestoreFormer.pth  restore/codeformer.pth   (restore-*: face restoration)

>>> from nbhelpers import weights
>>> weights.list_files()                 # doctest: +SKIP  (the manifest as a table)
>>> weights.download()                   # doctest: +SKIP  (the v1.5 inference set, about 4.2 GB)
>>> weights.verify(weights.default_dir())  # doctest: +SKIP  (a table: ok / missing / truncated / ...)

Where the files go (:func:`default_dir`), in this order:

1. ``$NBHELPERS_WEIGHTS`` when set: any folder, for example a Google Drive folder shared with a whole workshop
   class, so that every session finds the files, verifies them and downloads nothing.
2. On Colab with Google Drive mounted: ``/content/drive/MyDrive/musetalk-workbook/models`` *if it already holds
   weight files* (a folder that an earlier session filled on purpose). Nothing is written to Drive unless you
   choose it (set the variable, or pass ``directory=``), because 4.2 GB is a third of a free Drive.
3. ``$XDG_CACHE_HOME/musetalk-workbook/models``, i.e. ``~/.cache/musetalk-workbook/models``.

How downloads work: each file has sources in order of preference (the Hugging Face hub through the installed
``huggingface_hub`` client, a Google Drive id through ``gdown``, plain HTTP mirrors). A source is tried up to
three times (the hub client resumes a cut transfer with a Range request; our HTTP mirror client resumes its
``.part`` file), the result is checked (size and sha256 from the hub's own metadata when it gives them, and a
look inside the file: HTML pages, git-lfs pointers and cut-off files are refused), and only then renamed into
place with ``os.replace``. A file that fails moves on to the next source. No package is ever installed or
upgraded. ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` are honoured (the token is never sent to a
mirror); partial downloads live in ``<weights dir>/.nbhelpers-downloads/``.

Facts about files (sizes, sha256) are marked *verified* or *unverified*. An unverified value is shown but never
turns into a "mismatch": :func:`verify` reports what it can prove, and says "unverifiable" otherwise. Facts the
hub reports at download time are recorded in ``<weights dir>/.nbhelpers-weights.json`` together with cached
sha256 results (keyed by size and modification time, so a second ``verify(deep=True)`` is instant).

Nothing here imports torch; importing this module is cheap and touches no network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import html
import importlib.resources
import json
import os
import pickle
import re
import shutil
import struct
import sys
import time
import warnings
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .errors import InputError, NbHelpersWarning, WeightsError

__all__ = [
    "ENV_VAR", "DEFAULT_SETS", "SETS", "MANIFEST", "Fact", "Source", "WeightFile", "Manifest", "FileTable",
    "Inspection", "FileCheck", "VerifyReport", "DownloadRow", "DownloadReport", "default_dir", "drive_dir",
    "list_files", "download", "verify", "check_job_files", "job_files", "inspect_file", "required_files", "missing_files", "expected_facts",
    "sha256_file", "is_tiny", "main",
]

ENV_VAR = "NBHELPERS_WEIGHTS"  # folder of the weights; wins over every other choice
DRIVE_DIR = Path("/content/drive/MyDrive/musetalk-workbook/models")  # used on Colab only if it already holds weights
STATE_FILE = ".nbhelpers-weights.json"  # hub facts recorded at download time + cached sha256 results
STAGING_DIR = ".nbhelpers-downloads"  # partial downloads (resumable), inside the weights dir: same filesystem
TINY_MARKER = "tiny.json"  # written by nbhelpers.testing.make_tiny_weights: random tiny test weights
HF_MIRROR = "https://hf-mirror.com"  # the mirror both official download scripts use (download_weights.sh:14)
DOWNLOAD_COMMAND = "python -m nbhelpers download"
NOTEBOOK = "notebooks/01_weights.ipynb"
ATTEMPTS_PER_SOURCE = 3  # tries of one source before moving to the next (each try resumes where possible)
RETRY_DELAY_S = 1.0  # seconds between tries of one source
HTTP_TIMEOUT_S = 30.0  # seconds without data before a plain-HTTP transfer is considered stalled
_CHUNK = 1 << 20  # bytes per read when streaming or hashing (1 MiB)
_GB = 1e9


# ---------------------------------------------------------------------------------------------------------------
# Manifest
# ---------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Fact:
    """One known value about a file (a size in bytes or a sha256), and how much it can be trusted.

    Attributes:
        value: The size in bytes (int) or the lowercase hex sha256 (str; for ``sha256_prefix`` the first digits).
        verified: True when checked against the real file; unverified values are shown, never used to declare a
            file bad.
        source: Where the value comes from (a reference section, the hub, a convention).
    """

    value: int | str
    verified: bool = False
    source: str = ""


@dataclasses.dataclass(frozen=True)
class Source:
    """One place a weight file can be fetched from.

    Attributes:
        kind: ``"hub"`` (Hugging Face hub through ``huggingface_hub``), ``"gdrive"`` (a Google Drive file id
            through ``gdown``), ``"url"`` (plain HTTP(S), resumed with Range requests) or ``"bundled"`` (a
            config shipped inside this package).
        repo: Hub repository id (``kind="hub"``), e.g. ``"TMElyralab/MuseTalk"``.
        filename: Path of the file inside the hub repository.
        revision: Hub branch, tag or commit.
        endpoint: Hub endpoint for a mirror (e.g. ``https://hf-mirror.com``); None = the library's own
            (``HF_ENDPOINT`` or huggingface.co). The token is never sent to a non-default endpoint.
        id: Google Drive file id (``kind="gdrive"``).
        url: The address (``kind="url"``).
        resource: File name under ``nbhelpers/configs`` (``kind="bundled"``).
    """

    kind: str
    repo: str = ""
    filename: str = ""
    revision: str = "main"
    endpoint: str | None = None
    id: str = ""
    url: str = ""
    resource: str = ""

    def describe(self) -> str:
        """One line naming the source, e.g. ``hub TMElyralab/MuseTalk: musetalkV15/unet.pth``."""
        if self.kind == "hub":
            where = f" via {self.endpoint}" if self.endpoint else ""
            return f"hub {self.repo}: {self.filename}{where}"
        if self.kind == "gdrive":
            return f"Google Drive id {self.id}"
        if self.kind == "url":
            return f"URL {self.url}"
        return f"bundled nbhelpers/configs/{self.resource}"

    def address(self) -> str:
        """A URL a person can open in a browser to fetch the file by hand."""
        if self.kind == "hub":
            endpoint = (self.endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
            return f"{endpoint}/{self.repo}/resolve/{self.revision}/{self.filename}"
        if self.kind == "gdrive":
            return f"https://drive.google.com/uc?id={self.id}"
        if self.kind == "url":
            return self.url
        return f"nbhelpers/configs/{self.resource}"


@dataclasses.dataclass(frozen=True)
class WeightFile:
    """One file of the weights layout.

    Attributes:
        name: Short unique name (``"unet-v15"``); :func:`download` and :func:`verify` accept it (or ``path``).
        path: Path relative to the weights dir, in the official layout (POSIX separators).
        sets: Sets the file belongs to (``"core"``, ``"faces-onnx"``, ...).
        format: ``"torch"`` (torch.save: zip or legacy pickle), ``"safetensors"``, ``"json"`` or ``"onnx"``.
        sources: Where to fetch it, in order of preference.
        size: Exact size in bytes, if known.
        sha256: Hex sha256, if known.
        sha256_prefix: Leading hex digits of the sha256 (torch.hub's file-name convention), if known.
        approx_bytes: An estimate of the size (for planning and display only; never used to judge a file).
        alternates: Other layout paths that hold the same content in another format (the official scripts
            fetch ``.bin`` files where we prefer safetensors); a present alternate satisfies the entry.
        description: What the file is.
        cited: Where the facts come from (reference document section and official file:line).
    """

    name: str
    path: str
    sets: tuple[str, ...]
    format: str
    sources: tuple[Source, ...]
    size: Fact | None = None
    sha256: Fact | None = None
    sha256_prefix: Fact | None = None
    approx_bytes: int | None = None
    alternates: tuple[str, ...] = ()
    description: str = ""
    cited: str = ""

    def expected_text(self) -> str:
        """The size as a person should read it, marked verified / unverified / estimate."""
        if self.size is not None:
            mark = "verified" if self.size.verified else "unverified"
            return f"{_human(int(self.size.value))} ({mark})"
        if self.approx_bytes:
            return f"~{_human(self.approx_bytes)} (estimate)"
        return "unknown"


def _hub(repo: str, filename: str, mirror: bool = True) -> tuple[Source, ...]:
    first = Source("hub", repo=repo, filename=filename)
    return (first, Source("hub", repo=repo, filename=filename, endpoint=HF_MIRROR)) if mirror else (first,)


_MUSETALK = "TMElyralab/MuseTalk"
_VAE = "stabilityai/sd-vae-ft-mse"
_WHISPER = "openai/whisper-tiny"
_DWPOSE = "yzd-v/DWPose"

# Sizes: "estimate" values are derived from parameter counts (4 bytes per float32 value) of the key lists in
# shared/reference/checkpoints and of the configs; none was checked against the real files (no hub access here).
_ENTRIES: tuple[WeightFile, ...] = (
    WeightFile(
        "unet-v15", "musetalkV15/unet.pth", ("core",), "torch", _hub(_MUSETALK, "musetalkV15/unet.pth"),
        sha256=Fact("7ebf6c98c181e20838e4c0054e96e944ac60d5d692cc01db42839fe11b787007", False,
                    "a third-party page (reference §1.1)"),
        approx_bytes=3_399_791_376,
        description="MuseTalk 1.5 UNet, torch.save of a plain diffusers UNet2DConditionModel state dict "
                    "(849.9 M float32 values)",
        cited="reference §1.1-1.2; download_weights.sh:22-24, unet.py:44-45"),
    WeightFile(
        "unet-v15-config", "musetalkV15/musetalk.json", ("core",), "json",
        (*_hub(_MUSETALK, "musetalkV15/musetalk.json"), Source("bundled", resource="musetalkV15-unet.json")),
        approx_bytes=800,
        description="UNet2DConditionModel kwargs (v1.5); the bundled copy is reference/configs/musetalkV15-unet.json",
        cited="reference §1.3; download_weights.sh:22-24"),
    WeightFile(
        "vae-config", "sd-vae/config.json", ("core",), "json", _hub(_VAE, "config.json"), approx_bytes=550,
        description="AutoencoderKL config of sd-vae-ft-mse", cited="reference §1.1; download_weights.sh:27-29"),
    WeightFile(
        "vae", "sd-vae/diffusion_pytorch_model.safetensors", ("core",), "safetensors",
        _hub(_VAE, "diffusion_pytorch_model.safetensors"), approx_bytes=334_640_000,
        alternates=("sd-vae/diffusion_pytorch_model.bin",),
        description="sd-vae-ft-mse weights (83.7 M values); the official script fetches the .bin, which also "
                    "works",
        cited="reference §1.1; download_weights.sh:27-29, vae.py:24"),
    WeightFile(
        "whisper-config", "whisper/config.json", ("core",), "json", _hub(_WHISPER, "config.json"),
        approx_bytes=2_000, description="whisper-tiny config", cited="reference §1.1; download_weights.sh:32-34"),
    WeightFile(
        "whisper", "whisper/model.safetensors", ("core",), "safetensors", _hub(_WHISPER, "model.safetensors"),
        approx_bytes=151_060_000, alternates=("whisper/pytorch_model.bin",),
        description="whisper-tiny weights (37.8 M values; only the encoder is used); safetensors because recent "
                    "transformers refuse .bin files on torch < 2.6",
        cited="reference §1.1; download_weights.sh:32-34, inference.py:64-66"),
    WeightFile(
        "whisper-preprocessor", "whisper/preprocessor_config.json", ("core",), "json",
        _hub(_WHISPER, "preprocessor_config.json"),
        description="WhisperFeatureExtractor settings (80 mel bins, hop 160, 30 s chunks)",
        cited="reference §1.1; download_weights.sh:32-34"),
    WeightFile(
        "dwpose-mmpose", "dwpose/dw-ll_ucoco_384.pth", ("faces", "faces-mmpose"), "torch",
        _hub(_DWPOSE, "dw-ll_ucoco_384.pth"), approx_bytes=134_600_000,
        description="DWPose mmengine checkpoint (state dict of 33.6 M values plus metadata; the estimate is a lower "
                    "bound): the default landmark backend 'dwpose' (plain torch) and the exact mmpose path read it",
        cited="reference §1.1; download_weights.sh:37-39, preprocessing.py:18-19"),
    WeightFile(
        "dwpose-onnx", "dwpose/dw-ll_ucoco_384.onnx", ("faces-onnx",), "onnx", _hub(_DWPOSE, "dw-ll_ucoco_384.onnx"),
        approx_bytes=134_600_000,
        description="DWPose RTMPose-l 384x288 whole-body, ONNX export (33.6 M values): only for the optional "
                    "'dwpose-onnx' backend (onnxruntime)",
        cited="hub yzd-v/DWPose (the same repository as the .pth)"),
    WeightFile(
        "bisenet", "face-parse-bisent/79999_iter.pth", ("parsing",), "torch",
        (Source("hub", repo="ManyOtherFunctions/face-parse-bisent", filename="79999_iter.pth"),
         Source("gdrive", id="154JgKpzCPW82qINcVieuPH3fZ2e0P812"),
         Source("hub", repo="ManyOtherFunctions/face-parse-bisent", filename="79999_iter.pth", endpoint=HF_MIRROR)),
        approx_bytes=53_300_000,
        description="BiSeNet face parsing, 19 classes (face-parsing.PyTorch), plain state dict; the ResNet-18 "
                    "ImageNet file of the official script is not needed (it is fully overwritten)",
        cited="reference §1.1; download_weights.sh:47, download_weights.bat:38, face_parsing/__init__.py:61-67"),
    WeightFile(
        "s3fd", "s3fd/s3fd-619a316812.pth", ("s3fd",), "torch",
        (Source("url", url="https://www.adrianbulat.com/downloads/python-fan/s3fd-619a316812.pth"),),
        sha256_prefix=Fact("619a316812", False, "torch.hub file-name convention (<name>-<first sha256 digits>)"),
        approx_bytes=89_840_000,
        description="S3FD face detector (22.5 M values); the official code fetches it at import time",
        cited="reference §1.1; sfd_detector.py:11-13,17-24"),
    WeightFile(
        "unet-v1", "musetalk/pytorch_model.bin", ("v1",), "torch", _hub(_MUSETALK, "musetalk/pytorch_model.bin"),
        approx_bytes=3_399_791_376,
        description="MuseTalk 1.0 UNet (same architecture as v1.5), plain state dict",
        cited="reference §1.1-1.3; download_weights.sh:17-19"),
    WeightFile(
        "unet-v1-config", "musetalk/musetalk.json", ("v1",), "json",
        (*_hub(_MUSETALK, "musetalk/musetalk.json"), Source("bundled", resource="musetalkV15-unet.json")),
        approx_bytes=800,
        description="UNet config (v1.0); v1.0 and v1.5 share the architecture (reference §1.3), so the bundled "
                    "v1.5 config is the last-resort source",
        cited="reference §1.3; download_weights.sh:17-19, training_utils.py:66-73"),
    WeightFile(
        "syncnet", "syncnet/latentsync_syncnet.pt", ("syncnet",), "torch",
        _hub("ByteDance/LatentSync", "latentsync_syncnet.pt"),
        description="LatentSync SyncNet: training only (the official app.py refuses to start without it)",
        cited="reference §1.1; download_weights.sh:42-44, app.py:139,149-159"),
    WeightFile(
        "syncnet-v2", "syncnet/syncnet_v2.model", ("quality",), "torch",
        (*_hub("ByteDance/LatentSync-1.5", "auxiliary/syncnet_v2.model"),
         Source("url", url="https://www.robots.ox.ac.uk/~vgg/software/lipsync/data/syncnet_v2.model")),
        approx_bytes=54_526_464,
        description="SyncNet v2 (Chung & Zisserman 2016), a plain state dict of 13.6 M float32 values: the "
                    "LSE-D / LSE-C lip-sync score of nbhelpers.quality (optional)",
        cited="syncnet_python download_model.sh, SyncNetInstance.py loadParameters; LatentSync "
              "checkpoints/auxiliary"),
    # Face restoration (nbhelpers.restore, optional). Sizes are estimates from public download listings (about 348,
    # 280 and 376 MB); no hash was checked here (no network to the release hosts).
    WeightFile(
        "gfpgan-v1.4", "restore/GFPGANv1.4.pth", ("restore-gfpgan",), "torch",
        (Source("url", url="https://github.com/TencentARC/GFPGAN/releases/download/v1.3.0/GFPGANv1.4.pth"),),
        approx_bytes=348_000_000,
        description="GFPGAN v1.4 (GFPGANv1Clean, 512x512 faces), torch.save of {'params_ema': state dict}: "
                    "optional face restoration of the repainted crop (Apache-2.0)",
        cited="GFPGAN inference_gfpgan.py (version 1.4 URL), gfpgan/utils.py (params_ema / params)"),
    WeightFile(
        "restoreformer", "restore/RestoreFormer.pth", ("restore-restoreformer",), "torch",
        (Source("url", url="https://github.com/TencentARC/GFPGAN/releases/download/v1.3.4/RestoreFormer.pth"),),
        approx_bytes=290_000_000,
        description="RestoreFormer as released with GFPGAN 1.3.4 (512x512 faces), {'params_ema': state dict}: "
                    "optional face restoration of the repainted crop (Apache-2.0)",
        cited="GFPGAN inference_gfpgan.py (version RestoreFormer URL), gfpgan/archs/restoreformer_arch.py"),
    WeightFile(
        "codeformer", "restore/codeformer.pth", ("restore-codeformer",), "torch",
        (Source("url", url="https://github.com/sczhou/CodeFormer/releases/download/v0.1.0/codeformer.pth"),),
        approx_bytes=376_000_000,
        description="CodeFormer v0.1.0 (512x512 faces), {'params_ema': state dict}: optional face restoration; "
                    "NON-COMMERCIAL licence (S-Lab License 1.0)",
        cited="CodeFormer inference_codeformer.py (pretrain_model_url, torch.load(...)['params_ema'])"),
)

SETS: dict[str, str] = {
    "core": "MuseTalk 1.5 UNet + config, sd-vae-ft-mse, whisper-tiny (needed for every run)",
    "faces": "DWPose checkpoint, the official .pth (the default landmark backend 'dwpose', and mmpose)",
    "faces-onnx": "DWPose as ONNX (the optional 'dwpose-onnx' backend, onnxruntime)",
    "faces-mmpose": "DWPose checkpoint for the exact official landmarks through mmpose (the same file as 'faces')",
    "parsing": "BiSeNet face parsing (the blending mask)",
    "s3fd": "S3FD face detector (the face box for the DWPose backends)",
    "v1": "MuseTalk 1.0 UNet + config (only for version='v1')",
    "syncnet": "LatentSync SyncNet (training only)",
    "quality": "SyncNet v2 for the LSE-D / LSE-C lip-sync score (nbhelpers.quality.sync_score)",
    "restore-gfpgan": "GFPGAN v1.4 face restoration of the repainted crop (restore='gfpgan', Apache-2.0)",
    "restore-restoreformer": "RestoreFormer face restoration (restore='restoreformer', Apache-2.0)",
    "restore-codeformer": "CodeFormer face restoration (restore='codeformer'; non-commercial licence)",
}
DEFAULT_SETS: tuple[str, ...] = ("core", "faces", "parsing", "s3fd")  # the v1.5 inference set, ~4.2 GB
_ALIASES = {"default": DEFAULT_SETS, "v15": ("core",), "all": tuple(SETS)}


class Manifest(tuple):
    """The weight files (a tuple of :class:`WeightFile`) with lookups by name, path and set."""

    def __new__(cls, entries: Iterable[WeightFile]):
        self = super().__new__(cls, tuple(entries))
        names = [e.name for e in self]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate names in the manifest: {names}")
        return self

    @property
    def sets(self) -> tuple[str, ...]:
        """Every set name used by an entry, in first-use order."""
        seen: dict[str, None] = {}
        for entry in self:
            for s in entry.sets:
                seen.setdefault(s, None)
        return tuple(seen)

    def get(self, name: str) -> WeightFile:
        """The entry called ``name`` (its short name, layout path or alternate path).

        Args:
            name: E.g. ``"unet-v15"``, ``"musetalkV15/unet.pth"`` or ``"whisper/pytorch_model.bin"``.

        Returns:
            The :class:`WeightFile`.

        Raises:
            InputError: Unknown name; the message lists the valid names.
        """
        for entry in self:
            if name in (entry.name, entry.path, *entry.alternates):
                return entry
        raise InputError(f"unknown weight file {name!r}. Valid names: {', '.join(e.name for e in self)} "
                         f"(or their paths, e.g. {self[0].path!r}). See weights.list_files().")

    def select(self, sets: str | Sequence[str] | None = None,
               files: str | Sequence[str] | None = None) -> list[WeightFile]:
        """Entries of the given sets and/or file names, in manifest order.

        Args:
            sets: Set names (``"core"``, ``"faces-onnx"``, ... or ``"default"``, ``"all"``); None = the default
                sets when ``files`` is None too, else no set.
            files: Extra file names or layout paths.

        Returns:
            The selected entries, each once.

        Raises:
            InputError: An unknown set or file name; the message lists the valid ones.
        """
        if isinstance(sets, str):
            sets = [sets]
        if isinstance(files, str):
            files = [files]
        if sets is None:
            sets = DEFAULT_SETS if not files else ()
        wanted: set[str] = set()
        for s in sets:
            if s in _ALIASES:
                wanted.update(_ALIASES[s])
            elif s in self.sets:
                wanted.add(s)
            else:
                raise InputError(f"unknown weight set {s!r}. Valid sets: {', '.join(self.sets)} (and "
                                 f"{', '.join(_ALIASES)}); valid file names: {', '.join(e.name for e in self)}.")
        chosen = {self.get(f).name for f in (files or ())}
        return [e for e in self if e.name in chosen or wanted.intersection(e.sets)]


MANIFEST = Manifest(_ENTRIES)


def required_files(version: str = "v15", parsing: bool = True) -> list[str]:
    """Layout paths (relative to the weights dir) that a lip-sync job of ``version`` needs.

    Face-landmark files are not listed: which ones are needed depends on the landmark backend.

    Args:
        version: ``"v15"`` or ``"v1"``.
        parsing: Include the BiSeNet face-parsing file.

    Returns:
        Relative POSIX paths, e.g. ``["musetalkV15/unet.pth", ...]``.

    Raises:
        InputError: Unknown version.

    Source: reference §1.1 (the files inference.py, vae.py and face_parsing/__init__.py open).
    """
    if version not in ("v15", "v1"):
        raise InputError(f"version must be 'v15' or 'v1'; got {version!r}.")
    names = [e.name for e in MANIFEST.select("core")]
    if version == "v1":
        names = [n for n in names if not n.startswith("unet-v15")] + ["unet-v1", "unet-v1-config"]
    if parsing:
        names.append("bisenet")
    return [MANIFEST.get(n).path for n in names]


def missing_files(directory: str | os.PathLike, paths: Sequence[str]) -> list[str]:
    """Which of ``paths`` (layout paths) are absent from ``directory``; a present alternate counts as present.

    Args:
        directory: The weights dir.
        paths: Layout paths, e.g. from :func:`required_files`.

    Returns:
        The missing ones, in the given order.

    Source: reference §1.1 (download_weights.sh fetches .bin files where we prefer safetensors).
    """
    root = Path(directory)
    out = []
    for rel in paths:
        alts: tuple[str, ...] = ()
        for entry in MANIFEST:
            if entry.path == rel:
                alts = entry.alternates
        if not any((root / p).is_file() for p in (rel, *alts)):
            out.append(rel)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Tables that render in notebooks and terminals
# ---------------------------------------------------------------------------------------------------------------

def _human(n: int | float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(str(c))) for w, c in zip(widths, row, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), fmt.format(*["-" * w for w in widths])]
    lines += [fmt.format(*[str(c) for c in row]) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "",
                row_styles: Sequence[str] | None = None) -> str:
    out = ['<table style="border-collapse:collapse;font-size:90%">']
    if caption:
        out.append(f'<caption style="text-align:left;font-weight:bold">{html.escape(caption)}</caption>')
    out.append("<tr>" + "".join(f'<th style="text-align:left;padding:2px 8px">{html.escape(h)}</th>'
                                for h in headers) + "</tr>")
    for i, row in enumerate(rows):
        style = f' style="{row_styles[i]}"' if row_styles and row_styles[i] else ""
        out.append(f"<tr{style}>" + "".join(f'<td style="padding:2px 8px">{html.escape(str(c))}</td>'
                                            for c in row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


@dataclasses.dataclass(frozen=True)
class FileTable:
    """The manifest (or a selection of it) as a table; renders as HTML in notebooks, text elsewhere.

    Attributes:
        entries: The listed files.
    """

    entries: tuple[WeightFile, ...]

    @property
    def approx_total_bytes(self) -> int:
        """Sum of the known or estimated sizes, in bytes (files with no estimate count 0)."""
        return sum(int(e.size.value) if e.size else (e.approx_bytes or 0) for e in self.entries)

    def _rows(self) -> list[list[str]]:
        rows = []
        for e in self.entries:
            if e.sha256 is not None:
                sha = f"{str(e.sha256.value)[:12]}... ({'verified' if e.sha256.verified else 'unverified'})"
            elif e.sha256_prefix is not None:
                sha = f"{e.sha256_prefix.value}... (prefix, unverified)"
            else:
                sha = "unknown (the hub's value is recorded at download)"
            rows.append([e.name, ", ".join(e.sets), e.path, e.expected_text(), sha,
                         " | ".join(s.describe() for s in e.sources)])
        return rows

    _HEADERS = ("name", "sets", "path", "size", "sha256", "sources (in order)")

    def __str__(self) -> str:
        return (_text_table(self._HEADERS, self._rows())
                + f"\n{len(self.entries)} files, about {self.approx_total_bytes / _GB:.2f} GB")

    def _repr_html_(self) -> str:
        return _html_table(self._HEADERS, self._rows(),
                           caption=f"{len(self.entries)} weight files, about "
                                   f"{self.approx_total_bytes / _GB:.2f} GB")

    def __repr__(self) -> str:
        return str(self)


def list_files(sets: str | Sequence[str] | None = "all", manifest: Manifest | None = None) -> FileTable:
    """The manifest as a table: name, sets, layout path, size, sha256 and sources of each file.

    Args:
        sets: Which sets to list (default ``"all"``; ``None`` or ``"default"`` = the v1.5 inference set).
        manifest: Another manifest (tests); default :data:`MANIFEST`.

    Returns:
        :class:`FileTable` (HTML in a notebook, text in a terminal; ``approx_total_bytes`` for planning).

    Raises:
        InputError: An unknown set name; the message lists the valid ones.

    Source: none in the official code (no size or checksum is stated anywhere, reference §1.1).
    """
    manifest = MANIFEST if manifest is None else manifest
    return FileTable(tuple(manifest.select(sets)))


# ---------------------------------------------------------------------------------------------------------------
# Where the files live
# ---------------------------------------------------------------------------------------------------------------

def _on_colab() -> bool:
    return "google.colab" in sys.modules or bool(os.environ.get("COLAB_RELEASE_TAG"))


def _holds_weights(folder: Path, manifest: Manifest | None = None) -> bool:
    manifest = MANIFEST if manifest is None else manifest
    try:
        return any((folder / p).is_file() for e in manifest for p in (e.path, *e.alternates))
    except OSError:
        return False


def drive_dir() -> Path:
    """The Google Drive folder used on Colab (``/content/drive/MyDrive/musetalk-workbook/models``).

    Point ``NBHELPERS_WEIGHTS`` at it (or pass it as ``directory=``) to keep the weights on Drive across
    sessions; once it holds weights, :func:`default_dir` picks it by itself.

    Source: none in the official code (its models/ folder lives under the repository root, §1.1).
    """
    return DRIVE_DIR


def default_dir() -> Path:
    """The weights dir used when none is given.

    Order: (1) ``$NBHELPERS_WEIGHTS``; (2) on Colab with Drive mounted, :func:`drive_dir` if it already holds
    weight files; (3) ``$XDG_CACHE_HOME/musetalk-workbook/models`` (``~/.cache/musetalk-workbook/models``).
    The folder is not created here.

    Returns:
        An absolute path (``~`` expanded).

    Source: the official scripts use ``models/`` under the repository root (reference §1.1); a notebook has no
    such root, hence a cache folder.
    """
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    if _on_colab() and DRIVE_DIR.is_dir() and _holds_weights(DRIVE_DIR):
        return DRIVE_DIR
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return (base / "musetalk-workbook" / "models").absolute()


def is_tiny(directory: str | os.PathLike) -> bool:
    """True when ``directory`` holds tiny random test weights (``tiny.json`` from ``make_tiny_weights``).

    Args:
        directory: The weights dir.

    Source: none in the official code (test support).
    """
    return (Path(directory) / TINY_MARKER).is_file()


# ---------------------------------------------------------------------------------------------------------------
# Looking inside files (no torch needed)
# ---------------------------------------------------------------------------------------------------------------

OK = "ok"
MISSING = "missing"
WRONG_SIZE = "wrong size"
HTML_PAGE = "HTML page"
LFS_POINTER = "git-lfs pointer"
TRUNCATED = "truncated"
HASH_MISMATCH = "hash mismatch"
CORRUPT = "corrupt"
UNVERIFIABLE = "unverifiable"
BAD_STATES = frozenset({MISSING, WRONG_SIZE, HTML_PAGE, LFS_POINTER, TRUNCATED, HASH_MISMATCH, CORRUPT})


@dataclasses.dataclass(frozen=True)
class Inspection:
    """What a look inside a file found.

    Attributes:
        state: ``"ok"`` (the structure is complete), ``"HTML page"``, ``"git-lfs pointer"``, ``"truncated"``,
            ``"corrupt"`` or ``"unverifiable"`` (a format whose completeness cannot be judged from inside).
        detail: One sentence saying what was checked or found.
        container: ``"zip"``, ``"legacy-pickle"``, ``"safetensors"``, ``"json"``, ``"onnx"`` or ``""``.
    """

    state: str
    detail: str
    container: str = ""

    @property
    def bad(self) -> bool:
        """True for HTML pages, git-lfs pointers, truncated and corrupt files."""
        return self.state in BAD_STATES


_FORMAT_BY_SUFFIX = {".pth": "torch", ".pt": "torch", ".bin": "torch", ".ckpt": "torch",
                     ".safetensors": "safetensors", ".json": "json", ".onnx": "onnx"}
_LFS_PREFIX = b"version https://git-lfs.github.com/spec/"


def _looks_html(head: bytes) -> bool:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return (text.startswith((b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml"))
            or (text.startswith(b"<") and (b"<html" in text[:4096] or b"<body" in text[:4096])))


def inspect_file(path: str | os.PathLike, fmt: str | None = None) -> Inspection:
    """Look inside a weight file (headers and directory records only; fast even for 3.4 GB) without torch.

    Detects a web page saved under a weight name (Google Drive quota pages, login pages), a git-lfs pointer
    (a repository cloned without git-lfs), and cut-off files: a torch zip without its end-of-central-directory
    record or whose members run past the end, a legacy torch pickle whose tensor data runs past the end, a
    safetensors header declaring more data than the file holds, an ONNX protobuf whose last field runs past
    the end, an unparseable JSON file.

    Args:
        path: The file.
        fmt: ``"torch"``, ``"safetensors"``, ``"json"`` or ``"onnx"``; None = from the suffix.

    Returns:
        :class:`Inspection`.

    Raises:
        WeightsError: The file does not exist or cannot be read.

    Source: none in the official code (it calls torch.load directly, unet.py:44); failure kind F11.
    """
    path = Path(path)
    fmt = fmt or _FORMAT_BY_SUFFIX.get(path.suffix.lower(), "")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise WeightsError(f"cannot read weight file {path}: {exc}") from exc
    if size == 0:
        return Inspection(TRUNCATED, "the file is empty (0 bytes)")
    if head.startswith(_LFS_PREFIX):
        info = dict(re.findall(r"^(oid sha256|size) (\S+)$", head.decode("utf-8", "replace"), re.M))
        real = f" (the real file: {info.get('size', '?')} bytes, sha256 {info.get('oid sha256', '?')})" if info else ""
        return Inspection(LFS_POINTER, f"a git-lfs pointer of {size} bytes, not the file{real}")
    if _looks_html(head) and fmt != "onnx":
        title = re.search(rb"<title>(.*?)</title>", head, re.I | re.S)
        shown = f" titled {title.group(1).decode('utf-8', 'replace').strip()[:80]!r}" if title else ""
        return Inspection(HTML_PAGE, f"a web page{shown} ({size} bytes), not the file")
    try:
        if fmt == "torch":
            return _inspect_torch(path, size, head)
        if fmt == "safetensors":
            return _inspect_safetensors(path, size, head)
        if fmt == "json":
            return _inspect_json(path, size)
        if fmt == "onnx":
            return _inspect_onnx(path, size)
    except OSError as exc:
        raise WeightsError(f"cannot read weight file {path}: {exc}") from exc
    return Inspection(UNVERIFIABLE, f"no structural check for format {fmt or path.suffix!r}")


def _inspect_torch(path: Path, size: int, head: bytes) -> Inspection:
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as zf:
                infos = zf.infolist()
        except (zipfile.BadZipFile, EOFError, ValueError) as exc:
            return Inspection(TRUNCATED, f"a torch zip file without a readable central directory ({exc}): cut "
                                         f"off at {size} bytes", "zip")
        if not infos:
            return Inspection(CORRUPT, "an empty zip archive", "zip")
        end = max(i.header_offset + 30 + len(i.filename.encode()) + len(i.extra) + i.compress_size for i in infos)
        if end > size:
            return Inspection(TRUNCATED, f"zip members run to byte {end} but the file has {size}", "zip")
        if not any(i.filename.endswith("data.pkl") for i in infos):
            return Inspection(CORRUPT, "a zip archive without data.pkl: not a torch.save file", "zip")
        return Inspection(OK, f"torch zip complete ({len(infos)} members)", "zip")
    if head[:1] == b"\x80":
        return _inspect_legacy_torch(path, size)
    return Inspection(CORRUPT, f"not a torch file (starts with {head[:16]!r})")


class _Stub:
    """Stand-in for every class a legacy torch pickle names; nothing outside this module is imported."""

    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any):
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any):
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


_ELEMENT_BYTES = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
                  "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
                  "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16}


class _SkimUnpickler(pickle.Unpickler):
    """Reads the structure of a legacy torch pickle without importing or running anything it names."""

    def __init__(self, f: Any):
        super().__init__(f)
        self.storages: dict[str, str] = {}

    def find_class(self, module: str, name: str) -> type:
        return type(name, (_Stub,), {"qualname": f"{module}.{name}"})

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage":
            kind = getattr(pid[1], "qualname", str(pid[1])).rsplit(".", 1)[-1]
            self.storages[str(pid[2])] = kind
        return _Stub()


def _inspect_legacy_torch(path: Path, size: int) -> Inspection:
    with open(path, "rb") as f:
        try:
            magic = _SkimUnpickler(f).load()
            if magic != 0x1950A86A20F9469CFC6C:
                return Inspection(UNVERIFIABLE, "a pickle that is not a legacy torch.save file; its completeness "
                                                "cannot be judged", "legacy-pickle")
            _SkimUnpickler(f).load()  # protocol version
            _SkimUnpickler(f).load()  # system info
            body = _SkimUnpickler(f)
            body.load()
            keys = _SkimUnpickler(f).load()
        except (EOFError, pickle.UnpicklingError) as exc:
            if isinstance(exc, EOFError) or "truncated" in str(exc):
                return Inspection(TRUNCATED, f"a legacy torch pickle cut off inside its header ({size} bytes)",
                                  "legacy-pickle")
            return Inspection(CORRUPT, f"a legacy torch pickle with a damaged header ({exc})", "legacy-pickle")
        except Exception as exc:  # noqa: BLE001 - any unpickling failure means the header is damaged
            return Inspection(CORRUPT, f"a legacy torch pickle with a damaged header ({type(exc).__name__}: "
                                       f"{exc})", "legacy-pickle")
        pos = f.tell()
        for key in keys if isinstance(keys, list) else []:
            elem = _ELEMENT_BYTES.get(body.storages.get(str(key), ""))
            if elem is None:
                return Inspection(UNVERIFIABLE, f"legacy torch pickle with an unknown storage type "
                                                f"{body.storages.get(str(key))!r}", "legacy-pickle")
            f.seek(pos)
            raw = f.read(8)
            if len(raw) < 8:
                return Inspection(TRUNCATED, f"legacy torch pickle cut off at {size} bytes (tensor data missing)",
                                  "legacy-pickle")
            (count,) = struct.unpack("<q", raw)
            pos += 8 + count * elem
            if pos > size:
                return Inspection(TRUNCATED, f"legacy torch pickle: tensor data runs to byte {pos} but the file "
                                             f"has {size}", "legacy-pickle")
    return Inspection(OK, f"legacy torch pickle complete ({len(keys)} storages)", "legacy-pickle")


def _inspect_safetensors(path: Path, size: int, head: bytes) -> Inspection:
    if size < 8:
        return Inspection(TRUNCATED, f"only {size} bytes: no safetensors header", "safetensors")
    (n,) = struct.unpack("<Q", head[:8])
    if n > 100_000_000:
        return Inspection(CORRUPT, f"not a safetensors file (header length {n})", "safetensors")
    if 8 + n > size:
        return Inspection(TRUNCATED, f"the safetensors header needs {8 + n} bytes but the file has {size}",
                          "safetensors")
    with open(path, "rb") as f:
        f.seek(8)
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as exc:
        return Inspection(CORRUPT, f"the safetensors header is not JSON ({exc})", "safetensors")
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    need = 8 + n + max(ends, default=0)
    if need > size:
        return Inspection(TRUNCATED, f"the safetensors header declares {need} bytes but the file has {size}",
                          "safetensors")
    if need < size:
        return Inspection(CORRUPT, f"{size - need} bytes after the last tensor (the header declares {need})",
                          "safetensors")
    return Inspection(OK, f"safetensors complete ({len(ends)} tensors)", "safetensors")


def _inspect_json(path: Path, size: int) -> Inspection:
    if size > 50_000_000:
        return Inspection(UNVERIFIABLE, f"a {size}-byte JSON file is not parsed", "json")
    text = path.read_bytes()
    try:
        json.loads(text.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        return Inspection(CORRUPT, f"not UTF-8 JSON ({exc})", "json")
    except json.JSONDecodeError as exc:
        state = TRUNCATED if exc.pos >= len(text.rstrip()) - 1 else CORRUPT
        return Inspection(state, f"not valid JSON: {exc.msg} at byte {exc.pos}", "json")
    return Inspection(OK, "valid JSON", "json")


def _varint(f: Any) -> int | None:
    shift = value = 0
    while True:
        b = f.read(1)
        if not b:
            return None
        value |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _inspect_onnx(path: Path, size: int) -> Inspection:
    fields = 0
    with open(path, "rb") as f:
        try:
            while f.tell() < size:
                tag = _varint(f)
                if tag is None:
                    break
                field, wire = tag >> 3, tag & 7
                if field == 0 or field > 100:
                    return Inspection(CORRUPT, f"not an ONNX protobuf (field number {field} at byte {f.tell()})",
                                      "onnx")
                if wire == 0:
                    if _varint(f) is None:
                        return Inspection(TRUNCATED, "ONNX protobuf cut off inside a number", "onnx")
                elif wire in (1, 5):
                    step = 8 if wire == 1 else 4
                    if f.tell() + step > size:
                        return Inspection(TRUNCATED, "ONNX protobuf cut off inside a fixed-size field", "onnx")
                    f.seek(step, 1)
                elif wire == 2:
                    length = _varint(f)
                    if length is None or f.tell() + length > size:
                        return Inspection(TRUNCATED, f"ONNX field {field} runs past the end of the {size}-byte "
                                                     "file", "onnx")
                    f.seek(length, 1)
                else:
                    return Inspection(CORRUPT, f"not an ONNX protobuf (wire type {wire})", "onnx")
                fields += 1
        except ValueError as exc:
            return Inspection(CORRUPT, f"not an ONNX protobuf ({exc})", "onnx")
    return Inspection(OK, f"ONNX protobuf complete ({fields} top-level fields)", "onnx")


# ---------------------------------------------------------------------------------------------------------------
# Recorded facts and cached hashes (a small JSON next to the files)
# ---------------------------------------------------------------------------------------------------------------

class _State:
    """``<weights dir>/.nbhelpers-weights.json``: hub facts recorded at download, and sha256 results cached by
    (size, mtime). Writing is best effort: a read-only shared folder still verifies."""

    def __init__(self, directory: Path):
        self.path = directory / STATE_FILE
        self.changed = False
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.files: dict[str, dict[str, Any]] = dict(data.get("files", {}))
        except (OSError, ValueError, AttributeError):
            self.files = {}

    def cached_sha256(self, rel: str, st: os.stat_result) -> str | None:
        rec = self.files.get(rel, {})
        if rec.get("size") == st.st_size and rec.get("mtime_ns") == st.st_mtime_ns:
            return rec.get("sha256")
        return None

    def record_sha256(self, rel: str, st: os.stat_result, sha: str) -> None:
        rec = self.files.setdefault(rel, {})
        rec.update(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha)
        self.changed = True

    def record_facts(self, rel: str, size: int | None, sha: str | None, source: str) -> None:
        rec = self.files.setdefault(rel, {})
        rec.update(expected_size=size, expected_sha256=sha, facts_from=source)
        self.changed = True

    def facts(self, rel: str) -> tuple[int | None, str | None, str]:
        rec = self.files.get(rel, {})
        return rec.get("expected_size"), rec.get("expected_sha256"), rec.get("facts_from", "")

    def save(self) -> None:
        if not self.changed:
            return
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps({"version": 1, "files": self.files}, indent=1, sort_keys=True),
                           encoding="utf-8")
            os.replace(tmp, self.path)
            self.changed = False
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass


def sha256_file(path: str | os.PathLike, desc: str = "") -> str:
    """The sha256 of a file as lowercase hex, with a progress bar in bytes for large files.

    Args:
        path: The file.
        desc: Label of the progress bar (default: the file name).

    Returns:
        64 lowercase hex digits.

    Source: none in the official code (no checksum anywhere, reference §1.1).
    """
    from . import progress

    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        if size < 64 * _CHUNK:
            for block in iter(lambda: f.read(_CHUNK), b""):
                digest.update(block)
        else:
            with progress.bar(total=size, desc=f"sha256 {desc or path.name}", unit="B", unit_scale=True,
                              unit_divisor=1024) as pbar:
                for block in iter(lambda: f.read(8 * _CHUNK), b""):
                    digest.update(block)
                    pbar.update(len(block))
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class Expected:
    """What is known of one file of a weights dir, combining the manifest and the facts recorded at download.

    Attributes:
        size: Exact bytes from a verified source (manifest verified value or the hub at download), else None.
        sha256: Hex sha256 from a verified source, else None.
        source: Where those values come from.
        unverified_sha256: A sha256 from an unverified source (shown, never used to reject).
    """

    size: int | None
    sha256: str | None
    source: str
    unverified_sha256: str | None = None


def expected_facts(directory: str | os.PathLike, name: str, manifest: Manifest | None = None) -> Expected:
    """Size and sha256 known for a file of ``directory``: verified manifest values first, then what the hub
    reported when :func:`download` fetched it (recorded in ``.nbhelpers-weights.json``).

    Use it to decide whether a pickle checkpoint may be unpickled (``models.load_checkpoint``)::

        exp = weights.expected_facts(d, "dwpose-mmpose")
        models.load_checkpoint(d / "dwpose/dw-ll_ucoco_384.pth", trusted_sha256=exp.sha256,
                               expected_size=exp.size)

    Args:
        directory: The weights dir.
        name: Manifest name or layout path.
        manifest: Another manifest (tests).

    Returns:
        :class:`Expected`.

    Raises:
        InputError: Unknown name.

    Source: none in the official code (no checksum anywhere, reference §1.1).
    """
    manifest = MANIFEST if manifest is None else manifest
    entry = manifest.get(name)
    rel = name if name in (entry.path, *entry.alternates) else entry.path
    return _expected(entry, rel, _State(Path(directory)))


def _expected(entry: WeightFile, rel: str, state: _State) -> Expected:
    size = sha = None
    sources = []
    unverified = None
    if rel == entry.path:
        if entry.size is not None and entry.size.verified:
            size = int(entry.size.value)
            sources.append(f"manifest ({entry.size.source})")
        if entry.sha256 is not None:
            if entry.sha256.verified:
                sha = str(entry.sha256.value)
                sources.append(f"manifest ({entry.sha256.source})")
            else:
                unverified = str(entry.sha256.value)
    rec_size, rec_sha, rec_from = state.facts(rel)
    if size is None and rec_size is not None:
        size = int(rec_size)
        sources.append(rec_from)
    if sha is None and rec_sha:
        sha = str(rec_sha)
        if rec_from not in sources:
            sources.append(rec_from)
    return Expected(size, sha, "; ".join(s for s in sources if s), unverified)


# ---------------------------------------------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FileCheck:
    """The verdict on one file.

    Attributes:
        name: Manifest name.
        path: Layout path that was checked (the primary path, or the alternate found on disk).
        size: Bytes on disk (None when missing).
        expected: The expected size as text (``"unknown"`` when nothing is known).
        state: ``"ok"``, ``"missing"``, ``"wrong size"``, ``"HTML page"``, ``"git-lfs pointer"``, ``"truncated"``,
            ``"hash mismatch"``, ``"corrupt"`` or ``"unverifiable"``.
        detail: What was checked or found.
        fix: What to do (empty when nothing is needed).
    """

    name: str
    path: str
    size: int | None
    expected: str
    state: str
    detail: str
    fix: str = ""

    @property
    def bad(self) -> bool:
        """True when the file is missing or damaged."""
        return self.state in BAD_STATES


_STATE_COLOURS = {OK: "", UNVERIFIABLE: "background:#fff8e1"}


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """The result of :func:`verify`: one row per file; HTML in notebooks, a text table elsewhere.

    Attributes:
        directory: The weights dir checked.
        checks: One :class:`FileCheck` per file.
        deep: Whether sha256 values were computed.
        tiny: Whether the folder holds tiny random test weights.
    """

    directory: Path
    checks: tuple[FileCheck, ...]
    deep: bool = False
    tiny: bool = False

    @property
    def ok(self) -> bool:
        """True when no file is missing or damaged ("unverifiable" counts as usable)."""
        return not self.problems

    @property
    def problems(self) -> tuple[FileCheck, ...]:
        """The rows that are missing or damaged."""
        return tuple(c for c in self.checks if c.bad)

    def raise_for_problems(self) -> None:
        """Raise :class:`WeightsError` naming every bad file and its fix; do nothing when all are usable."""
        if self.problems:
            lines = [f"{len(self.problems)} weight file(s) under {self.directory} are not usable:"]
            lines += [f"  {c.path}: {c.state} - {c.detail}. Fix: {c.fix}" for c in self.problems]
            raise WeightsError("\n".join(lines))

    def _summary(self) -> str:
        kind = " (tiny random test weights)" if self.tiny else ""
        verdict = "all usable" if self.ok else f"{len(self.problems)} problem(s)"
        how = "sizes, contents and sha256" if self.deep else "sizes and contents (deep=True / --deep also hashes)"
        return f"{self.directory}{kind}: {len(self.checks)} files, {verdict}; checked {how}"

    _HEADERS = ("file", "size", "expected", "state", "detail", "fix")

    def _rows(self) -> list[list[str]]:
        return [[c.path, _human(c.size) if c.size is not None else "-", c.expected, c.state, c.detail, c.fix]
                for c in self.checks]

    def __str__(self) -> str:
        return self._summary() + "\n" + _text_table(self._HEADERS, self._rows())

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        styles = [_STATE_COLOURS.get(c.state, "background:#fde0dc") for c in self.checks]
        return _html_table(self._HEADERS, self._rows(), caption=self._summary(), row_styles=styles)


def _set_arg(entry: WeightFile) -> str:
    return "" if set(entry.sets) & set(DEFAULT_SETS) else f" --sets {entry.sets[0]}"


def _fix(entry: WeightFile, state: str, rel: str, root: Path | None = None) -> str:
    where = "" if root is None or _same_dir(root, default_dir()) else f" --weights {root}"
    cmd = f"`{DOWNLOAD_COMMAND}{where}{_set_arg(entry)}` (or {NOTEBOOK})"
    if state == MISSING:
        return f"download it: {cmd}"
    if state == LFS_POINTER:
        return (f"the folder was cloned without git-lfs; delete {rel} and run {cmd}, or `git lfs pull` in the "
                "clone")
    if state == HTML_PAGE:
        return (f"the server sent a web page (a quota, login or virus-scan page); delete {rel} and run {cmd}, "
                f"or fetch {entry.sources[0].address()} in a browser and save it as {rel}")
    return f"delete {rel} and download it again: {cmd} (download() also replaces bad files itself)"


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


def _check(entry: WeightFile, root: Path, state: _State, deep: bool) -> FileCheck:
    rel = next((p for p in (entry.path, *entry.alternates) if (root / p).is_file()), None)
    if rel is None:
        return FileCheck(entry.name, entry.path, None, entry.expected_text(), MISSING,
                         "not in the folder" + (f" (nor {', '.join(entry.alternates)})" if entry.alternates else ""),
                         _fix(entry, MISSING, entry.path, root))
    path = root / rel
    st = path.stat()
    exp = _expected(entry, rel, state)
    expected_text = (f"{_human(exp.size)} ({exp.source})" if exp.size is not None
                     else (entry.expected_text() if rel == entry.path else "unknown"))
    insp = inspect_file(path, _FORMAT_BY_SUFFIX.get(Path(rel).suffix.lower(), entry.format))
    if insp.bad:
        return FileCheck(entry.name, rel, st.st_size, expected_text, insp.state, insp.detail,
                         _fix(entry, insp.state, rel, root))
    notes = [insp.detail]
    proven = insp.state == OK
    if exp.size is not None:
        if st.st_size != exp.size:
            kind = TRUNCATED if st.st_size < exp.size else WRONG_SIZE
            return FileCheck(entry.name, rel, st.st_size, expected_text, kind,
                             f"{st.st_size} bytes, expected {exp.size} ({exp.source})", _fix(entry, kind, rel, root))
        notes.append("size matches")
        proven = True
    want_hash = exp.sha256 or exp.unverified_sha256 or (entry.sha256_prefix is not None and rel == entry.path)
    if deep and want_hash:
        sha = state.cached_sha256(rel, st)
        if sha is None:
            sha = sha256_file(path, desc=rel)
            state.record_sha256(rel, st, sha)
        if exp.sha256:
            if sha != exp.sha256:
                return FileCheck(entry.name, rel, st.st_size, expected_text, HASH_MISMATCH,
                                 f"sha256 {sha[:16]}... but {exp.source} says {exp.sha256[:16]}...",
                                 _fix(entry, HASH_MISMATCH, rel, root))
            notes.append(f"sha256 matches ({exp.source})")
            proven = True
        elif exp.unverified_sha256:
            same = sha == exp.unverified_sha256
            notes.append(f"sha256 {'matches' if same else 'differs from'} the unverified value "
                         f"({entry.sha256.source if entry.sha256 else ''})")
        if entry.sha256_prefix is not None and rel == entry.path:
            same = sha.startswith(str(entry.sha256_prefix.value))
            notes.append(f"sha256 {'starts' if same else 'does not start'} with {entry.sha256_prefix.value} "
                         f"({entry.sha256_prefix.source}, unverified)")
    elif want_hash and not deep:
        notes.append("sha256 not computed (deep=False)")
    final = OK if proven else UNVERIFIABLE
    fix = "" if final == OK else "nothing known to check it against; it will be used as it is"
    return FileCheck(entry.name, rel, st.st_size, expected_text, final, "; ".join(notes), fix)


def verify(directory: str | os.PathLike | None = None, sets: str | Sequence[str] | None = None,
           files: str | Sequence[str] | None = None, deep: bool = False,
           manifest: Manifest | None = None) -> VerifyReport:
    """Check the weight files of a folder: presence, size, contents and (``deep=True``) sha256.

    By default the v1.5 inference set is checked, plus any other manifest file that is present (so a folder
    with the v1 UNet shows its state without flagging v1 as missing elsewhere). Nothing is downloaded; sha256
    results are cached in ``.nbhelpers-weights.json`` keyed by (size, mtime), so a repeated deep check costs
    nothing. An unverified expected value never produces a mismatch: such files read "ok" when their
    structure is complete, else "unverifiable".

    Args:
        directory: The weights dir; None = :func:`default_dir`.
        sets: Sets to check (None = the default sets plus present extras).
        files: Extra file names or layout paths.
        deep: Also compute sha256 where a value is known (about 6 s per GB).
        manifest: Another manifest (tests).

    Returns:
        :class:`VerifyReport` (``.ok``, ``.problems``, ``.raise_for_problems()``).

    Raises:
        InputError: An unknown set or file name (the message lists valid ones).

    Source: the official code checks nothing (reference §1.1: no size or checksum is stated anywhere).
    """
    manifest = MANIFEST if manifest is None else manifest
    root = Path(directory) if directory is not None else default_dir()
    chosen = manifest.select(sets, files)
    if sets is None and files is None:
        names = {e.name for e in chosen}
        chosen = [e for e in manifest if e.name in names
                  or any((root / p).is_file() for p in (e.path, *e.alternates))]
    state = _State(root)
    checks = tuple(_check(e, root, state, deep) for e in chosen)
    state.save()
    return VerifyReport(root, checks, deep=deep, tiny=is_tiny(root))


# ---------------------------------------------------------------------------------------------------------------
# The input check of a job: every file it will open, before any frame is decoded
# ---------------------------------------------------------------------------------------------------------------

# Weight sets each landmark backend opens (faces/registry.py NEEDS_WEIGHTS, by set name); dlib and boxes need none.
_LANDMARK_SETS = {"dwpose": ("faces", "s3fd"), "dwpose-onnx": ("faces-onnx", "s3fd"),
                  "mmpose": ("faces-mmpose", "s3fd")}
# The modules that make "auto" try a backend (faces/registry.py AUTO_ORDER), in its order.
_AUTO_ORDER = (("mmpose", "mmpose"), ("dwpose", "torch"), ("dwpose-onnx", "onnxruntime"))


def _auto_landmark_sets(root: Path, manifest: Manifest) -> tuple[str, ...]:
    """The sets the ``"auto"`` landmark choice would open: the first backend whose package is installed and whose
    files are all present (found without importing anything); none when it would fall back to dlib."""
    import importlib.util

    for backend, module in _AUTO_ORDER:
        try:
            installed = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            installed = False
        entries = manifest.select(_LANDMARK_SETS[backend])
        if installed and all(any((root / q).is_file() for q in (e.path, *e.alternates)) for e in entries):
            return _LANDMARK_SETS[backend]
    return ()


def job_files(version: str = "v15", landmark_backend: str = "auto", *, parsing: bool = True,
              directory: str | os.PathLike | None = None, manifest: Manifest | None = None) -> list[WeightFile]:
    """The manifest entries a lip-sync job or avatar opens, for its version and landmark backend.

    Args:
        version: ``"v15"`` or ``"v1"``.
        landmark_backend: ``"auto"``, ``"dwpose"``, ``"dwpose-onnx"``, ``"mmpose"``, ``"dlib"`` or ``"boxes"``. For
            ``"auto"`` the files of the backend that the automatic choice would take (see
            :func:`nbhelpers.faces.get_backend`) are included when ``directory`` is given.
        parsing: Include the BiSeNet face-parsing file.
        directory: The weights dir, needed to predict the ``"auto"`` choice.
        manifest: Another manifest (tests).

    Returns:
        The entries, in manifest order.

    Raises:
        InputError: Unknown version or landmark backend.

    Source: reference §1.1 (the files inference.py, vae.py, face_parsing and preprocessing.py open).
    """
    manifest = MANIFEST if manifest is None else manifest
    paths = required_files(version, parsing=parsing)  # raises InputError for an unknown version
    if landmark_backend in _LANDMARK_SETS:
        sets: tuple[str, ...] = _LANDMARK_SETS[landmark_backend]
    elif landmark_backend == "auto":
        sets = _auto_landmark_sets(Path(directory), manifest) if directory is not None else ()
    elif landmark_backend in ("dlib", "boxes"):
        sets = ()
    else:
        raise InputError(f"landmark_backend must be one of 'auto', 'dwpose', 'dwpose-onnx', 'mmpose', 'dlib', "
                         f"'boxes'; got {landmark_backend!r}.")
    names = {manifest.get(rel).name for rel in paths}
    if sets:
        names |= {e.name for e in manifest.select(sets)}
    return [e for e in manifest if e.name in names]


TRY_TINY = ("Without network, `python -m nbhelpers demo --tiny` shows every stage running on tiny random weights "
            "(the repainted mouth is noise).")


def check_job_files(directory: str | os.PathLike | None, version: str = "v15", landmark_backend: str = "auto", *,
                    parsing: bool = True, manifest: Manifest | None = None) -> VerifyReport:
    """Check every weight file a job will open, cheaply, before any frame is decoded or any model is built.

    Each file of :func:`job_files` is looked at as :func:`verify` does without hashing (presence, a look inside
    with :func:`inspect_file`: web pages, git-lfs pointers, cut-off or damaged files, and the size when a verified
    one is known); on a 3.4 GB UNet this takes milliseconds. One error names every bad file.

    Args:
        directory: The weights dir; None = :func:`default_dir`.
        version: ``"v15"`` or ``"v1"``.
        landmark_backend: As in :class:`nbhelpers.config.InferenceConfig` (``"auto"``: the files of the backend
            the automatic choice would take; ``"dlib"`` and ``"boxes"`` open no landmark file).
        parsing: Include the BiSeNet face-parsing file (every job blends with it).
        manifest: Another manifest (tests).

    Returns:
        :class:`VerifyReport` of the files checked (all usable).

    Raises:
        WeightsError: The folder does not exist (said so, not as a list of missing files), or some files are
            missing or unusable: every one is named with what is wrong, and the fix is the download command for
            that folder (``--weights DIR`` when it is not the default) and those sets.
        InputError: Unknown version or landmark backend.

    Source: none in the official code (it opens each file when its model is built, reference §1.1); failure
    kind F11.
    """
    import shlex

    manifest = MANIFEST if manifest is None else manifest
    root = Path(directory).expanduser() if directory is not None else default_dir()
    here = _same_dir(root, default_dir())
    weights_arg = "" if here else f" --weights {shlex.quote(str(root))}"
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise WeightsError(
            f"the weights folder {str(root)!r} {what}. Download the weights into it with "
            f"`{DOWNLOAD_COMMAND}{weights_arg}` (or {NOTEBOOK}), or point the job at the folder that holds them "
            "(--weights DIR, weights_dir=, or the NBHELPERS_WEIGHTS environment variable). " + TRY_TINY)
    entries = job_files(version, landmark_backend, parsing=parsing, directory=root, manifest=manifest)
    state = _State(root)
    checks = tuple(_check(e, root, state, deep=False) for e in entries)
    report = VerifyReport(root, checks, deep=False, tiny=is_tiny(root))
    if report.ok:
        return report
    bad = report.problems
    lines = [f"{len(bad)} weight file(s) this job needs under {root} are not usable (checked before any frame is "
             "read):"]
    lines += [f"  {c.path}: {c.state} - {c.detail}" for c in bad]
    sets: list[str] = []
    for c in bad:
        for s in manifest.get(c.name).sets[:1]:
            if s not in sets:
                sets.append(s)
    states = {c.state for c in bad}
    notes = []
    if LFS_POINTER in states:
        notes.append("git-lfs pointers mean the folder was cloned without git-lfs (`git lfs pull` in the clone "
                     "also fixes them)")
    if HTML_PAGE in states:
        notes.append("a web page was saved instead of the file (a quota, login or virus-scan page)")
    lines.append(f"Fix: run `{DOWNLOAD_COMMAND}{weights_arg} --sets {' '.join(sets)}` (or {NOTEBOOK}): it "
                 "replaces bad files and fetches missing ones in that folder; or point the job at a folder that "
                 "holds good copies (--weights DIR, weights_dir=, NBHELPERS_WEIGHTS)."
                 + (f" Note: {'; '.join(notes)}." if notes else "") + " " + TRY_TINY)
    error = WeightsError("\n".join(lines))
    error.report = report  # type: ignore[attr-defined]
    raise error


# ---------------------------------------------------------------------------------------------------------------
# download
# ---------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DownloadRow:
    """What :func:`download` did for one file.

    Attributes:
        name: Manifest name.
        path: Layout path.
        action: ``"present"`` (verified, nothing fetched), ``"downloaded"``, ``"replaced"`` (a bad file was
            replaced) or ``"failed"``.
        source: The source used (empty when none).
        size: Bytes on disk afterwards (None when failed).
        seconds: Wall-clock time spent on this file.
        note: Checks done, or every source's error when failed.
    """

    name: str
    path: str
    action: str
    source: str
    size: int | None
    seconds: float
    note: str = ""


@dataclasses.dataclass(frozen=True)
class DownloadReport:
    """The result of :func:`download`; HTML in notebooks, a text table elsewhere.

    Attributes:
        directory: The weights dir.
        rows: One :class:`DownloadRow` per selected file.
    """

    directory: Path
    rows: tuple[DownloadRow, ...]

    @property
    def ok(self) -> bool:
        """True when no file failed."""
        return not self.failed

    @property
    def failed(self) -> tuple[DownloadRow, ...]:
        """The rows whose every source failed."""
        return tuple(r for r in self.rows if r.action == "failed")

    @property
    def downloaded_bytes(self) -> int:
        """Bytes of the files fetched in this call."""
        return sum(r.size or 0 for r in self.rows if r.action in ("downloaded", "replaced"))

    _HEADERS = ("file", "action", "size", "seconds", "source", "note")

    def _rows(self) -> list[list[str]]:
        return [[r.path, r.action, _human(r.size) if r.size is not None else "-", f"{r.seconds:.1f}", r.source,
                 r.note] for r in self.rows]

    def _summary(self) -> str:
        got = sum(r.action in ("downloaded", "replaced") for r in self.rows)
        return (f"{self.directory}: {len(self.rows)} files, {got} fetched ({_human(self.downloaded_bytes)}), "
                f"{sum(r.action == 'present' for r in self.rows)} already present, {len(self.failed)} failed")

    def __str__(self) -> str:
        return self._summary() + "\n" + _text_table(self._HEADERS, self._rows())

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        styles = ["background:#fde0dc" if r.action == "failed" else "" for r in self.rows]
        return _html_table(self._HEADERS, self._rows(), caption=self._summary(), row_styles=styles)


class _Rejected(Exception):
    """A source delivered something that is not the file (wrong size, hash, HTML page...): try the next one."""


class _Skipped(Exception):
    """A source cannot be used here (offline mode, package missing): try the next one, no retry."""


class _Unreachable(_Skipped):
    """The source's host does not resolve or accept connections: skip it for every file of this download."""


_HOSTS: dict[tuple[str, int], str] = {}  # (host, port) -> "" when reachable, else the reason (per download call)


def _check_host(url: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`_Unreachable` when ``url``'s host cannot be resolved or connected to (checked once per host).

    The hub client retries a failed request five times with back-off, per request and per file, so without this
    a machine with no route to the hub spends minutes before saying so (7 min for the default set here).
    """
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    key = (host, port)
    if key not in _HOSTS:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                _HOSTS[key] = ""
        except OSError as exc:
            _HOSTS[key] = f"{host} cannot be reached from this machine ({exc.strerror or exc})"
    if _HOSTS[key]:
        raise _Unreachable(_HOSTS[key])


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _default_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _permanent(exc: BaseException) -> bool:
    """True for errors that another try of the same source cannot fix (404, 401, 403, bad content)."""
    if isinstance(exc, (_Rejected, _Skipped)):
        return True
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"RepositoryNotFoundError", "EntryNotFoundError", "RevisionNotFoundError", "GatedRepoError",
                "RemoteEntryNotFoundError", "DisabledRepoError", "LocalEntryNotFoundError",
                "FileURLRetrievalError"}:
        return True
    status = getattr(exc, "code", None)
    response = getattr(exc, "response", None)
    if status is None and response is not None:
        status = getattr(response, "status_code", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    if isinstance(exc, (_Skipped, _Rejected)):  # our own reasons: no internal class name
        return text[0] if text else "skipped"
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


def _staging(root: Path, *parts: str) -> Path:
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "--", p) for p in parts]
    folder = root.joinpath(STAGING_DIR, *safe)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _fetch_hub(source: Source, root: Path) -> tuple[Path, int | None, str | None, str]:
    try:
        import huggingface_hub as hf
    except ImportError as exc:
        raise _Skipped("huggingface_hub is not installed (pip install huggingface_hub)") from exc
    mirror = source.endpoint is not None and source.endpoint.rstrip("/") != _default_endpoint()
    token: Any = False if mirror else None  # never send the user's HF token to a third-party mirror
    endpoint = source.endpoint.rstrip("/") if source.endpoint else None
    size = sha = None
    commit = ""
    try:  # the LFS oid is the sha256 of the file; paths-info states it explicitly
        api = hf.HfApi(endpoint=endpoint, token=token)
        info = api.get_paths_info(source.repo, [source.filename], revision=source.revision)
        if info:
            size = getattr(info[0], "size", None)
            lfs = getattr(info[0], "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
    except Exception:  # noqa: BLE001, S110 - mirrors may lack this API; the HEAD below still gives size and etag
        pass
    try:
        url = hf.hf_hub_url(source.repo, source.filename, revision=source.revision, endpoint=endpoint)
        meta = hf.get_hf_file_metadata(url, token=token)
        size = size if size is not None else meta.size
        commit = meta.commit_hash or ""
        etag = (meta.etag or "").strip('"').lower()
        if sha is None and re.fullmatch(r"[0-9a-f]{64}", etag):
            sha = etag  # the hub's etag of an LFS file is its sha256
    except Exception as exc:  # noqa: BLE001 - a failed HEAD is reported by hf_hub_download just below
        if _permanent(exc):
            raise
    staged = hf.hf_hub_download(source.repo, source.filename, revision=source.revision,
                                local_dir=_staging(root, "hub", endpoint or "default", source.repo),
                                endpoint=endpoint, token=token)
    where = f"hub {source.repo}@{commit[:12] or source.revision}" + (f" via {endpoint}" if mirror else "")
    return Path(staged), (int(size) if size is not None else None), sha, where


def _fetch_gdrive(source: Source, root: Path, rel: str) -> tuple[Path, int | None, str | None, str]:
    try:
        import gdown
    except ImportError as exc:
        raise _Skipped("gdown is not installed (pip install gdown)") from exc
    from . import progress

    out = _staging(root, "gdrive", source.id) / Path(rel).name
    quiet = bool(progress._settings.get("disable"))
    result = gdown.download(id=source.id, output=str(out), quiet=quiet, resume=True)
    if not result or not out.is_file():
        raise OSError(f"gdown could not fetch Drive id {source.id} (quota exceeded, or the file is not shared)")
    return out, None, None, f"Google Drive {source.id}"


def _fetch_url(url: str, part: Path, desc: str) -> tuple[Path, int | None]:
    """Stream ``url`` into ``part`` (resuming from its current size with a Range request)."""
    import urllib.error
    import urllib.request

    from . import progress

    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "nbhelpers (musetalk-workbook)", "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S)  # noqa: S310 - URLs are the manifest's
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # asked past the end: the .part is already whole (checked by the caller)
            match = re.search(r"/(\d+)", exc.headers.get("Content-Range", ""))
            return part, int(match.group(1)) if match else have
        raise
    with response:
        if response.headers.get_content_type() == "text/html":
            raise _Rejected(f"{url} answered with a web page (Content-Type text/html), not the file")
        length = response.headers.get("Content-Length")
        if response.status == 206:
            match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != have:
                raise OSError(f"{url} answered a resume request with a different range; starting again")
            total = int(match.group(2)) if match.group(2) != "*" else None
            mode = "ab"
        else:  # 200: the server ignored the Range request (or there was none): start from zero
            have = 0
            total = int(length) if length is not None else None
            mode = "wb"
        with open(part, mode) as f, progress.bar(total=total, desc=desc, unit="B", unit_scale=True,
                                                 unit_divisor=1024, initial=have) as pbar:
            while True:
                block = response.read(_CHUNK)
                if not block:
                    break
                f.write(block)
                pbar.update(len(block))
    got = part.stat().st_size
    if total is not None and got < total:
        raise OSError(f"connection closed at {got} of {total} bytes")
    return part, total


def _fetch_plain(source: Source, root: Path, rel: str) -> tuple[Path, int | None, str | None, str]:
    part = _staging(root, "url") / (Path(rel).name + ".part")
    staged, total = _fetch_url(source.url, part, Path(rel).name)
    return staged, total, None, f"URL {source.url}"


def _fetch_bundled(source: Source, root: Path, rel: str) -> tuple[Path, int | None, str | None, str]:
    data = importlib.resources.files("nbhelpers").joinpath("configs", source.resource).read_bytes()
    out = _staging(root, "bundled") / Path(rel).name
    out.write_bytes(data)
    return out, len(data), hashlib.sha256(data).hexdigest(), f"bundled nbhelpers/configs/{source.resource}"


def _fetch(source: Source, root: Path, rel: str) -> tuple[Path, int | None, str | None, str]:
    if source.kind == "bundled":
        return _fetch_bundled(source, root, rel)
    if _offline():
        raise _Skipped("HF_HUB_OFFLINE is set: no network source is tried")
    if source.kind == "hub":
        _check_host((source.endpoint or _default_endpoint()).rstrip("/"))
        return _fetch_hub(source, root)
    if source.kind == "gdrive":
        return _fetch_gdrive(source, root, rel)
    if source.kind == "url":
        _check_host(source.address())
        return _fetch_plain(source, root, rel)
    raise _Skipped(f"unknown source kind {source.kind!r}")


def _accept(entry: WeightFile, staged: Path, size: int | None, sha: str | None, check_hash: bool) -> str:
    """Check a fetched file before it is renamed into place; raise :class:`_Rejected` when it is not the file."""
    insp = inspect_file(staged, entry.format)
    if insp.bad:
        raise _Rejected(f"{insp.state}: {insp.detail}")
    got = staged.stat().st_size
    notes = [insp.detail]
    if entry.size is not None and entry.size.verified and got != int(entry.size.value):
        raise _Rejected(f"{got} bytes, the manifest says {entry.size.value}")
    if size is not None:
        if got != size:
            raise _Rejected(f"{got} bytes, the source said {size}")
        notes.append(f"size {got} as stated by the source")
    wanted = {"the source": sha}
    if entry.sha256 is not None and entry.sha256.verified:
        wanted["the manifest"] = str(entry.sha256.value)
    wanted = {who: value.lower() for who, value in wanted.items() if value}
    if check_hash and wanted:
        digest = sha256_file(staged, desc=Path(entry.path).name)
        for who, value in wanted.items():
            if digest != value:
                raise _Rejected(f"sha256 {digest[:16]}... but {who} says {value[:16]}...")
        notes.append("sha256 matches")
    return "; ".join(notes)


def _download_one(entry: WeightFile, root: Path, state: _State, check_hash: bool, replacing: str) -> DownloadRow:
    start = time.monotonic()
    errors: list[str] = []
    target = root / entry.path
    for source in entry.sources:
        if (source.kind == "hub" and source.endpoint
                and source.endpoint.rstrip("/") == _default_endpoint()
                and any(s.kind == "hub" and s.endpoint is None and s.repo == source.repo for s in entry.sources)):
            continue  # HF_ENDPOINT already points at this mirror: it was tried as the first source
        for attempt in range(1, ATTEMPTS_PER_SOURCE + 1):
            staged = None
            try:
                staged, size, sha, where = _fetch(source, root, entry.path)
                note = _accept(entry, staged, size, sha, check_hash)
            except _Rejected as exc:
                errors.append(f"{source.describe()}: rejected ({exc})")
                _discard_staged(staged)
                break
            except Exception as exc:  # noqa: BLE001 - every failure moves on; all of them are reported
                errors.append(f"{source.describe()} (try {attempt}): {_short(exc)}")
                if _permanent(exc) or attempt == ATTEMPTS_PER_SOURCE:
                    break
                time.sleep(RETRY_DELAY_S)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)
            st = target.stat()
            state.record_facts(entry.path, size if size is not None else st.st_size if sha else None, sha, where)
            if sha and check_hash:
                state.record_sha256(entry.path, st, sha)
            state.save()
            if errors:
                note += f" (after: {' | '.join(errors)})"
            return DownloadRow(entry.name, entry.path, "replaced" if replacing else "downloaded", where,
                               st.st_size, time.monotonic() - start, note)
    return DownloadRow(entry.name, entry.path, "failed", "", None, time.monotonic() - start, " | ".join(errors))


def _discard_staged(staged: Path | None) -> None:
    if staged is not None:
        try:
            Path(staged).unlink()
        except OSError:
            pass


def _failure_message(root: Path, rows: Sequence[DownloadRow], manifest: Manifest) -> str:
    lines = [f"{len(rows)} weight file(s) could not be downloaded into {root}:"]
    for row in rows:
        entry = manifest.get(row.name)
        lines.append(f"  {row.path} ({entry.expected_text()}):")
        lines += [f"    - {e}" for e in row.note.split(" | ")]
        lines.append(f"    by hand: fetch {entry.sources[0].address()} and save it as {root / row.path}")
    if all("cannot be reached from this machine" in row.note or "HF_HUB_OFFLINE" in row.note for row in rows):
        lines.append(
            "Fix: this machine cannot reach the weight hosts (no internet, or HF_HUB_OFFLINE is set). Copy the "
            f"files above into {root} by hand (the 'by hand' lines give each address), or point the job at a "
            "folder that already holds them: --weights DIR on the command line, weights_dir= in Python, or the "
            "NBHELPERS_WEIGHTS environment variable (a shared Google Drive folder works). To see the tool run "
            "without any download: `python -m nbhelpers demo --tiny` (tiny random weights; the mouth is noise).")
    else:
        lines.append(
            "Fix: check the network and run the download again (finished files are kept; the hub client resumes "
            "cut transfers). If huggingface.co is blocked set HF_ENDPOINT=https://hf-mirror.com; for a gated or "
            "private repository set HF_TOKEN; unset HF_HUB_OFFLINE to allow downloads. Or copy the files by hand "
            "and pass --weights DIR (weights_dir=, NBHELPERS_WEIGHTS).")
    return "\n".join(lines)


def download(directory: str | os.PathLike | None = None, sets: str | Sequence[str] | None = None,
             files: str | Sequence[str] | None = None, *, check_hash: bool = True,
             manifest: Manifest | None = None) -> DownloadReport:
    """Fetch the weight files that are missing or bad, verifying each before it is put in place.

    Present files are checked (size and contents, no hashing) and kept: a second call, or a session using a
    shared folder that someone else filled, downloads nothing. A bad present file (HTML page, git-lfs pointer,
    cut off, wrong size) is replaced, with a warning. Each missing file is fetched from its sources in order
    (hub, Drive, mirrors), each source tried up to 3 times, checked (size and sha256 from the hub's metadata when
    it gives them, plus a look inside), then renamed into place atomically. Nothing is installed or upgraded.

    Args:
        directory: The weights dir; None = :func:`default_dir`. Created if needed.
        sets: Sets to fetch: ``"core"``, ``"faces"``, ``"faces-onnx"``, ``"faces-mmpose"``, ``"parsing"``,
            ``"s3fd"``, ``"v1"``, ``"syncnet"``, ``"default"``, ``"all"``; None = the v1.5 inference set (core,
            faces, parsing, s3fd: about 4.2 GB) unless ``files`` is given.
        files: Extra file names or layout paths (see :func:`list_files`).
        check_hash: Hash each fetched file when a sha256 is known (about 6 s per GB).
        manifest: Another manifest (tests).

    Returns:
        :class:`DownloadReport`, one row per selected file.

    Raises:
        InputError: An unknown set or file name (the message lists the valid ones).
        WeightsError: The folder cannot be written, or some file failed from every source; the message names
            each file, each source's error, the manual URL and the fix. Files that succeeded are kept.

    Source: download_weights.sh:14-49 (the same files and repositories; ``HF_ENDPOINT=https://hf-mirror.com``
    there is our second hub source).
    """
    manifest = MANIFEST if manifest is None else manifest
    entries = manifest.select(sets, files)
    root = Path(directory).expanduser() if directory is not None else default_dir()
    state = _State(root)
    _HOSTS.clear()
    rows: list[DownloadRow] = []
    todo: list[tuple[WeightFile, str]] = []
    for entry in entries:
        check = _check(entry, root, state, deep=False)
        if check.state in (OK, UNVERIFIABLE):
            rows.append(DownloadRow(entry.name, check.path, "present", "", check.size, 0.0, check.detail))
        else:
            if check.state != MISSING:
                warnings.warn(f"{root / check.path} is {check.state} ({check.detail}); downloading it again",
                              NbHelpersWarning, stacklevel=2)
            todo.append((entry, "" if check.state == MISSING else check.state))
            rows.append(None)  # type: ignore[arg-type]  # filled below, keeping manifest order
    if todo:
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".nbhelpers-write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            names = ", ".join(e.path for e, _ in todo)
            raise WeightsError(f"cannot write to the weights dir {root} ({exc}); {len(todo)} file(s) are missing "
                               f"or bad: {names}. Choose a writable folder: set {ENV_VAR} or pass directory=, "
                               "or ask the owner of the shared folder to run the download.") from exc
        done = iter(_download_one(e, root, state, check_hash, why) for e, why in todo)
        rows = [row if row is not None else next(done) for row in rows]
    state.save()
    report = DownloadReport(root, tuple(rows))
    if report.failed:
        error = WeightsError(_failure_message(root, report.failed, manifest))
        error.report = report  # type: ignore[attr-defined]
        raise error
    if todo:
        shutil.rmtree(root / STAGING_DIR, ignore_errors=True)
    return report


# ---------------------------------------------------------------------------------------------------------------
# Command line: python -m nbhelpers.weights {list,download,verify}
# ---------------------------------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """``python -m nbhelpers.weights list|download|verify [--dir D] [--sets ...] [--deep]``; returns the exit code.

    Args:
        argv: Command-line arguments without the program name; None = ``sys.argv[1:]``.

    Source: download_weights.sh (the official equivalent, a shell script).
    """
    import argparse

    from .errors import NbHelpersError

    parser = argparse.ArgumentParser(prog="python -m nbhelpers.weights", description="MuseTalk weight files")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("list", "download", "verify"):
        p = sub.add_parser(name)
        p.add_argument("--dir", default=None, help=f"weights dir (default: ${ENV_VAR} or the cache folder)")
        p.add_argument("--sets", nargs="*", default=None, help=f"sets: {', '.join(SETS)}, default, all")
        p.add_argument("--files", nargs="*", default=None, help="file names or layout paths")
        if name == "verify":
            p.add_argument("--deep", action="store_true", help="also compute sha256 where a value is known")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            print(list_files(args.sets or "all"))
            return 0
        if args.command == "download":
            print(download(args.dir, sets=args.sets or None, files=args.files or None))
            return 0
        report = verify(args.dir, sets=args.sets or None, files=args.files or None, deep=args.deep)
        print(report)
        return 0 if report.ok else 1
    except NbHelpersError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
