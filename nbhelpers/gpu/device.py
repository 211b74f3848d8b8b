"""The device report: what this runtime has (GPU, memory, driver, versions, host RAM) and the checks on it, read
from torch and ``nvidia-smi``, each optional (torch is not imported at module import)."""

from __future__ import annotations

import contextlib
import html
import os
import platform
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, MissingDependencyError, NbHelpersError
from .model import DEFAULT_FRAME_SIZE, GIB, cpu_frame_seconds

NVIDIA_SMI_TIMEOUT_S = 10.0  # seconds allowed for one nvidia-smi call before the report says "unknown"
COLAB_GPU_STEPS = "Runtime > Change runtime type > T4 GPU > Save, then run the notebook again from the top"


def colab_gpu_steps() -> str:
    """:data:`COLAB_GPU_STEPS`; outside a notebook's kernel it says to run the script or command again."""
    if "ipykernel" in sys.modules:
        return COLAB_GPU_STEPS
    return COLAB_GPU_STEPS.replace("run the notebook again from the top", "run it again")


class NoGpuError(NbHelpersError, RuntimeError):
    """No CUDA GPU is usable and the caller did not allow the CPU (``allow_cpu`` / ``NBHELPERS_ALLOW_CPU=1``)."""


@dataclass(frozen=True)
class GpuProcess:
    """One process the driver lists on the GPU: ``pid`` as the driver sees it (in containers, a host pid), ``name``
    (``""`` when the driver does not say) and the GPU memory it holds, ``used_gib`` (None when not said)."""

    pid: int
    name: str = ""
    used_gib: float | None = None


class ShowsRows:
    """Shows ``_title`` and the ``(name, value)`` pairs of ``_rows()`` as aligned text and as an HTML table."""

    def __str__(self) -> str:
        rows = self._rows()
        width = max(len(k) for k, _ in rows)
        return f"{self._title}\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>" for k, v in self._rows())
        return f"<table><caption style='text-align:left'><b>{html.escape(self._title)}</b></caption>{body}</table>"


