"""The manifest of the weight files: what a job needs, where each file comes from, and the weights folder."""

from __future__ import annotations

import dataclasses
import html
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import InputError

ENV_VAR = "NBHELPERS_WEIGHTS"  # folder of the weights; wins over every other choice
DRIVE_DIR = Path("/content/drive/MyDrive/musetalk-workbook/models")  # used on Colab only if it already holds weights
STATE_FILE = ".nbhelpers-weights.json"  # hub facts recorded at download time + cached sha256 results
STAGING_DIR = ".nbhelpers-downloads"  # partial downloads (resumable), inside the weights dir: same filesystem
TINY_MARKER = "tiny.json"  # written by nbhelpers.testing.make_tiny_weights: random tiny test weights
HF_MIRROR = "https://hf-mirror.com"  # the mirror both official download scripts use (download_weights.sh:14)
DOWNLOAD_COMMAND = "python -m nbhelpers download"
NOTEBOOK = "notebooks/01_weights.ipynb"


@dataclasses.dataclass(frozen=True)
class Fact:
    """One known ``value`` about a file (a size in bytes, or a lowercase hex sha256 or its first digits), its
    ``source``, and whether it was ``verified`` against the real file (unverified values never reject a file)."""

    value: int | str
    verified: bool = False
    source: str = ""


@dataclasses.dataclass(frozen=True)
class Source:
    """One place a weight file can be fetched from: ``kind`` ``"hub"`` (Hugging Face ``repo``, ``filename``,
    ``revision``; ``endpoint`` a mirror's, no token sent there, None = :func:`hub_endpoint`), ``"gdrive"`` (Drive ``id``
    through ``gdown``), ``"url"`` (plain HTTP(S) ``url``, resumed) or ``"bundled"`` (``resource`` under
    ``nbhelpers/configs``).
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
        via = f" via {self.endpoint}" if self.endpoint else ""
        return {"hub": f"hub {self.repo}: {self.filename}{via}", "gdrive": f"Google Drive id {self.id}",
                "url": f"URL {self.url}"}.get(self.kind, f"bundled nbhelpers/configs/{self.resource}")

    def address(self) -> str:
        """A URL a person can open in a browser to fetch the file by hand."""
        endpoint = (self.endpoint or hub_endpoint()).rstrip("/")
        return {"hub": f"{endpoint}/{self.repo}/resolve/{self.revision}/{self.filename}",
                "gdrive": f"https://drive.google.com/uc?id={self.id}",
                "url": self.url}.get(self.kind, f"nbhelpers/configs/{self.resource}")


def hub_endpoint() -> str:
    """The Hugging Face endpoint used when a source names none: ``HF_ENDPOINT``, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


