"""The notebooks' environment: run mode, setup report, installs of what is missing, inputs, weights, result checks.

Every notebook's setup cell calls :func:`setup`, and its second cell :func:`run_mode`. The run mode decides where
inputs and weights come from:

=========  ==========================================================================================
mode       inputs and weights
=========  ==========================================================================================
``colab``  Google Colab: your uploads (``02_media``) or the packaged demo; weights from
           :func:`nbhelpers.weights.default_dir` (``NBHELPERS_WEIGHTS``, e.g. a shared Drive folder).
``local``  Jupyter elsewhere: the same as Colab without the Colab-only cells.
``ci``     Tests (``NBHELPERS_MODE=ci``): short clips cut from ``../shared/data`` (or the packaged demo),
           a tiny random-weights tree from :func:`nbhelpers.testing.make_tiny_weights`, the dlib backend,
           no progress bars, no installs (only the dry-run check).
=========  ==========================================================================================

Nothing here imports torch at module import; :func:`setup` asks :mod:`nbhelpers.gpu` for the device report.
"""

from __future__ import annotations

import functools
import hashlib
import html
import importlib
import importlib.metadata as metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .constants import FPS
from .errors import InputError, MediaError, NbHelpersError

MODES = ("colab", "ci", "local")
CI_CLIP_SECONDS = 0.6  # seconds of video and of audio cut from ../shared/data for CI runs (15 frames at 25 fps)
SHARED_VIDEO = "face-sing-576x768-25fps.mp4"  # names of the real test media in ../shared/data (test use only)
SHARED_AUDIO = "speech-en-short.wav"
SHARED_AUDIO_2 = "sing-44k1-mono.wav"
# Every media file a notebook may show, with its licence; the notebooks' licence lines come from this table.
MEDIA_LICENCES = {
    "astronaut.png": "Eileen Collins, NASA, public domain (shipped in scikit-image)",
    "demo-speech.wav": "speech synthesised with espeak-ng by this project, MIT",
    SHARED_VIDEO: "the project's test media in ../shared/data (CI mode only; test use only, not redistributed)",
    SHARED_AUDIO: "synthetic speech in ../shared/data (CI mode only; test use only, not redistributed)",
    SHARED_AUDIO_2: "the test video's audio in ../shared/data (CI mode only; test use only, not redistributed)",
}
AUDIO_SUFFIXES = (".wav", ".mp3", ".m4a", ".aac", ".ogg", ".oga", ".opus", ".flac", ".wma")
WORKBOOK_VIDEO = "video-25fps.mp4"  # what 02_media leaves in media_dir() for the later notebooks
WORKBOOK_AUDIO = "audio"  # + the uploaded file's suffix
DRIVE_MOUNTPOINT = "/content/drive"

# Packages the notebooks never install, upgrade or downgrade (Colab's own builds; changing them breaks the runtime
# or needs a restart). torch is not installed even when missing: its build must match the machine's CUDA.
PROTECTED = ("torch", "torchvision", "torchaudio", "numpy", "transformers", "huggingface-hub", "ipywidgets",
             "opencv-python", "opencv-python-headless", "opencv-contrib-python", "jax", "jaxlib", "tensorflow")
NEVER_INSTALL = ("torch", "torchvision", "torchaudio")
# Distributions that provide the same import as another: an installed alternative satisfies the requirement (two
# of them in one environment overwrite each other's files).
ALTERNATIVES = {
    "onnxruntime-gpu": ("onnxruntime",),
    "onnxruntime": ("onnxruntime-gpu",),
    "opencv-python-headless": ("opencv-python", "opencv-contrib-python", "opencv-contrib-python-headless"),
    "opencv-python": ("opencv-python-headless", "opencv-contrib-python", "opencv-contrib-python-headless"),
    "dlib-bin": ("dlib",),
    "dlib": ("dlib-bin",),
}