@dataclass(frozen=True)
class GpuReport(ShowsRows):
    """What this runtime has: GPU, memory, versions, host RAM. Shows itself as text and as an HTML table.

    ``device`` is ``"cuda:N"`` (the GPU reported) or ``"cpu"``; sizes are GiB and None when unknown: ``total_gib``,
    ``free_gib`` (the driver's; read through torch it excludes this process's CUDA context, ``memory_source`` says
    ``"torch"``, ``"nvidia-smi"`` or ``"none"``), ``reserved_gib`` / ``allocated_gib`` (this process's torch
    allocator, and the part live tensors use), host RAM total and available without swapping. ``other_processes``
    are those the driver lists on this GPU (None when unknown). The versions are None when unknown (``cuda_version``
    is torch's CUDA build); ``notes`` are odd states met while reading, in words; ``verdict`` is what
    :func:`~nbhelpers.gpu.plan` chooses for a lip-sync job, filled by :func:`nbhelpers.gpu.report`."""

    has_gpu: bool = False
    has_torch: bool = True
    device: str = "cpu"
    name: str | None = None
    compute_capability: tuple[int, int] | None = None
    total_gib: float | None = None
    free_gib: float | None = None
    reserved_gib: float = 0.0
    allocated_gib: float = 0.0
    other_processes: tuple[GpuProcess, ...] | None = None
    other_processes_source: str = "unknown"
    memory_source: str = "torch"
    driver_version: str | None = None
    cuda_version: str | None = None
    torch_version: str | None = None
    python_version: str = field(default_factory=platform.python_version)
    host_ram_total_gib: float | None = None
    host_ram_available_gib: float | None = None
    colab: bool = False
    notes: tuple[str, ...] = ()
    verdict: str = ""
    _title = "GPU report"

    @property
    def outside_torch_gib(self) -> float | None:
        """GPU memory outside this process's torch allocator (CUDA context + other processes), GiB, or None."""
        known = self.total_gib is not None and self.free_gib is not None
        return max(0.0, self.total_gib - self.free_gib - self.reserved_gib) if known else None

    @property
    def others_gib(self) -> float | None:
        """GPU memory held by the other processes the driver lists, GiB; None when unknown."""
        return None if self.other_processes is None else sum(p.used_gib or 0.0 for p in self.other_processes)

    def require_gpu(self, allow_cpu: bool | None = None) -> GpuReport:
        """Return this report, or stop when no CUDA GPU is usable, with the fix in words (the Colab steps).
        ``allow_cpu`` True lets a CPU-only runtime through; None reads ``NBHELPERS_ALLOW_CPU``.
        Raises MissingDependencyError: torch is not installed (whatever ``allow_cpu`` says); NoGpuError: no CUDA GPU is
        usable and the CPU is not allowed."""
        if self.has_gpu:
            return self
        if not self.has_torch:
            raise MissingDependencyError(
                "torch is not installed, so nothing can run. On Colab torch is preinstalled: restart the runtime "
                "(Runtime > Restart session). Elsewhere install it first, e.g.:\n    pip install torch")
        if allow_cpu is None:
            allow_cpu = os.environ.get("NBHELPERS_ALLOW_CPU", "").strip().lower() in ("1", "true", "yes", "on")
        if allow_cpu:
            return self
        why = "; ".join(self.notes) if self.notes else "torch.cuda.is_available() is False"
        where = (f"In Google Colab: {colab_gpu_steps()}." if self.colab else
                 f"In Google Colab: {colab_gpu_steps()}. Elsewhere: check that `nvidia-smi` lists a GPU and that "
                 "torch is a CUDA build (torch.version.cuda is not None).")
        raise NoGpuError(
            f"No CUDA GPU is usable in this runtime (torch {self.torch_version or 'version unknown'}; {why}). MuseTalk "
            f"needs a GPU: on the CPU one {DEFAULT_FRAME_SIZE[1]}x{DEFAULT_FRAME_SIZE[0]} frame takes about "
            f"{cpu_frame_seconds():.0f} s. {where} To run on the CPU anyway (CI, tiny models), pass allow_cpu=True or "
            "set the environment variable NBHELPERS_ALLOW_CPU=1.")

    def _rows(self) -> list[tuple[str, str]]:
        cc = ", compute capability {}.{}".format(*self.compute_capability) if self.compute_capability else ""
        usable = "" if self.has_gpu else " (not usable by torch)"
        rows = [("GPU", f"{self.name or 'unknown'} ({self.device}){cc}{usable}" if self.has_gpu or self.name
                 else "none (CPU only)")]
        if self.total_gib is not None and self.free_gib is not None:
            mem = (f"{self.total_gib:.1f} GiB total, {self.free_gib:.1f} GiB free, "
                   f"{self.reserved_gib:.2f} GiB reserved by this process")
            outside = self.outside_torch_gib
            if outside is not None and self.memory_source == "torch":
                mem += f", {outside:.2f} GiB outside torch (CUDA context + other processes)"
            rows.append(("memory", mem))
            if self.other_processes is None:
                rows.append(("other processes", "unknown"))
            elif not self.other_processes:
                rows.append(("other processes", f"none listed ({self.other_processes_source})"))
            else:
                listed = ", ".join(
                    f"{p.name or 'pid'} {p.pid}: " + ("?" if p.used_gib is None else f"{p.used_gib:.2f} GiB")
                    for p in self.other_processes)
                rows.append(("other processes", f"{self.others_gib:.2f} GiB ({listed}; {self.other_processes_source})"))
        rows.append(("versions", f"driver {self.driver_version or 'unknown'}, CUDA {self.cuda_version or 'none'} "
                     f"(torch build), torch {self.torch_version or 'not installed'}, Python {self.python_version}"))
        avail = "" if self.host_ram_available_gib is None else f", {self.host_ram_available_gib:.1f} GiB available"
        rows.append(("host RAM", "unknown" if self.host_ram_total_gib is None else
                     f"{self.host_ram_total_gib:.1f} GiB total{avail}"))
        rows.append(("runtime", "Google Colab" if self.colab else "not Colab"))
        rows += [("note", note) for note in self.notes]
        return rows + ([("verdict", self.verdict)] if self.verdict else [])