@dataclasses.dataclass(frozen=True)
class WeightFile:
    """One file of the weights layout: a short unique ``name`` (``"unet-v15"``, accepted wherever a layout path is),
    its ``path`` under the weights dir (official layout, POSIX separators), the ``sets`` it belongs to, its ``format``
    (``"torch"``, ``"safetensors"``, ``"json"``, ``"onnx"``), its ``sources`` in order of preference, known ``size``,
    ``sha256`` and ``sha256_prefix`` (torch.hub's file-name prefix) facts, an ``approx_bytes`` estimate for display,
    ``alternates`` (layout paths of the same content in another format, like the official ``.bin``: one present
    satisfies the entry), and a ``description`` with the official file:line it is ``cited`` from.
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
        """The size as a person should read it, marked verified, unverified or estimated."""
        if self.size is not None:
            mark = "verified" if self.size.verified else "unverified"
            return f"{_human(int(self.size.value))} ({mark})"
        if self.approx_bytes:
            return f"about {_human(self.approx_bytes)}, estimated"
        return "unknown"


def _hub(repo: str, filename: str) -> tuple[Source, ...]:
    return Source("hub", repo=repo, filename=filename), Source("hub", repo=repo, filename=filename, endpoint=HF_MIRROR)


_MUSETALK = "TMElyralab/MuseTalk"
_VAE = "stabilityai/sd-vae-ft-mse"
_WHISPER = "openai/whisper-tiny"
_DWPOSE = "yzd-v/DWPose"

# Sizes marked "estimate" come from parameter counts (4 bytes per float32 value); none is checked against a file.
_ENTRIES: tuple[WeightFile, ...] = (
    WeightFile(
        "unet-v15", "musetalkV15/unet.pth", ("core",), "torch", _hub(_MUSETALK, "musetalkV15/unet.pth"),
        sha256=Fact("7ebf6c98c181e20838e4c0054e96e944ac60d5d692cc01db42839fe11b787007", False, "a third-party page"),
        approx_bytes=3_399_791_376, cited="download_weights.sh:22-24, unet.py:44-45",
        description="MuseTalk 1.5 UNet, torch.save of a plain diffusers UNet2DConditionModel state dict "
                    "(849.9 M float32 values)"),
    WeightFile(
        "unet-v15-config", "musetalkV15/musetalk.json", ("core",), "json",
        (*_hub(_MUSETALK, "musetalkV15/musetalk.json"), Source("bundled", resource="musetalkV15-unet.json")),
        approx_bytes=800, cited="download_weights.sh:22-24",
        description="UNet2DConditionModel kwargs (v1.5); the bundled copy is nbhelpers/configs/musetalkV15-unet.json"),
    WeightFile(
        "vae-config", "sd-vae/config.json", ("core",), "json", _hub(_VAE, "config.json"), approx_bytes=550,
        description="AutoencoderKL config of sd-vae-ft-mse", cited="download_weights.sh:27-29"),
    WeightFile(
        "vae", "sd-vae/diffusion_pytorch_model.safetensors", ("core",), "safetensors",
        _hub(_VAE, "diffusion_pytorch_model.safetensors"), approx_bytes=334_640_000,
        alternates=("sd-vae/diffusion_pytorch_model.bin",), cited="download_weights.sh:27-29, vae.py:24",
        description="sd-vae-ft-mse weights (83.7 M values); the official script fetches the .bin, which also works"),
    WeightFile(
        "whisper-config", "whisper/config.json", ("core",), "json", _hub(_WHISPER, "config.json"),
        approx_bytes=2_000, description="whisper-tiny config", cited="download_weights.sh:32-34"),
    WeightFile(
        "whisper", "whisper/model.safetensors", ("core",), "safetensors", _hub(_WHISPER, "model.safetensors"),
        approx_bytes=151_060_000, alternates=("whisper/pytorch_model.bin",),
        description="whisper-tiny weights (37.8 M values; only the encoder is used); safetensors because recent "
                    "transformers refuse .bin files on torch < 2.6",
        cited="download_weights.sh:32-34, inference.py:64-66"),
    WeightFile(
        "whisper-preprocessor", "whisper/preprocessor_config.json", ("core",), "json",
        _hub(_WHISPER, "preprocessor_config.json"), cited="download_weights.sh:32-34",
        description="WhisperFeatureExtractor settings (80 mel bins, hop 160, 30 s chunks)"),
    WeightFile(
        "dwpose-mmpose", "dwpose/dw-ll_ucoco_384.pth", ("faces", "faces-mmpose"), "torch",
        _hub(_DWPOSE, "dw-ll_ucoco_384.pth"), approx_bytes=134_600_000,
        description="DWPose mmengine checkpoint (state dict of 33.6 M values plus metadata; the estimate is a lower "
                    "bound): the default landmark backend 'dwpose' (plain torch) and the exact mmpose path read it",
        cited="download_weights.sh:37-39, preprocessing.py:18-19"),
    WeightFile(
        "dwpose-onnx", "dwpose/dw-ll_ucoco_384.onnx", ("faces-onnx",), "onnx", _hub(_DWPOSE, "dw-ll_ucoco_384.onnx"),
        approx_bytes=134_600_000, cited="hub yzd-v/DWPose (the same repository as the .pth)",
        description="DWPose RTMPose-l 384x288 whole-body, ONNX export (33.6 M values): only for the optional "
                    "'dwpose-onnx' backend (onnxruntime)"),
    WeightFile(
        "bisenet", "face-parse-bisent/79999_iter.pth", ("parsing",), "torch",
        (Source("hub", repo="ManyOtherFunctions/face-parse-bisent", filename="79999_iter.pth"),
         Source("gdrive", id="154JgKpzCPW82qINcVieuPH3fZ2e0P812"),
         Source("hub", repo="ManyOtherFunctions/face-parse-bisent", filename="79999_iter.pth", endpoint=HF_MIRROR)),
        approx_bytes=53_300_000,
        description="BiSeNet face parsing, 19 classes (face-parsing.PyTorch), plain state dict; the ResNet-18 "
                    "ImageNet file of the official script is not needed (it is fully overwritten)",
        cited="download_weights.sh:47, download_weights.bat:38, face_parsing/__init__.py:61-67"),
    WeightFile(
        "s3fd", "s3fd/s3fd-619a316812.pth", ("s3fd",), "torch",
        (Source("url", url="https://www.adrianbulat.com/downloads/python-fan/s3fd-619a316812.pth"),),
        sha256_prefix=Fact("619a316812", False, "torch.hub file-name convention (<name>-<first sha256 digits>)"),
        approx_bytes=89_840_000, cited="sfd_detector.py:11-13,17-24",
        description="S3FD face detector (22.5 M values); the official code fetches it at import time"),
    WeightFile(
        "unet-v1", "musetalk/pytorch_model.bin", ("v1",), "torch", _hub(_MUSETALK, "musetalk/pytorch_model.bin"),
        approx_bytes=3_399_791_376, cited="download_weights.sh:17-19",
        description="MuseTalk 1.0 UNet (same architecture as v1.5), plain state dict"),
    WeightFile(
        "unet-v1-config", "musetalk/musetalk.json", ("v1",), "json",
        (*_hub(_MUSETALK, "musetalk/musetalk.json"), Source("bundled", resource="musetalkV15-unet.json")),
        approx_bytes=800, cited="download_weights.sh:17-19, training_utils.py:66-73",
        description="UNet config (v1.0); v1.0 and v1.5 share the architecture, so the bundled v1.5 config is the "
                    "last-resort source"),
    WeightFile(
        "syncnet", "syncnet/latentsync_syncnet.pt", ("syncnet",), "torch",
        _hub("ByteDance/LatentSync", "latentsync_syncnet.pt"), cited="download_weights.sh:42-44, app.py:139,149-159",
        description="LatentSync SyncNet: training only (the official app.py refuses to start without it)"),
    WeightFile(
        "syncnet-v2", "syncnet/syncnet_v2.model", ("quality",), "torch",
        (*_hub("ByteDance/LatentSync-1.5", "auxiliary/syncnet_v2.model"),
         Source("url", url="https://www.robots.ox.ac.uk/~vgg/software/lipsync/data/syncnet_v2.model")),
        approx_bytes=54_526_464,
        description="SyncNet v2 (Chung & Zisserman 2016), a plain state dict of 13.6 M float32 values: the "
                    "LSE-D / LSE-C lip-sync score of nbhelpers.quality (optional)",
        cited="syncnet_python download_model.sh, SyncNetInstance.py loadParameters; LatentSync checkpoints/auxiliary"),
    # Face restoration (nbhelpers.restore, optional); sizes are estimates from the release listings.
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
        return tuple(dict.fromkeys(s for entry in self for s in entry.sets))

    def get(self, name: str) -> WeightFile:
        """The entry called ``name`` (short name, layout path or alternate path); InputError listing the valid names
        when there is none."""
        for entry in self:
            if name in (entry.name, entry.path, *entry.alternates):
                return entry
        raise InputError(f"unknown weight file {name!r}. Valid names: {', '.join(e.name for e in self)} "
                         f"(or their paths, e.g. {self[0].path!r}). See weights.list_files().")

    def select(self, sets: str | Sequence[str] | None = None,
               files: str | Sequence[str] | None = None) -> list[WeightFile]:
        """Entries of ``sets`` (names, ``"default"``, ``"all"``; None: the default sets unless ``files`` is given) and
        ``files`` (names or layout paths), each once, in manifest order; InputError listing the valid ones for an
        unknown set or file name.
        """
        files = [files] if isinstance(files, str) else files
        sets = [sets] if isinstance(sets, str) else sets
        sets = (DEFAULT_SETS if not files else ()) if sets is None else sets
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
    """Layout paths a lip-sync job of ``version`` (``"v15"``, ``"v1"``; InputError otherwise) needs, BiSeNet with
    ``parsing``; landmark files depend on the backend and are not listed. Source: docs/official-behaviour.md §1.1.
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
    """Which of ``paths`` (layout paths) are absent from the weights dir ``directory``, in order; alternates count."""
    root = Path(directory)
    alternates = {entry.path: entry.alternates for entry in MANIFEST}
    return [rel for rel in paths if not any((root / p).is_file() for p in (rel, *alternates.get(rel, ())))]


