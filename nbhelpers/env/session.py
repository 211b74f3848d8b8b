"""The setup report of a notebook: versions, device, restart advice, in one object that shows itself."""

from __future__ import annotations

import html
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import gpu
from .drive import drive_mounted
from .folders import _weights_path
from .install import RESTART_MESSAGE, package_version, restart_reasons
from .modes import _DISTS, REPORTED, _ShownAsText, run_mode


@dataclass(frozen=True)
class EnvReport(_ShownAsText):
    """What the setup cell found, shown as a table in notebooks: ``device`` ``"cuda:0: Tesla T4"`` or ``"cpu (no CUDA
    GPU)"``, the GPU's total ``vram_gib`` (None without one), ``versions`` by import name (None: not installed), the
    :func:`nbhelpers.gpu.report` object ``gpu`` (or None), ``restart_reasons`` (empty: no restart needed)."""

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

    def rows(self) -> list[tuple[str, str]]:
        """The table's ``(name, value)`` rows."""
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

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(n)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for n, v in self.rows())
        warn = (f"<p style='color:#b00;font-weight:bold'>{html.escape(RESTART_MESSAGE)}</p>"
                if self.restart_needed else "")
        return f"{warn}<table>{body}</table>"


def setup(mode: str | None = None) -> EnvReport:
    """The setup cell's :class:`EnvReport`: run mode, device, versions, weights folder, Drive, restart. InputError
    when ``NBHELPERS_MODE`` holds an unknown mode."""
    mode = run_mode(mode)
    notes: list[str] = []
    device, vram_gib, report = "cpu (no CUDA GPU)", None, None
    try:
        report = gpu.report()
    except Exception as exc:  # noqa: BLE001 - a report must never stop the setup cell
        notes.append(f"gpu.report() failed: {exc}")
    if report is not None and report.has_gpu:
        device = f"{report.device}: {report.name}" if report.name else report.device
        vram_gib = report.total_gib
    return EnvReport(mode, ".".join(str(v) for v in sys.version_info[:3]), device, vram_gib,
                     {name: package_version(*_DISTS[name]) for name in REPORTED}, _weights_path(mode),
                     drive_mounted(), tuple(restart_reasons()), report, tuple(notes))