def read_report(device: str | int | None = None) -> GpuReport:
    """The :class:`GpuReport` of ``device`` (None: torch's current one, a CUDA index, ``"cuda"`` or ``"cuda:N"``).

    Never raises on odd driver states or without torch: what could not be read is None and ``notes`` says why.
    Reading free memory through torch makes this process's CUDA context.
    Raises InputError: ``device`` is not a CUDA device name or index, or names a device that does not exist."""
    notes: list[str] = []
    values: dict[str, Any] = {"colab": "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ}
    values["host_ram_total_gib"], values["host_ram_available_gib"] = _host_ram_gib()
    index = _device_index(device)
    uuid = None
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError from a broken CUDA install
        values["has_torch"] = False
        notes.append(f"torch is not installed ({type(exc).__name__}: {exc})")
    else:
        values["torch_version"] = str(torch.__version__)
        values["cuda_version"] = getattr(torch.version, "cuda", None)
        if values["cuda_version"] is None:
            notes.append(f"this torch ({torch.__version__}) is a CPU-only build")
        uuid = _read_torch_cuda(torch, index, values, notes)
    info = _driver_info(uuid, index, notes)
    values["driver_version"] = info.get("driver_version")
    if "processes" in info:
        values["other_processes"] = info["processes"]
        values["other_processes_source"] = info["source"]
    if not values.get("has_gpu") and info.get("name") and "total_gib" not in values:
        # torch cannot use the GPU (or is missing) but the driver sees one: show it, for the diagnosis.
        values.update(name=info["name"], total_gib=info.get("total_gib"), free_gib=info.get("free_gib"),
                      memory_source=info["source"])
    return GpuReport(notes=tuple(notes), **values)


def _no_cuda_message(device: str) -> str:
    return (f"config.device is {device!r} but no CUDA GPU is usable in this runtime. In Google Colab: "
            f"{colab_gpu_steps()}. Or set device=None (automatic) or 'cpu'.")


def check_device(device: str | None) -> None:
    """Stop a job whose ``device`` (``config.device``) names a CUDA device this runtime does not have.
    Raises NoGpuError: ``device`` names CUDA and torch sees no CUDA GPU, or fewer than N + 1 of them."""
    if device is None or not str(device).startswith("cuda"):
        return
    try:
        import torch
    except ImportError:
        count = 0
    else:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(str(device).partition(":")[2] or 0)
    if count == 0:
        raise NoGpuError(_no_cuda_message(device))
    if index >= count:
        raise NoGpuError(f"config.device is {device!r} but this runtime has {count} CUDA GPU(s) (cuda:0 to "
                         f"cuda:{count - 1}). Pick one of those, or device=None (automatic).")


def _device_index(device: str | int | None) -> int | None:
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return device
    text = str(device).strip().lower()
    if device is None or text == "cuda":
        return None
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise InputError(f"device must be None, a CUDA index >= 0, 'cuda' or 'cuda:N'; got {device!r}. "
                     "The report describes a CUDA GPU; for the CPU call report() with no device.")


def _read_torch_cuda(torch: Any, index: int | None, values: dict[str, Any], notes: list[str]) -> str | None:
    """Fill the CUDA fields of ``values`` from torch; return the device UUID (to find it in nvidia-smi) when known."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            available = bool(torch.cuda.is_available())
        except Exception as exc:  # noqa: BLE001
            available = False
            notes.append(f"torch.cuda.is_available() failed ({type(exc).__name__}: {exc})")
    notes += [f"torch warned: {str(w.message).strip()}" for w in caught]
    if not available:
        return None
    try:
        count = int(torch.cuda.device_count())
        index = int(torch.cuda.current_device()) if index is None else index
    except Exception as exc:  # noqa: BLE001
        notes.append(f"CUDA is available but the devices could not be counted ({type(exc).__name__}: {exc})")
        return None
    if index >= count:
        raise InputError(f"device cuda:{index} does not exist: torch sees {count} CUDA device(s) "
                         f"(cuda:0..cuda:{count - 1}). Pass device=None for the current one.")
    try:
        props = torch.cuda.get_device_properties(index)
        values.update(device=f"cuda:{index}", name=str(props.name),
                      compute_capability=(int(props.major), int(props.minor)),
                      total_gib=props.total_memory / GIB)
        uuid = str(getattr(props, "uuid", "") or "") or None
    except Exception as exc:  # noqa: BLE001
        notes.append(f"the properties of cuda:{index} could not be read ({type(exc).__name__}: {exc})")
        return None
    try:
        free, total = torch.cuda.mem_get_info(index)
        values.update(free_gib=free / GIB, total_gib=total / GIB, memory_source="torch",
                      reserved_gib=torch.cuda.memory_reserved(index) / GIB,
                      allocated_gib=torch.cuda.memory_allocated(index) / GIB)
    except Exception as exc:  # noqa: BLE001 - e.g. a GPU in exclusive mode held by another process
        notes.append(f"the free memory of cuda:{index} could not be read ({type(exc).__name__}: {exc}); "
                     "the GPU may be busy, lost or held by another process")
        values["memory_source"] = "none"
    else:
        values["has_gpu"] = True
    return uuid


def _same_uuid(a: str | None, b: str | None) -> bool:
    return bool(a and b) and a.strip().lower().removeprefix("gpu-") == b.strip().lower().removeprefix("gpu-")


def free_memory_by_index(notes: list[str] | None = None) -> dict[int, float] | None:
    """``{physical index: free GiB}`` of the GPUs this process may use (``CUDA_VISIBLE_DEVICES`` as whole numbers),
    read without CUDA from ``nvidia-smi``; empty without a GPU, None when it did not answer (why: ``notes``)."""
    rows = _run_nvidia_smi("gpu=index,memory.free", [] if notes is None else notes)
    if rows is None:
        return None
    pairs = [(_number(row[0]), _number(row[1])) for row in rows if len(row) >= 2]
    free = {int(index): mib / 1024 for index, mib in pairs if index is not None and mib is not None}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in wanted):
            free = {i: g for i, g in free.items() if str(i) in wanted}
    return free


def _run_nvidia_smi(query: str, notes: list[str]) -> list[list[str]] | None:
    """The CSV rows ``nvidia-smi`` answers to ``--query-<query>``; None (why: ``notes``) when it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        done = subprocess.run([exe, f"--query-{query}", "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=NVIDIA_SMI_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        notes.append(f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s")
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        notes.append(f"nvidia-smi could not run ({exc})")
        return None
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines()
        notes.append(f"nvidia-smi exited with status {done.returncode}" + (f": {said[0]}" if said else ""))
        return None
    return [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _driver_info(uuid: str | None, index: int | None, notes: list[str]) -> dict[str, Any]:
    """Driver version, name, memory and the other processes on the GPU from ``nvidia-smi``; {} when it cannot say."""
    gpus = _run_nvidia_smi("gpu=uuid,driver_version,name,memory.total,memory.free", notes)
    if gpus is None:
        return {}
    info: dict[str, Any] = {"source": "nvidia-smi"}
    rows = [r for r in gpus if len(r) >= 5]
    if not rows:
        return info
    by_index = rows[index or 0] if (index or 0) < len(rows) else rows[0]
    chosen = next((r for r in rows if _same_uuid(r[0], uuid)), by_index)
    info.update(driver_version=chosen[1] or None, name=chosen[2] or None)
    total, free = _number(chosen[3]), _number(chosen[4])
    if total is not None and free is not None:
        info["total_gib"], info["free_gib"] = total / 1024, free / 1024  # MiB -> GiB
    apps = _run_nvidia_smi("compute-apps=gpu_uuid,pid,process_name,used_memory", notes)
    if apps is None:
        return info
    procs = []
    for r in apps:
        if len(r) < 4 or "no running" in r[0].lower():
            continue
        pid = _number(r[1])
        if pid is None or int(pid) == os.getpid() or (len(rows) > 1 and not _same_uuid(r[0], chosen[0])):
            continue
        used = _number(r[3])
        procs.append(GpuProcess(int(pid), os.path.basename(r[2]), None if used is None else used / 1024))
    info["processes"] = tuple(procs)
    return info


def _host_ram_gib() -> tuple[float | None, float | None]:
    """(total, available) host RAM in GiB from /proc/meminfo, else psutil, else (None, None)."""
    with contextlib.suppress(OSError, ValueError):
        fields: dict[str, float] = {}
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    fields[key] = float(parts[0]) * 1024 / GIB  # kB -> GiB
        if "MemTotal" in fields:
            return fields["MemTotal"], fields.get("MemAvailable")
    try:
        import psutil

        vm = psutil.virtual_memory()
        return vm.total / GIB, vm.available / GIB
    except Exception:  # noqa: BLE001
        return None, None