def _human(n: int | float | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``headers``, a dashed line and ``rows`` as text in left-aligned columns two spaces apart."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*headers), fmt.format(*["-" * w for w in widths]), *(fmt.format(*map(str, r)) for r in rows)]
    return "\n".join(line.rstrip() for line in lines)


class _Report:
    """A report shown as its ``_summary()`` over a table of ``_rows()`` under ``_HEADERS`` (HTML in notebooks)."""

    _HEADERS: tuple[str, ...] = ()

    def _styles(self) -> list[str] | None:
        return None

    def __str__(self) -> str:
        return self._summary() + "\n" + text_table(self._HEADERS, self._rows())

    def _repr_html_(self) -> str:
        styles = self._styles()
        out = ['<table style="border-collapse:collapse;font-size:90%">',
               f'<caption style="text-align:left;font-weight:bold">{html.escape(self._summary())}</caption>',
               "<tr>" + "".join(f'<th style="text-align:left;padding:2px 8px">{html.escape(h)}</th>'
                                for h in self._HEADERS) + "</tr>"]
        for i, row in enumerate(self._rows()):
            style = f' style="{styles[i]}"' if styles and styles[i] else ""
            out.append(f"<tr{style}>" + "".join(f'<td style="padding:2px 8px">{html.escape(str(c))}</td>'
                                                for c in row) + "</tr>")
        return "\n".join([*out, "</table>"])


@dataclasses.dataclass(frozen=True)
class FileTable(_Report):
    """The manifest's listed ``entries`` (or a selection of it) as a table; HTML in notebooks, text elsewhere."""

    entries: tuple[WeightFile, ...]

    @property
    def approx_total_bytes(self) -> int:
        """Sum of the known or estimated sizes, bytes (files with no estimate count 0)."""
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

    def _summary(self) -> str:
        return f"{len(self.entries)} weight files, about {self.approx_total_bytes / 1e9:.2f} GB"

    def __str__(self) -> str:
        return text_table(self._HEADERS, self._rows()) + "\n" + self._summary().replace(" weight files", " files")


def list_files(sets: str | Sequence[str] | None = "all") -> FileTable:
    """The manifest entries of ``sets`` as a :class:`FileTable`; InputError naming the valid sets for an unknown one."""
    return FileTable(tuple(MANIFEST.select(sets)))


def _holds_weights(folder: Path) -> bool:
    try:
        return any((folder / p).is_file() for e in MANIFEST for p in (e.path, *e.alternates))
    except OSError:
        return False


def in_colab() -> bool:
    """True inside a Google Colab runtime (the kernel has imported ``google.colab``)."""
    return "google.colab" in sys.modules or bool(os.environ.get("COLAB_RELEASE_TAG"))


def default_dir() -> Path:
    """The absolute weights dir used when none is given (not created here): ``$NBHELPERS_WEIGHTS``; on Colab,
    :data:`DRIVE_DIR` if it already holds weight files; ``$XDG_CACHE_HOME/musetalk-workbook/models``
    (``~/.cache/musetalk-workbook/models``). The official scripts use ``models/`` under the repository root
    (official-behaviour §1.1).
    """
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser().absolute()
    if in_colab() and DRIVE_DIR.is_dir() and _holds_weights(DRIVE_DIR):
        return DRIVE_DIR
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return (base / "musetalk-workbook" / "models").absolute()


def resolve_dir(weights_dir: str | os.PathLike | None) -> Path:
    """The weights dir a job uses: ``weights_dir`` with ``~`` expanded, or :func:`default_dir` when None."""
    return Path(weights_dir).expanduser() if weights_dir is not None else default_dir()


def is_tiny(directory: str | os.PathLike) -> bool:
    """True when ``directory`` holds tiny random test weights (``tiny.json`` of ``make_tiny_weights``)."""
    return (Path(directory) / TINY_MARKER).is_file()


TRY_TINY = ("Without network, `python -m nbhelpers demo --tiny` shows every stage running on tiny random weights "
            "(the repainted mouth is noise).")
