"""The manifest of the weight files: what a job needs, where each file comes from, and the weights folder.

The table of files is the data file ``nbhelpers/data/weights.json``, read once when this module is imported. Its
format (``manifest_version`` 1) is one JSON object:

- ``manifest_version``: 1 (:data:`MANIFEST_VERSION`); another number stops the import with ValueError.
- ``sets``: set name -> one-line description (:data:`SETS`, in this order); every set named below must be here.
- ``default_sets``: the sets fetched when none are named (:data:`DEFAULT_SETS`: the v1.5 inference set, about 4.2 GB).
- ``files``: one object per :class:`WeightFile`, in manifest order, keyed by its field names; a field left out takes
  the field's default. ``sets`` and ``alternates`` are lists of strings; ``sources`` a list of objects keyed by the
  fields of :class:`Source` (a mirror's hub source names its ``endpoint``, :data:`HF_MIRROR`); ``size``, ``sha256`` and
  ``sha256_prefix`` objects keyed by the fields of :class:`Fact` (``value``, ``verified``, ``source``).
  ``approx_bytes`` is an estimate for display (a parameter count at 4 bytes a float32 value, or a release listing's
  size), never checked against a file.
"""

from __future__ import annotations

import dataclasses
import html
import importlib.resources
import json
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
DATA_FILE = "weights.json"  # the table of weight files, under nbhelpers/data (format: the module docstring)
MANIFEST_VERSION = 1  # the manifest_version of DATA_FILE that this module reads


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
    ``nbhelpers/configs``)."""

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
    satisfies the entry), and a ``description`` with the official file:line it is ``cited`` from."""

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


def _entry(fields: dict) -> WeightFile:
    facts = {key: Fact(**fields[key]) for key in ("size", "sha256", "sha256_prefix") if key in fields}
    lists = {"sets": tuple(fields["sets"]), "alternates": tuple(fields.get("alternates", ())),
             "sources": tuple(Source(**source) for source in fields["sources"])}
    return WeightFile(**{**fields, **facts, **lists})


def _load(text: str) -> tuple[tuple[WeightFile, ...], dict[str, str], tuple[str, ...]]:
    """The entries, set descriptions and default sets of a manifest file's ``text`` (format: the module docstring).

    Raises:
        ValueError: ``manifest_version`` is not :data:`MANIFEST_VERSION`, or a set is used but not described.
        TypeError: a key that is not a field of :class:`WeightFile`, :class:`Source` or :class:`Fact`.
    """
    data = json.loads(text)
    if data.get("manifest_version") != MANIFEST_VERSION:
        raise ValueError(f"{DATA_FILE}: manifest_version {data.get('manifest_version')!r}, but this code reads "
                         f"version {MANIFEST_VERSION}")
    entries = tuple(_entry(fields) for fields in data["files"])
    unknown = {s for e in entries for s in e.sets}.union(data["default_sets"]).difference(data["sets"])
    if unknown:
        raise ValueError(f"{DATA_FILE}: sets used but not described under 'sets': {sorted(unknown)}")
    return entries, dict(data["sets"]), tuple(data["default_sets"])


_ENTRIES, SETS, DEFAULT_SETS = _load((importlib.resources.files("nbhelpers") / "data" / DATA_FILE).read_text("utf-8"))
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
        unknown set or file name."""
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
    ``parsing``; landmark files depend on the backend and are not listed. Source: docs/official-behaviour.md §1.1."""
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
    (official-behaviour §1.1)."""
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
