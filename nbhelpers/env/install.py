"""The installer: what is installed, what is missing, and installing it without touching torch."""

from __future__ import annotations

import html
import importlib
import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, NbHelpersError, package_version
from .modes import _DISTS, ALTERNATIVES, NEVER_INSTALL, PROTECTED, _ShownAsText


def restart_reasons() -> list[str]:
    """Packages whose imported version differs from the installed one (an install ran after their import), so the
    kernel must restart; one sentence each, e.g. ``"numpy 2.0.2 is imported but 2.3.5 is installed"``."""
    reasons = []
    for module_name, dists in _DISTS.items():
        imported = str(getattr(sys.modules.get(module_name), "__version__", "") or "")  # "": not imported
        if imported and (installed := package_version(*dists)) and not _same_version(imported, installed):
            reasons.append(f"{module_name} {imported} is imported but {installed} is installed")
    return reasons


def _same_version(imported: str, installed: str) -> bool:
    """True when ``imported`` names ``installed``, a release prefix included (cv2 ``4.12.0``, opencv ``4.12.0.88``)."""
    try:
        from packaging.version import Version

        a, b = Version(imported), Version(installed)
    except Exception:  # noqa: BLE001 - unparsable versions: compare the text before any local suffix
        return imported.split("+")[0] == installed.split("+")[0]
    n = min(len(a.release), len(b.release))
    return a == b or (a.release[:n] == b.release[:n] and a.pre == b.pre)


RESTART_MESSAGE = ("Restart needed: an install changed a package that was already imported. In Colab choose "
                   "Runtime > Restart session, then run the notebook again from the top.")


@dataclass(frozen=True)
class InstallRow:
    """One requirement of :func:`install_missing`: ``name`` normalised (``"imageio-ffmpeg"``), the version
    ``installed`` before (or None), ``action`` ``"ok"``, ``"install"``, ``"upgrade"``, ``"refused"`` (protected) or
    ``"skipped"`` (by a marker), and why, in ``note``."""

    name: str
    requirement: str
    installed: str | None
    action: str
    note: str = ""


@dataclass(frozen=True)
class InstallReport(_ShownAsText):
    """Result of :func:`install_missing`, shown as a table: the pip argument list that ran or would run
    (``command``, empty when nothing was needed), ``name==version`` of each package it ``installed_now``, and the
    ``restart_reasons`` (packages imported before the install that it changed)."""

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
        return "\n".join([f"{'package':<26} {'installed':<14} {'action':<8} requirement", *lines, self._summary()])

    def _summary(self) -> str:
        if self.restart_needed:
            return RESTART_MESSAGE
        if self.installed_now:
            return "installed: " + ", ".join(self.installed_now)
        if self.missing:
            return ("would install: " if self.dry_run else "to install: ") + " ".join(self.missing)
        if self.refused:
            names = ", ".join(f"{r.name} {r.installed} (needs {r.requirement})" for r in self.refused)
            return f"nothing to install; below their floor but protected, so left alone: {names}"
        return "nothing to install: every requirement is satisfied"

    def _repr_html_(self) -> str:
        cells = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(v))}</td>"
                             for v in (r.name, r.installed or "-", r.action, r.requirement, r.note)) + "</tr>"
            for r in self.rows)
        head = "".join(f"<th style='text-align:left'>{h}</th>"
                       for h in ("package", "installed", "action", "requirement", "note"))
        colour = "#b00" if self.restart_needed else "inherit"
        return f"<table><tr>{head}</tr>{cells}</table><p style='color:{colour}'>{html.escape(self._summary())}</p>"


def read_requirements(requirements: str | os.PathLike | Sequence[str]) -> list[str]:
    """Requirement lines from a requirements file or a list, with comments and pip options dropped. InputError when
    the file does not exist, or for an address (nothing is fetched at run time)."""
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
    stripped = (line.split(" #", 1)[0].strip() for line in lines)
    return [line for line in stripped if line and not line.startswith(("#", "-"))]


DIST_NAME = "musetalk-workbook"  # this package's distribution name
COLAB_EXTRA = "colab"  # its extra of what Google Colab lacks (pyproject.toml [project.optional-dependencies])