# Import name -> distribution names, for the version table and the restart check.
_DISTS = {
    "torch": ("torch",),
    "diffusers": ("diffusers",),
    "transformers": ("transformers",),
    "huggingface_hub": ("huggingface-hub",),
    "numpy": ("numpy",),
    "ipywidgets": ("ipywidgets",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "dlib": ("dlib", "dlib-bin"),
    "cv2": ("opencv-python-headless", "opencv-python", "opencv-contrib-python", "opencv-contrib-python-headless"),
    "PIL": ("pillow",),
    "scipy": ("scipy",),
    "matplotlib": ("matplotlib",),
    "mmpose": ("mmpose",),
}
REPORTED = ("torch", "diffusers", "transformers", "huggingface_hub", "numpy", "ipywidgets", "onnxruntime", "dlib")

_SESSION_START = time.time()  # seconds since the epoch when this kernel first imported nbhelpers.env


class ResultCheckError(NbHelpersError, AssertionError):
    """A notebook's final check found that this run did not produce its result (see the message)."""


# --------------------------------------------------------------------------------------------------- run mode


def in_colab() -> bool:
    """True inside a Google Colab runtime (the kernel has imported ``google.colab``)."""
    return "google.colab" in sys.modules or bool(os.environ.get("COLAB_RELEASE_TAG"))


def run_mode(mode: str | None = None) -> str:
    """Where this notebook runs: ``"colab"``, ``"ci"`` or ``"local"``.

    Args:
        mode: An explicit mode (e.g. a papermill parameter); None reads the environment: ``NBHELPERS_MODE``
            when set, else ``"colab"`` inside Colab, else ``"local"``.

    Returns:
        The mode. In ``"ci"`` mode progress bars are also switched off unless ``NBHELPERS_PROGRESS`` is set.

    Raises:
        InputError: ``mode`` or ``NBHELPERS_MODE`` is not one of ``colab``, ``ci``, ``local``.
    """
    source = "mode"
    if mode is None or mode == "":
        mode, source = os.environ.get("NBHELPERS_MODE", ""), "NBHELPERS_MODE"
    mode = str(mode).strip().lower()
    if not mode:
        mode = "colab" if in_colab() else "local"
    if mode not in MODES:
        raise InputError(f"{source} must be one of {', '.join(MODES)}; got {mode!r}. Unset it for automatic "
                         "detection, or set NBHELPERS_MODE=ci to run the notebooks as the tests do.")
    if mode == "ci" and "NBHELPERS_PROGRESS" not in os.environ:
        from . import progress

        progress.configure(disable=True)
    return mode


def _check_mode(mode: str | None) -> str:
    return run_mode(mode)


# --------------------------------------------------------------------------------------------------- versions


def package_version(*dists: str) -> str | None:
    """The installed version of the first of ``dists`` that is installed, or None.

    Args:
        *dists: Distribution names as pip knows them (``"huggingface-hub"``, ``"opencv-python-headless"``).

    Returns:
        The version string from the installed metadata (no import), or None when none is installed.
    """
    for name in dists:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def restart_reasons() -> list[str]:
    """Packages whose imported version differs from the installed one (an install ran after their import).

    Python keeps the old module in memory, so the kernel must restart before the new version is used. Colab's
    usual case: an install upgraded numpy after numpy was imported.

    Returns:
        One sentence per such package, e.g. ``"numpy 2.0.2 is imported but 2.3.5 is installed"``; empty when
        nothing needs a restart.
    """
    reasons = []
    for module_name, dists in _DISTS.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        imported = str(getattr(module, "__version__", "") or "")
        installed = package_version(*dists)
        if imported and installed and not _same_version(imported, installed):
            reasons.append(f"{module_name} {imported} is imported but {installed} is installed")
    return reasons


def _same_version(imported: str, installed: str) -> bool:
    """True when a module's ``__version__`` names the installed distribution's version.

    Some modules report a shorter version than their distribution (cv2 ``4.12.0`` for opencv ``4.12.0.88``, dlib
    ``19.24.6`` for dlib-bin ``19.24.6.post1``), so a release prefix counts as the same version.
    """
    try:
        from packaging.version import Version

        a, b = Version(imported), Version(installed)
    except Exception:  # noqa: BLE001 - unparsable versions: compare the text before any local suffix
        return imported.split("+")[0] == installed.split("+")[0]
    n = min(len(a.release), len(b.release))
    return a == b or (a.release[:n] == b.release[:n] and a.pre == b.pre)


# --------------------------------------------------------------------------------------------------- setup report


@dataclass(frozen=True)
class EnvReport:
    """What the setup cell found. Shows itself as a table in notebooks.

    Attributes:
        mode: ``"colab"``, ``"ci"`` or ``"local"``.
        python: Python version, e.g. ``"3.13.0"``.
        device: Device summary, e.g. ``"cuda: Tesla T4"`` or ``"cpu (no CUDA GPU)"``.
        vram_gib: Total memory of the first GPU in GiB, or None without one.
        versions: Package import name -> installed version (None when not installed).
        weights_dir: Where this mode reads the weights (not created by the report).
        drive_mounted: True when Google Drive is mounted at ``/content/drive``.
        restart_reasons: Why the kernel must restart before continuing (empty: no restart needed).
        gpu: The :func:`nbhelpers.gpu.report` object, or None when it could not be made.
        notes: Other remarks (a module that could not be asked, a missing package).
    """

    mode: str
    python: str
    device: str
    vram_gib: float | None
    versions: dict[str, str | None]
    weights_dir: Path | None
    drive_mounted: bool
    restart_reasons: tuple[str, ...] = ()
    gpu: Any = field(default=None, repr=False, compare=False)
    notes: tuple[str, ...] = ()

    @property
    def restart_needed(self) -> bool:
        """True when the kernel must restart (Colab: *Runtime > Restart session*) before continuing."""
        return bool(self.restart_reasons)

    @property
    def has_gpu(self) -> bool:
        """True when a CUDA GPU is visible."""
        return self.vram_gib is not None

    def rows(self) -> list[tuple[str, str]]:
        """The report as ``(name, value)`` rows (what the table shows)."""
        rows = [("run mode", self.mode), ("python", self.python), ("device", self.device),
                ("VRAM (GiB)", "-" if self.vram_gib is None else f"{self.vram_gib:.1f}")]
        rows += [(name, version or "not installed") for name, version in self.versions.items()]
        rows += [("weights dir", str(self.weights_dir) if self.weights_dir else "-"),
                 ("Google Drive", "mounted" if self.drive_mounted else "not mounted"),
                 ("restart needed", "yes: " + "; ".join(self.restart_reasons) if self.restart_reasons else "no")]
        rows += [("note", note) for note in self.notes]
        return rows

    def __str__(self) -> str:
        width = max(len(name) for name, _ in self.rows())
        lines = [f"{name:<{width}}  {value}" for name, value in self.rows()]
        if self.restart_needed:
            lines.append(RESTART_MESSAGE)
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(n)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for n, v in self.rows())
        warn = (f"<p style='color:#b00;font-weight:bold'>{html.escape(RESTART_MESSAGE)}</p>"
                if self.restart_needed else "")
        return f"{warn}<table>{body}</table>"


RESTART_MESSAGE = ("Restart needed: an install changed a package that was already imported. In Colab choose "
                   "Runtime > Restart session, then run the notebook again from the top.")


def setup(mode: str | None = None) -> EnvReport:
    """The setup cell's report: run mode, device, versions, weights folder, Drive, restart.

    Installs nothing (the setup cell's Colab-only ``%pip`` line does that before this call).

    Args:
        mode: Run mode override; None detects it (:func:`run_mode`).

    Returns:
        An :class:`EnvReport`; it renders as a table, with a red line when Colab must restart.

    Raises:
        InputError: ``NBHELPERS_MODE`` holds an unknown mode.
    """
    mode = run_mode(mode)
    notes: list[str] = []
    device, vram_gib, gpu_report = _device_summary(notes)
    return EnvReport(
        mode=mode,
        python=".".join(str(v) for v in sys.version_info[:3]),
        device=device,
        vram_gib=vram_gib,
        versions={name: package_version(*_DISTS[name]) for name in REPORTED},
        weights_dir=_weights_path(mode, notes),
        drive_mounted=drive_mounted(),
        restart_reasons=tuple(restart_reasons()),
        gpu=gpu_report,
        notes=tuple(notes),
    )