def colab_requirements() -> list[str]:
    """What Colab lacks for the workbook: this package's ``[colab]`` extra (floors, never torch), read from the
    checkout's ``pyproject.toml`` or the installed metadata, without the extra's marker and without the lines whose
    other markers do not hold here. InputError when neither a checkout nor an installed package is found."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    lines = _checkout_extra(COLAB_EXTRA)
    from_metadata = lines is None
    if from_metadata:
        try:
            lines = metadata.requires(DIST_NAME) or []
        except metadata.PackageNotFoundError:
            raise InputError(f"{DIST_NAME} is not installed and this is no checkout, so its [{COLAB_EXTRA}] extra "
                             f"cannot be read; install it with pip install \"{DIST_NAME}[{COLAB_EXTRA}] @ "
                             "git+<repository>@main\" (the setup cell does).") from None
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
    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
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


def _refuse_torch_dependencies(command: list[str], tmp: Path, todo: list[str], timeout_s: int) -> None:
    """Raise NbHelpersError when pip's resolution of ``command`` would install torch, torchvision or torchaudio:
    from PyPI they need not match the torch build (a CPU or CUDA wheel from pytorch.org's index). A pip without
    ``--report`` (before 22.2) skips this check; subprocess.TimeoutExpired when pip hangs."""
    report = tmp / "report.json"
    dry = [*command[:4], "--dry-run", "--report", str(report), *command[4:]]
    done = subprocess.run(dry, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout_s)
    if done.returncode != 0 or not report.is_file():
        return  # the install itself reports pip's error, or pip cannot write a report
    planned = {str(item.get("metadata", {}).get("name", "")).lower(): item.get("metadata", {}).get("version", "?")
               for item in json.loads(report.read_text(encoding="utf-8")).get("install", [])}
    pulled = [f"{name} {planned[name]}" for name in NEVER_INSTALL if name in planned]
    if pulled:
        torch_version = package_version("torch") or "(none installed)"
        raise NbHelpersError(
            f"installing {' '.join(todo)} would also install {', '.join(pulled)} from PyPI as a dependency, which "
            f"need not match your torch {torch_version}. Nothing was installed. Install "
            f"{' and '.join(p.split()[0] for p in pulled)} for your torch from the index you installed torch from "
            "(https://pytorch.org/get-started/locally/), then run this again.")


def install_missing(requirements: str | os.PathLike | Sequence[str] | None = None,
                    dry_run: bool = False) -> InstallReport:
    """Install only the ``requirements`` (a file or lines; None: the ``[colab]`` extra) that are missing or below
    their floor, or with ``dry_run`` only list them.

    torch, torchvision and torchaudio are never installed, named or as a dependency (pip's ``--dry-run --report``
    resolves first); packages of :data:`PROTECTED` are installed when absent but never upgraded. The rest runs as one
    ``pip install`` with a constraints file pinning the protected packages. Raises InputError when a requirement line
    cannot be parsed or the file cannot be read; NbHelpersError when the install would bring torch, torchvision or
    torchaudio (nothing installed), or pip failed or did not finish in 30 minutes (the message holds pip's last
    lines)."""
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    environment = default_environment()
    rows: list[InstallRow] = []
    lines = colab_requirements() if requirements is None else read_requirements(requirements)
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise InputError(f"requirement {line!r} cannot be parsed ({exc}); write it as 'name>=version'.") from exc
        name = canonicalize_name(req.name)  # PEP 503: "Imageio_FFmpeg" -> "imageio-ffmpeg"
        installed = package_version(req.name)
        if req.marker is not None and not req.marker.evaluate(environment):
            rows.append(InstallRow(name, line, installed, "skipped", f"marker {req.marker} does not apply"))
            continue
        alternative = next((f"{alt} {v}" for alt in ALTERNATIVES.get(name, ()) if (v := package_version(alt))
                            and req.specifier.contains(v, prereleases=True)), None)
        if installed is not None and req.specifier.contains(installed, prereleases=True):
            action, note = "ok", ""
        elif installed is None and alternative is not None:
            action, note = "ok", f"provided by {alternative}"
        elif name in NEVER_INSTALL:
            action, note = "refused", "install the torch build for your CUDA from pytorch.org; this never touches it"
        elif name in PROTECTED and installed is not None:
            action, note = "refused", f"preinstalled core package: not upgraded; use an environment with {line}"
        else:
            action, note = "install" if installed is None else "upgrade", ""
        rows.append(InstallRow(name, line, installed, action, note))
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
        pip_timeout_s = 1800  # seconds: the few missing Colab packages take 1-2 min; a hung pip must not hang the cell
        try:
            _refuse_torch_dependencies(command, Path(tmp), todo, pip_timeout_s)
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
                if row.action in ("install", "upgrade") and package_version(row.name) != row.installed)
    return InstallReport(tuple(rows), False, shown, now, tuple(restart_reasons()))