def _device_summary(notes: list[str]) -> tuple[str, float | None, Any]:
    """(device text, VRAM GiB or None, gpu report or None), asking nbhelpers.gpu first, then torch itself."""
    try:
        from . import gpu

        report = gpu.report()
    except (ImportError, AttributeError):
        report = None
    except Exception as exc:  # noqa: BLE001 - a report must never stop the setup cell
        notes.append(f"gpu.report() failed: {exc}")
        report = None
    if report is not None:
        has_gpu = bool(getattr(report, "has_gpu", False))
        vram = _first_number(report, ("total_gib",)) if has_gpu else None
        name = getattr(report, "name", None)
        device = str(getattr(report, "device", "cuda" if has_gpu else "cpu"))
        text = f"{device}: {name}" if has_gpu and name else ("cpu (no CUDA GPU)" if not has_gpu else device)
        return text, vram, report
    if package_version("torch") is None:
        notes.append("torch is not installed: install the build for your machine from pytorch.org")
        return "cpu (torch not installed)", None, None
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return f"cuda: {props.name}", props.total_memory / 2**30, None
    except Exception as exc:  # noqa: BLE001
        notes.append(f"torch could not report the GPU: {exc}")
    return "cpu (no CUDA GPU)", None, None


def _first_attr(obj: Any, names: Iterable[str]) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value not in (None, ""):
            return value
    return None


def _first_number(obj: Any, names: Iterable[str]) -> float | None:
    value = _first_attr(obj, names)
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def drive_mounted(mountpoint: str = DRIVE_MOUNTPOINT) -> bool:
    """True when Google Drive is mounted at ``mountpoint`` (its ``MyDrive`` folder exists)."""
    return Path(mountpoint, "MyDrive").is_dir()


def mount_drive(weights_folder: str | os.PathLike | None = None, *, enabled: bool = True,
                mountpoint: str = DRIVE_MOUNTPOINT) -> DriveStatus:
    """Mount Google Drive in Colab and optionally read the weights from a Drive folder.

    Outside Colab this does nothing and says so. For a workshop, a teacher downloads the weights once into a Drive
    folder and shares it; each student adds a shortcut to it in *My Drive* and passes its path here, which sets
    ``NBHELPERS_WEIGHTS`` for this session so that no student downloads the weights.

    Args:
        weights_folder: A folder on the mounted Drive holding the weights layout (``musetalkV15/unet.pth`` ...),
            e.g. ``"/content/drive/MyDrive/musetalk-weights"``; None or ``""`` leaves the weights location alone.
        enabled: False only reports the current state (the notebook's ``MOUNT_DRIVE`` parameter).
        mountpoint: Where Drive is mounted (Colab's convention: ``/content/drive``).

    Returns:
        A :class:`DriveStatus` saying whether Drive is mounted and which weights folder is in use.

    Raises:
        InputError: ``weights_folder`` does not exist on the mounted Drive (the message says how to add a
            shortcut to a shared folder).
    """
    if not in_colab():
        return DriveStatus(False, None, "not in Colab: nothing mounted (use a local folder with "
                                        "NBHELPERS_WEIGHTS instead)")
    if not enabled:
        state = "mounted" if drive_mounted(mountpoint) else "not mounted (set MOUNT_DRIVE = True to mount it)"
        return DriveStatus(drive_mounted(mountpoint), None, state)
    if not drive_mounted(mountpoint):
        from google.colab import drive  # type: ignore[import-not-found]

        drive.mount(mountpoint)
    weights = None
    if weights_folder:
        weights = Path(weights_folder).expanduser()
        if not weights.is_dir():
            raise InputError(
                f"weights_folder {str(weights)!r} does not exist on the mounted Drive. For a folder someone shared "
                "with you: open drive.google.com, right-click it in 'Shared with me', choose Organize > Add "
                f"shortcut > My Drive, then pass '{mountpoint}/MyDrive/<folder name>'.")
        os.environ["NBHELPERS_WEIGHTS"] = str(weights)
    return DriveStatus(drive_mounted(mountpoint), weights, "mounted" if drive_mounted(mountpoint) else "not mounted")


@dataclass(frozen=True)
class DriveStatus:
    """Result of :func:`mount_drive`.

    Attributes:
        mounted: True when Drive is mounted.
        weights_dir: The Drive weights folder now in ``NBHELPERS_WEIGHTS``, or None.
        message: What happened, in words.
    """

    mounted: bool
    weights_dir: Path | None
    message: str

    def __str__(self) -> str:
        weights = f"; weights from {self.weights_dir}" if self.weights_dir else ""
        return f"Google Drive: {self.message}{weights}"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


# --------------------------------------------------------------------------------------------------- installs


@dataclass(frozen=True)
class InstallRow:
    """One requirement of :func:`install_missing`.

    Attributes:
        name: Distribution name (normalised, e.g. ``"imageio-ffmpeg"``).
        requirement: The requirement line, e.g. ``"imageio-ffmpeg>=0.5"``.
        installed: Installed version before the install, or None.
        action: ``"ok"`` (satisfied), ``"install"``, ``"upgrade"``, ``"refused"`` (protected package), or
            ``"skipped"`` (its environment marker does not apply).
        note: Why, in words (for refused rows: what to do).
    """

    name: str
    requirement: str
    installed: str | None
    action: str
    note: str = ""


@dataclass(frozen=True)
class InstallReport:
    """Result of :func:`install_missing`; shows itself as a table.

    Attributes:
        rows: One :class:`InstallRow` per requirement.
        dry_run: True when nothing was installed.
        command: The pip argument list that ran (or would run); empty when nothing was needed.
        installed_now: ``name==version`` for each package installed by this call.
        restart_reasons: Packages imported before the install that it changed (restart the kernel).
    """

    rows: tuple[InstallRow, ...]
    dry_run: bool
    command: tuple[str, ...] = ()
    installed_now: tuple[str, ...] = ()
    restart_reasons: tuple[str, ...] = ()

    @property
    def missing(self) -> list[str]:
        """Requirement lines that need an install or an upgrade."""
        return [row.requirement for row in self.rows if row.action in ("install", "upgrade")]

    @property
    def refused(self) -> list[InstallRow]:
        """Rows this call will not touch (protected packages), with the reason."""
        return [row for row in self.rows if row.action == "refused"]

    @property
    def restart_needed(self) -> bool:
        """True when the kernel must restart to use what was installed."""
        return bool(self.restart_reasons)

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        lines = [f"{r.name:<26} {r.installed or '-':<14} {r.action:<8} {r.requirement}  {r.note}".rstrip()
                 for r in self.rows]
        head = f"{'package':<26} {'installed':<14} {'action':<8} requirement"
        tail = [self._summary()]
        return "\n".join([head, *lines, *tail])

    def _summary(self) -> str:
        if self.restart_needed:
            return RESTART_MESSAGE
        if self.installed_now:
            return "installed: " + ", ".join(self.installed_now)
        if self.missing:
            verb = "would install" if self.dry_run else "to install"
            return f"{verb}: " + " ".join(self.missing)
        if self.refused:
            names = ", ".join(f"{r.name} {r.installed} (needs {r.requirement})" for r in self.refused)
            return f"nothing to install; below their floor but protected, so left alone: {names}"
        return "nothing to install: every requirement is satisfied"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        cells = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(v))}</td>"
                             for v in (r.name, r.installed or "-", r.action, r.requirement, r.note)) + "</tr>"
            for r in self.rows)
        head = "".join(f"<th style='text-align:left'>{h}</th>"
                       for h in ("package", "installed", "action", "requirement", "note"))
        colour = "#b00" if self.restart_needed else "inherit"
        return (f"<table><tr>{head}</tr>{cells}</table>"
                f"<p style='color:{colour}'>{html.escape(self._summary())}</p>")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_requirements(requirements: str | os.PathLike | Sequence[str]) -> list[str]:
    """Requirement lines from a file or a list; comments and pip options dropped. Nothing is fetched by URL.

    Args:
        requirements: Path of a requirements file, or the requirement strings themselves.

    Returns:
        The requirement strings, e.g. ``["imageio-ffmpeg>=0.5", "onnxruntime>=1.16"]``.

    Raises:
        InputError: The file does not exist, or an address was given (the workbook reads nothing by URL at run
            time: what Colab lacks is the package's ``[colab]`` extra, see :func:`colab_requirements`).
    """
    if isinstance(requirements, (str, os.PathLike)):
        text_source = str(requirements)
        if re.match(r"^[a-z][a-z0-9+.-]*://", text_source, re.IGNORECASE):
            raise InputError(f"requirements {text_source!r} is an address; nothing is fetched at run time. Pass a "
                             "local requirements file or a list, or nothing for the package's [colab] extra.")
        path = Path(text_source).expanduser()
        if not path.is_file():
            raise InputError(f"requirements file {text_source!r} does not exist. Pass the path of a local "
                             "requirements file, or nothing for the package's [colab] extra.")
        lines: Iterable[str] = path.read_text(encoding="utf-8").splitlines()
    else:
        lines = requirements
    out = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            out.append(line)
    return out


DIST_NAME = "musetalk-workbook"  # this package's distribution name
COLAB_EXTRA = "colab"  # its extra of what Google Colab lacks (pyproject.toml [project.optional-dependencies])


def colab_requirements() -> list[str]:
    """What Google Colab lacks for the workbook: the ``[colab]`` extra of this package (floors, never torch).

    The setup cell installs them with the package (``%pip install "musetalk-workbook[colab] @ git+REPO@TAG"``);
    ``00_setup`` shows them as a table and ``check_setup`` checks them. They are read from this checkout's
    ``pyproject.toml`` when the imported package lives in one (the code and its list then always agree), else from
    the installed distribution's metadata. Nothing is fetched.

    Returns:
        Requirement strings without the extra's marker, e.g. ``["onnxruntime-gpu>=1.20", "soxr>=0.3"]``; those
        whose other environment markers do not hold here are left out.

    Raises:
        InputError: Neither a checkout nor an installed ``musetalk-workbook`` is found (the message says how to
            install it).
    """
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    lines = _checkout_extra(COLAB_EXTRA)
    from_metadata = lines is None
    if from_metadata:
        try:
            requires = metadata.requires(DIST_NAME) or []
        except metadata.PackageNotFoundError:
            raise InputError(f"{DIST_NAME} is not installed and this is no checkout, so its [{COLAB_EXTRA}] extra "
                             f"cannot be read; install it with pip install \"{DIST_NAME}[{COLAB_EXTRA}] @ "
                             "git+<repository>@<tag>\" (the setup cell does).") from None
        lines = requires
    here = {**default_environment(), "extra": COLAB_EXTRA}
    out = []
    for line in lines:
        req = Requirement(line)
        if from_metadata and (req.marker is None or req.marker.evaluate({**here, "extra": ""})):
            continue  # a base dependency, not part of the extra
        if req.marker is not None and not req.marker.evaluate(here):
            continue  # of the extra, but its marker does not hold here
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        out.append(f"{req.name}{extras}{req.specifier}")
    return out


def _checkout_extra(extra: str) -> list[str] | None:
    """The lines of ``extra`` from the pyproject.toml beside this package in a checkout, or None."""
    path = Path(__file__).resolve().parents[1] / "pyproject.toml"
    if not path.is_file():
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10: the installed metadata serves
        return None
    project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    if project.get("name") != DIST_NAME:
        return None
    return list(project.get("optional-dependencies", {}).get(extra, []))


def install_missing(requirements: str | os.PathLike | Sequence[str] | None = None,
                    dry_run: bool = False) -> InstallReport:
    """Install only the requirements that are missing or below their floor; never touch the protected packages.

    Each requirement's installed version (read from the package metadata, without importing) is compared with its
    specifier. Satisfied ones are left alone. torch, torchvision and torchaudio are never installed (their build
    must match the machine). Protected packages (:data:`PROTECTED`: numpy, transformers, huggingface-hub,
    opencv, ipywidgets, ...) are installed when absent but never upgraded. The rest runs as one
    ``python -m pip install`` argument list with a constraints file that pins every installed protected package
    to its present version, so that no dependency of a new package can move them either.

    Args:
        requirements: A requirements file path or a list of requirement strings (floors, e.g. ``"x>=1.2"``);
            None: the package's ``[colab]`` extra (:func:`colab_requirements`).
        dry_run: True only plans: the report lists what would be installed, and nothing runs. CI mode uses it.

    Returns:
        An :class:`InstallReport` (a table in notebooks); ``restart_needed`` tells when Colab must restart.

    Raises:
        InputError: A requirement line cannot be parsed, or the file cannot be read.
        NbHelpersError: pip failed (the message holds pip's last output lines).
    """
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement

    environment = default_environment()
    rows: list[InstallRow] = []
    lines = colab_requirements() if requirements is None else read_requirements(requirements)
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise InputError(f"requirement {line!r} cannot be parsed ({exc}); write it as 'name>=version'.") from exc
        name = _normalise(req.name)
        installed = package_version(req.name)
        if req.marker is not None and not req.marker.evaluate(environment):
            rows.append(InstallRow(name, line, installed, "skipped", f"marker {req.marker} does not apply"))
            continue
        satisfied = installed is not None and req.specifier.contains(installed, prereleases=True)
        alternative = next(((alt, v) for alt in ALTERNATIVES.get(name, ()) if (v := package_version(alt))
                            and req.specifier.contains(v, prereleases=True)), None)
        if satisfied:
            rows.append(InstallRow(name, line, installed, "ok"))
        elif installed is None and alternative is not None:
            rows.append(InstallRow(name, line, None, "ok", f"provided by {alternative[0]} {alternative[1]}"))
        elif name in NEVER_INSTALL:
            rows.append(InstallRow(name, line, installed, "refused",
                                   "install the torch build for your CUDA from pytorch.org; this never touches it"))
        elif name in PROTECTED and installed is not None:
            rows.append(InstallRow(name, line, installed, "refused",
                                   f"preinstalled core package: not upgraded; use an environment with {line}"))
        else:
            rows.append(InstallRow(name, line, installed, "install" if installed is None else "upgrade"))
    todo = [row.requirement for row in rows if row.action in ("install", "upgrade")]
    if not todo:
        return InstallReport(tuple(rows), dry_run)
    pins = [f"{name}=={version}" for name in PROTECTED if (version := package_version(name))]
    with tempfile.TemporaryDirectory(prefix="nbhelpers-pip-") as tmp:
        constraints = Path(tmp, "protected.txt")
        constraints.write_text("\n".join(pins) + "\n", encoding="utf-8")
        command = [sys.executable, "-m", "pip", "install", "--quiet", "-c", str(constraints), *todo]
        # The constraints file is gone once this returns, so the shown command names what it held instead.
        shown = tuple(command[:5] + ["-c", "<pins of installed protected packages>"] + command[7:])
        if dry_run:
            return InstallReport(tuple(rows), True, shown)
        before = {row.name: row.installed for row in rows}
        pip_timeout_s = 1800  # seconds: the few missing Colab packages take 1-2 min; a hung pip must not hang the cell
        try:
            done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=pip_timeout_s)
        except subprocess.TimeoutExpired as exc:  # subprocess.run has killed pip
            parts = [p.decode("utf-8", "replace") if isinstance(p, bytes) else p for p in (exc.stdout, exc.stderr)]
            said = "\n".join(p for p in parts if p).strip().splitlines()[-25:]  # bytes even with text=True
            raise NbHelpersError(
                f"pip did not finish installing {' '.join(todo)} within {pip_timeout_s // 60} minutes and was "
                "stopped (a stalled download or a package index that stopped answering). Check the network and "
                "run the setup cell again; packages already installed are kept.\n--- pip said ---\n"
                + ("\n".join(said) or "(nothing)")) from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise NbHelpersError(f"pip could not install {' '.join(todo)} (exit status {done.returncode}) without "
                             f"changing a protected package.\n--- pip said ---\n{tail}")
    importlib.invalidate_caches()
    now = tuple(f"{row.name}=={package_version(row.name)}" for row in rows
                if row.action in ("install", "upgrade") and package_version(row.name) != before[row.name])
    return InstallReport(tuple(rows), False, shown, now, tuple(restart_reasons()))


# --------------------------------------------------------------------------------------------------- folders


@functools.lru_cache(maxsize=1)
def _source_fingerprint() -> str:
    """A short hash of this package's source files, so CI caches made by older code are never reused."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def work_dir(mode: str | None = None) -> Path:
    """The workbook's own folder for media, avatars and results (created).

    ``NBHELPERS_WORKDIR`` when set; else ``/content/musetalk-workbook`` on Colab, ``~/musetalk-workbook``
    locally, and a temporary folder keyed by the package source in CI mode.

    Args:
        mode: Run mode; None detects it.

    Returns:
        The folder (it exists on return).
    """
    mode = _check_mode(mode)
    if os.environ.get("NBHELPERS_WORKDIR"):
        folder = Path(os.environ["NBHELPERS_WORKDIR"]).expanduser()
    elif mode == "ci":
        folder = Path(tempfile.gettempdir()) / f"nbhelpers-ci-{_source_fingerprint()}"
    elif mode == "colab":
        folder = Path("/content/musetalk-workbook")
    else:
        folder = Path.home() / "musetalk-workbook"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def media_dir(mode: str | None = None) -> Path:
    """``work_dir(mode)/media``: where ``02_media`` leaves the 25 fps video and the audio (created)."""
    folder = work_dir(mode) / "media"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _weights_path(mode: str, notes: list[str]) -> Path | None:
    if mode == "ci":
        return work_dir(mode) / "tiny-weights" / "models"
    try:
        from . import weights

        return Path(weights.default_dir())
    except (ImportError, AttributeError) as exc:
        notes.append(f"nbhelpers.weights is not available ({exc})")
        env = os.environ.get("NBHELPERS_WEIGHTS")
        return Path(env) if env else None


def weights_dir(mode: str | None = None, *, download: bool = True) -> Path:
    """The weights folder this mode uses, with the files in it.

    CI mode: a complete tiny random-weights tree in the official layout, made once by
    :func:`nbhelpers.testing.make_tiny_weights` and reused (the model hub is out of reach in CI). Otherwise
    :func:`nbhelpers.weights.default_dir` (``NBHELPERS_WEIGHTS``, a Drive folder, or the cache folder); with
    ``download`` the default set is downloaded into it when files are missing (present files are only checked).

    Args:
        mode: Run mode; None detects it.
        download: False only names the folder outside CI mode (``01_weights`` shows the download step itself).

    Returns:
        The folder path.

    Raises:
        WeightsError: A download failed (the message names the files and the fix).
    """
    mode = _check_mode(mode)
    if mode != "ci":
        from . import weights

        folder = Path(weights.default_dir())
        if download:
            weights.download(directory=folder)
        return folder
    target = work_dir(mode) / "tiny-weights" / "models"
    marker = target.parent / ".complete"
    if not marker.is_file():
        from .testing import make_tiny_weights

        make_tiny_weights(target)
        marker.write_text("made by nbhelpers.testing.make_tiny_weights\n", encoding="utf-8")
    return target


def shared_data_dir() -> Path | None:
    """The real test media folder (``../shared/data``), or None.

    ``NBHELPERS_SHARED_DATA`` when set, else the first ``shared/data`` found walking up from the current folder
    (notebooks run in ``notebooks/``, so the repository's sibling ``../shared/data`` is found).
    """
    env = os.environ.get("NBHELPERS_SHARED_DATA")
    candidates = [Path(env).expanduser()] if env else [p / "shared" / "data" for p in (Path.cwd(), *Path.cwd().parents)]
    for folder in candidates:
        if (folder / SHARED_VIDEO).is_file():
            return folder
    return None


def _ffmpeg() -> str:
    try:
        from .media import ffmpeg_exe

        return str(ffmpeg_exe())
    except (ImportError, AttributeError):
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()


def _cut(src: Path, dst: Path, seconds: float, kind: str) -> Path:
    """Cut the first ``seconds`` of ``src`` into ``dst`` (video: H.264 25 fps without audio; audio: PCM WAV)."""
    if dst.is_file() and dst.stat().st_size > 0:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.stem}.{os.getpid()}.tmp{dst.suffix}")
    if kind == "video":
        codec = ["-an", "-vf", f"fps={FPS}", "-c:v", "libx264", "-preset", "veryfast", "-crf", "18",
                 "-pix_fmt", "yuv420p"]
    else:
        codec = ["-vn", "-c:a", "pcm_s16le"]
    command = [_ffmpeg(), "-v", "error", "-y", "-i", str(src), "-t", f"{seconds:.3f}", *codec, str(tmp)]
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        from .errors import FFmpegError

        raise FFmpegError(f"could not cut the first {seconds} s of {src}", command, done.returncode,
                          "\n".join(done.stderr.splitlines()[-40:]))
    os.replace(tmp, dst)
    return dst


def workbook_inputs(mode: str | None = None, video: str | os.PathLike | None = None,
                    audio: str | os.PathLike | None = None, *, uploads: Sequence[str | os.PathLike] = (),
                    seconds: float = CI_CLIP_SECONDS) -> tuple[Path, Path]:
    """The video (or photo) and the audio a notebook works on.

    Given paths win, then ``uploads`` (the first audio file by its suffix is the audio, the first other file the
    video or photo). Otherwise: in CI mode, the first ``seconds`` of the shared test video and speech
    (``../shared/data``; the packaged demo when absent); elsewhere, what ``02_media`` left in :func:`media_dir`,
    else the packaged demo (:func:`nbhelpers.media.demo_inputs`: the astronaut photo and a speech clip).

    Args:
        mode: Run mode; None detects it.
        video: Your video or photo; None or ``""`` for the default.
        audio: Your speech audio (any format ffmpeg reads); None or ``""`` for the default.
        uploads: Files from :func:`upload` (Colab's file picker).
        seconds: Length of the CI clips in seconds.

    Returns:
        ``(video_path, audio_path)``.

    Raises:
        InputError: A given path does not exist.
        FFmpegError: Cutting the CI clips failed.
    """
    mode = _check_mode(mode)
    chosen = []
    for name, value in (("video", video), ("audio", audio)):
        if value in (None, ""):
            chosen.append(None)
            continue
        path = Path(value).expanduser()
        if not path.is_file():
            raise InputError(f"{name} {str(value)!r} does not exist. Give the path of a file (upload it in "
                             "02_media, or copy it to Drive and use its /content/drive/MyDrive/... path), or "
                             "leave it empty to use the sample.")
        chosen.append(path)
    uploaded = [Path(p) for p in uploads]
    audios = [p for p in uploaded if p.suffix.lower() in AUDIO_SUFFIXES]
    others = [p for p in uploaded if p not in audios]
    chosen[0] = chosen[0] or (others[0] if others else None)
    chosen[1] = chosen[1] or (audios[0] if audios else others[1] if len(others) > 1 else None)
    if chosen[0] is None or chosen[1] is None:
        default_video, default_audio = _default_inputs(mode, seconds)
        chosen[0] = chosen[0] or default_video
        chosen[1] = chosen[1] or default_audio
    return chosen[0], chosen[1]


def _default_inputs(mode: str, seconds: float) -> tuple[Path, Path]:
    if mode == "ci":
        shared = shared_data_dir()
        clips = work_dir(mode) / "clips"
        tag = f"{int(round(seconds * 1000))}ms"
        if shared is not None:
            return (_cut(shared / SHARED_VIDEO, clips / f"face-{tag}.mp4", seconds, "video"),
                    _cut(shared / SHARED_AUDIO, clips / f"speech-{tag}.wav", seconds, "audio"))
        photo, speech = _demo(clips / "demo")
        return photo, _cut(speech, clips / f"demo-speech-{tag}.wav", seconds, "audio")
    folder = media_dir(mode)
    video = folder / WORKBOOK_VIDEO
    audios = sorted(folder.glob(WORKBOOK_AUDIO + ".*"))
    if video.is_file() and audios:
        return video, audios[0]
    photo, speech = _demo(work_dir(mode) / "demo")
    return (video if video.is_file() else photo), (audios[0] if audios else speech)


def keep_audio(audio: str | os.PathLike, mode: str | None = None) -> Path:
    """Copy your audio into :func:`media_dir` as ``audio<suffix>`` so that the later notebooks find it.

    Args:
        audio: The speech file (any format ffmpeg reads).
        mode: Run mode; None detects it.

    Returns:
        The kept copy (the file itself when it already is that copy).

    Raises:
        InputError: ``audio`` does not exist.
    """
    source = Path(audio).expanduser()
    if not source.is_file():
        raise InputError(f"audio {str(audio)!r} does not exist; give the path of your speech file.")
    folder = media_dir(mode)
    target = folder / (WORKBOOK_AUDIO + source.suffix.lower())
    if source.resolve() == target.resolve():
        return target
    for old in folder.glob(WORKBOOK_AUDIO + ".*"):
        old.unlink()
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    return target


def _demo(folder: Path) -> tuple[Path, Path]:
    from .media import demo_inputs

    photo, speech = demo_inputs(folder)
    return Path(photo), Path(speech)


def sample_audios(mode: str | None = None, *, seconds: float = CI_CLIP_SECONDS) -> list[Path]:
    """Two different speech clips for the realtime notebook (several clips from one avatar).

    CI mode: the first ``seconds`` of two shared recordings (or the demo speech cut at two lengths). Elsewhere:
    the workbook audio (your upload or the demo speech) and the demo speech.

    Args:
        mode: Run mode; None detects it.
        seconds: Length of each CI clip in seconds.

    Returns:
        A list of two audio paths.
    """
    mode = _check_mode(mode)
    _, first = workbook_inputs(mode, seconds=seconds)
    if mode == "ci":
        shared = shared_data_dir()
        clips = work_dir(mode) / "clips"
        tag = f"{int(round(seconds * 1000))}ms"
        if shared is not None:
            return [first, _cut(shared / SHARED_AUDIO_2, clips / f"sing-{tag}.wav", seconds, "audio")]
        _, speech = _demo(clips / "demo")
        half = max(seconds / 2, 0.2)
        return [first, _cut(speech, clips / f"demo-speech-{int(round(half * 1000))}ms.wav", half, "audio")]
    _, speech = _demo(work_dir(mode) / "demo")
    return [first, speech]


def default_config(mode: str | None = None, **changes: Any):
    """The starting :class:`~nbhelpers.config.InferenceConfig` of a notebook in this mode.

    CI mode uses the ``dlib`` landmark backend (real faces found with no download) and the CPU; other modes keep
    the defaults (``auto`` backend, device and precision chosen by :func:`nbhelpers.gpu.plan`).

    Args:
        mode: Run mode; None detects it.
        **changes: Fields to set, e.g. ``version="v1"``.

    Returns:
        The config.
    """
    from .config import InferenceConfig

    mode = _check_mode(mode)
    base = {"landmark_backend": "dlib", "device": "cpu"} if mode == "ci" else {}
    base.update(changes)
    return InferenceConfig(**base)


def plan(kind: str = "lipsync", mode: str | None = None, **changes: Any):
    """:func:`nbhelpers.gpu.plan` for this mode: device, precision and batch size, with the reasons.

    Args:
        kind: ``"lipsync"``, ``"avatar"`` or ``"realtime"``.
        mode: Run mode; None detects it. CI mode plans for the tiny test models on the CPU.
        **changes: Fields of the starting config (:func:`default_config`), e.g. ``batch_size=4``.

    Returns:
        The plan; ``plan.config`` is the :class:`~nbhelpers.config.InferenceConfig` to use.
    """
    from . import gpu

    mode = _check_mode(mode)
    return gpu.plan(kind, config=default_config(mode, **changes), weights="tiny" if mode == "ci" else "full")


def upload(mode: str | None = None, directory: str | os.PathLike | None = None) -> list[Path]:
    """Colab's file picker: upload your video/photo and audio into ``directory``.

    Outside Colab this does nothing and returns an empty list (put the paths in the parameters cell instead).

    Args:
        mode: Run mode; None detects it. Only ``"colab"`` opens the picker.
        directory: Where the uploads are saved; default :func:`media_dir` ``/ "uploads"``.

    Returns:
        The saved files, in upload order.
    """
    mode = _check_mode(mode)
    if mode != "colab":
        return []
    from google.colab import files  # type: ignore[import-not-found]

    folder = Path(directory) if directory else media_dir(mode) / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    saved = []
    for name, data in files.upload().items():
        target = folder / Path(name).name
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        saved.append(target)
    return saved


# --------------------------------------------------------------------------------------------------- result checks


def check_result(result: Any, *, frames: int | None = None, duration_s: float | None = None,
                 from_cache: bool | None = None, min_rows: int | None = None, since: float | None = None) -> str:
    """The final cell's check: this run produced its result. Raises with a clear message otherwise.

    Checks, according to what ``result`` is:

    * a path, an object with an ``output`` path (:class:`LipsyncResult`, :class:`GenerateResult`) or a
      :class:`~nbhelpers.media.MediaInfo` of a written file: the file
      exists, is non-empty and was written during this session; its probed frame count equals the result's
      ``n_frames`` (or ``frames``), and its duration equals ``duration_s`` within one frame (1/25 s);
    * an object with ``loaded_from_cache`` (an avatar): it equals ``from_cache`` when given, and ``n_frames`` > 0;
    * an object with ``rows`` or a length (a table): at least ``min_rows`` rows (default 1).

    Args:
        result: What the notebook made.
        frames: Expected number of video frames, when known.
        duration_s: Expected duration in seconds (one frame of tolerance).
        from_cache: Expected ``loaded_from_cache`` of an avatar.
        min_rows: Minimum rows of a table-like result.
        since: Seconds since the epoch the file must be newer than (default: when this kernel imported nbhelpers).

    Returns:
        A one-line summary of what was checked (the cell shows it).

    Raises:
        ResultCheckError: A check failed; the message names it, shows the value and says what to look at.
    """
    checked: list[str] = []
    output = result if isinstance(result, (str, os.PathLike)) else getattr(result, "output", None)
    if output is None and hasattr(result, "duration_s") and isinstance(getattr(result, "path", None), os.PathLike):
        output = result.path  # a MediaInfo of a file written by this run
    if output is not None:
        known = getattr(result, "n_frames", None) if frames is None else frames
        checked += _check_file(Path(output), known,
                               duration_s, _SESSION_START if since is None else since)
    if hasattr(result, "loaded_from_cache"):
        cached = bool(result.loaded_from_cache)
        if from_cache is not None and cached != from_cache:
            raise ResultCheckError(
                f"loaded_from_cache is {cached}, expected {from_cache}: the avatar was "
                f"{'loaded from' if cached else 'rebuilt instead of loaded from'} its cache in "
                f"{getattr(result, 'directory', '?')}. Check that the settings match the prepared avatar.")
        n = int(getattr(result, "n_frames", 0) or 0)
        if n <= 0:
            raise ResultCheckError(f"the avatar has n_frames={n}; expected at least one prepared frame.")
        checked.append(f"avatar with {n} frames ({'loaded from cache' if cached else 'prepared now'})")
    if output is None and not hasattr(result, "loaded_from_cache"):
        rows = next((getattr(result, n) for n in ("rows", "checks", "files") if hasattr(result, n)), result)
        try:
            count = len(rows() if callable(rows) else rows)
        except TypeError:
            raise ResultCheckError(f"cannot check a result of type {type(result).__name__}: it has no output "
                                   "file, no avatar cache flag and no rows.") from None
        need = 1 if min_rows is None else min_rows
        if count < need:
            raise ResultCheckError(f"the table has {count} rows; expected at least {need}.")
        checked.append(f"table with {count} rows")
    return "OK: " + "; ".join(checked)


#: Distributions only the ``dwpose-onnx`` landmark backend needs (check_setup skips them for other backends).
ONNX_ONLY = frozenset({"onnxruntime", "onnxruntime-gpu"})


def check_setup(installs: InstallReport | None = None, backend: Any = None) -> str:
    """00_setup's final check: this runtime is ready for the other notebooks. Raises with the fix otherwise.

    Checks, in order: the install table has rows; every requirement in it is satisfied now (re-read from the
    package metadata, so an install that failed or has not taken effect shows up) and none was refused; torch
    imports; the ffmpeg binary that :mod:`nbhelpers.media` uses runs and reports a version; the landmark backend
    chosen in the notebook has a name. onnxruntime serves only the ``dwpose-onnx`` backend, so its rows are not
    required when another backend was chosen. It needs nothing from an earlier cell: given no table it reads the
    ``[colab]`` extra itself, and given a backend name it asks :func:`nbhelpers.faces.get_backend`. Source: none
    (ours).

    Args:
        installs: What :func:`install_missing` returned in this run; None reads the ``[colab]`` extra again
            (:func:`colab_requirements`), as a dry run.
        backend: The landmark backend from :func:`nbhelpers.faces.get_backend`, its name (``"auto"``,
            ``"dlib"``...), or None to skip that check.

    Returns:
        A one-line summary of what was checked (the cell shows it).

    Raises:
        ResultCheckError: A check failed; the message says what is missing and the command or step that fixes it.
    """
    if installs is None:
        installs = install_missing(None, dry_run=True)
    if not getattr(installs, "rows", None):
        raise ResultCheckError("the install table is empty: install_missing read no requirement. Check that the "
                               f"package's [{COLAB_EXTRA}] extra lists what Colab lacks (env.colab_requirements()).")
    if isinstance(backend, str):
        from . import faces

        backend = faces.get_backend(backend)
    backend_name = getattr(backend, "name", None) if backend is not None else None
    optional = set()
    if backend_name and backend_name != "dwpose-onnx":
        optional = {row.requirement for row in installs.rows if row.name in ONNX_ONLY}
    now = install_missing([row.requirement for row in installs.rows if row.requirement not in optional],
                          dry_run=True)
    if now.missing:
        if installs.dry_run:
            fix = ("install " + ("it" if len(now.missing) == 1 else "them") + " with: "
                   + shlex.join([sys.executable, "-m", "pip", "install", *now.missing]))
        else:
            fix = ("the install above did not take effect: on Colab choose Runtime > Restart session and run this "
                   "notebook again")
        raise ResultCheckError(f"still missing: {', '.join(now.missing)}; {fix}.")
    if now.refused:
        row = now.refused[0]
        raise ResultCheckError(f"{row.name} {row.installed} is below {row.requirement}; it is a protected package "
                               "(the workbook never upgrades it, so as not to break the runtime's own stack): "
                               f"upgrade it yourself, or use a runtime that has {row.requirement}.")
    satisfied = sum(row.action == "ok" for row in now.rows)
    checked = [f"{satisfied} requirement{'s' if satisfied != 1 else ''} satisfied"]
    if optional:
        checked.append(f"{', '.join(sorted(optional))} not needed by the {backend_name} backend")
    try:
        import torch
    except ImportError as exc:
        raise ResultCheckError(f"torch does not import ({exc}); install the torch build for your machine first "
                               "(https://pytorch.org/get-started/locally/), then run this notebook again.") from None
    checked.append(f"torch {torch.__version__}" + (" with CUDA" if torch.cuda.is_available() else " (CPU)"))
    from . import media

    exe = media.ffmpeg_exe()
    version = media.ffmpeg_version(exe)
    if version == (0, 0):
        raise ResultCheckError(f"the ffmpeg binary {exe!r} does not run or prints no version; reinstall "
                               "imageio-ffmpeg (pip install --force-reinstall imageio-ffmpeg).")
    checked.append(f"ffmpeg {version[0]}.{version[1]}")
    if backend is not None:
        if not backend_name:
            raise ResultCheckError(f"the landmark backend {backend!r} has no name: choose one with "
                                   "faces.get_backend('auto').")
        checked.append(f"landmarks: {backend_name}")
    return "OK: " + "; ".join(checked)


def _check_file(path: Path, frames: int | None, duration_s: float | None, since: float) -> list[str]:
    if not path.is_file() or path.stat().st_size == 0:
        raise ResultCheckError(f"the output file {str(path)!r} is missing or empty: the run did not write it.")
    mtime = path.stat().st_mtime
    if mtime + 1.0 < since:
        raise ResultCheckError(
            f"the output file {str(path)!r} was written at {time.ctime(mtime)}, before this session started "
            f"({time.ctime(since)}): it is a leftover of an earlier run, not this run's result.")
    found = [f"{path.name} written this session ({path.stat().st_size / 2**20:.2f} MiB)"]
    if frames is None and duration_s is None:
        return found
    from .media import probe

    info = probe(path)
    got_frames = _first_attr(info, ("frame_count", "n_frames", "frames"))
    # The video's own length (frames / 25) is what must match: the container also counts the audio's padding.
    got_seconds = int(got_frames) / FPS if got_frames else _first_number(info, ("duration_s", "duration"))
    if frames is not None and got_frames is not None and int(got_frames) != int(frames):
        raise ResultCheckError(f"{path.name} has {got_frames} frames; the result reports {frames}.")
    if duration_s is not None and got_seconds is not None and abs(got_seconds - duration_s) > 1.0 / FPS + 1e-6:
        raise ResultCheckError(f"{path.name} lasts {got_seconds:.3f} s; expected {duration_s:.3f} s within one "
                               f"frame ({1 / FPS:.2f} s).")
    if frames is not None:
        found.append(f"{frames} frames")
    if got_seconds is not None:
        found.append(f"{got_seconds:.2f} s")
    return found


def media_seconds(path: str | os.PathLike) -> float:
    """Duration of a media file in seconds (through :func:`nbhelpers.media.probe`).

    Raises:
        MediaError: The file cannot be probed or reports no duration.
    """
    from .media import probe

    seconds = _first_number(probe(path), ("duration_s", "duration", "seconds"))
    if seconds is None:
        raise MediaError(f"{path} reports no duration.")
    return seconds
