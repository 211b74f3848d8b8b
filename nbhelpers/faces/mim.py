"""Installing the exact mmpose landmark path (mmengine, mmcv, mmdet, mmpose) through OpenMMLab's ``mim``, safely.

``mim install mmcv`` compiles mmcv from source (15-60 minutes; it fails against new torch) when OpenMMLab has no
prebuilt wheel for this torch and CUDA, so :func:`check_mmcv_wheels` reads that page first. :func:`install_mmpose`
holds torch, torchvision and numpy at their versions and verifies one pass. Without a wheel, the ``dwpose``
backend gives the same landmarks without mmcv.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import InputError, MissingDependencyError, package_version
from ..hashing import atomic_path
from ..weights.manifest import in_colab

#: Base of OpenMMLab's mmcv find-links pages: ``{base}/{cu118|cu121|cpu}/torch{2.1}/index.html``.
OPENMMLAB_MMCV_INDEX = "https://download.openmmlab.com/mmcv/dist"
BUILD_TIME_COLAB = "15-30 minutes on Colab"
BUILD_TIME_2_CORES = "45-60 minutes on a 2-core machine"
STEP_TIMEOUT_S = 3600.0  # the most one install command may take, seconds (an mmcv build from source included)


@dataclass(frozen=True)
class PinSet:
    """The OpenMMLab versions for one ``torch_series`` (``"2.1"``): an ``mmengine`` specifier, exact ``mmcv``, ``mmdet``
    and ``mmpose`` versions, and a ``note`` saying why."""

    torch_series: str
    mmengine: str
    mmcv: str
    mmdet: str
    mmpose: str
    note: str


# Source of each choice: README.md:151-185 (Q29) for torch 2.0; the version checks in mmdet/mmpose __init__ (mmdet
# 3.1.0 wants mmcv < 2.1.0, mmdet 3.3.0 mmcv < 2.2.0, mmpose 1.1.0 mmcv <= 2.1.0, mmpose 1.3.2 mmcv <= 3.0.0) and
# OpenMMLab's pages (the newest prebuilt mmcv for torch 2.1 is 2.1.0) for torch 2.1.
PINS: dict[str, PinSet] = {
    "2.0": PinSet("2.0", ">=0.7.1,<1.0.0", "2.0.1", "3.1.0", "1.1.0",
                  "the official README pins (Python 3.10, torch 2.0.1, CUDA 11.8; quirk Q29)"),
    "2.1": PinSet("2.1", ">=0.7.1,<1.0.0", "2.1.0", "3.3.0", "1.3.2",
                  "mmcv 2.1.0 is OpenMMLab's prebuilt mmcv for torch 2.1; mmdet 3.1.0 refuses mmcv 2.1.0, so mmdet "
                  "3.3.0, and mmpose 1.3.2 (the version this package's tests run; RTMPose unchanged since 1.1.0)"),
}


def torch_series(version: str) -> str:
    """``"2.1.2+cu121"`` -> ``"2.1"``; InputError for a string that is no torch version."""
    m = re.match(r"^\s*(\d+)\.(\d+)", str(version))
    if not m:
        raise InputError(f"torch={version!r}: expected a torch version such as '2.1.2' or '2.1'")
    return f"{int(m.group(1))}.{int(m.group(2))}"


def pins_for(torch_version: str) -> PinSet:
    """The :class:`PinSet` for a torch version or series: the official pins for torch 2.0 (``README.md:151-185``,
    quirk Q29), the mmcv 2.1.0 set for 2.1 and newer (newer: mmcv compiled from source, said in the note)."""
    series = torch_series(torch_version)
    if series in PINS:
        return PINS[series]
    return replace(PINS["2.1"], torch_series=series,
                   note=f"no OpenMMLab mmcv wheel is expected for torch {series}: the torch 2.1 set, with mmcv "
                        f"compiled from source ({BUILD_TIME_COLAB}, {BUILD_TIME_2_CORES})")


@dataclass(frozen=True)
class WheelCheck:
    """Whether OpenMMLab has a prebuilt mmcv wheel (``ok``) of ``mmcv_version`` for this Python, torch and CUDA: the
    page read, what was looked for (``"cp310"``, ``"2.1"``, ``"cu121"``, ``"linux-x86_64"``), the file names of the
    ``matching`` wheels and of every mmcv wheel ``listed``, ``page_found`` and ``reachable`` (False: no such page, no
    server), the ``recommended_backend`` (``"mmpose"`` when ok, else ``"dwpose"``) and the verdict in words."""

    ok: bool
    page_url: str
    python_tag: str
    torch_series: str
    cuda_tag: str
    platform: str
    mmcv_version: str
    matching: tuple[str, ...] = ()
    listed: tuple[str, ...] = ()
    page_found: bool = True
    reachable: bool = True
    recommended_backend: str = "dwpose"
    message: str = ""

    def __str__(self) -> str:
        return self.message

    def _repr_markdown_(self) -> str:
        head = "**mmcv wheel: found**" if self.ok else "**mmcv wheel: none**"
        return f"{head}  \n{self.message}"


_HREF = re.compile(r"""<a\s[^>]*?href\s*=\s*["']?([^"'\s>]+)""", re.IGNORECASE)
_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+?)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-"
                    r"(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def parse_wheel_name(filename: str) -> dict | None:
    """Split a wheel file name into name, version, py, abi and plat tags; None when it is no wheel."""
    m = _WHEEL.match(filename)
    if not m:
        return None
    d = m.groupdict()
    d["name"] = re.sub(r"[-_.]+", "-", d["name"]).lower()
    return d


def wheel_links(page_html: str) -> list[str]:
    """File names of all ``.whl`` links of a find-links page (URL-decoded, without ``#sha256=...``)."""
    paths = (urllib.parse.urlsplit(html.unescape(href)).path for href in _HREF.findall(page_html))
    names = (urllib.parse.unquote(path.rsplit("/", 1)[-1]) for path in paths)
    return [name for name in names if name.endswith(".whl")]


def _platform_matches(wheel_platform: str, platform: str) -> bool:
    tags = wheel_platform.split(".")
    plat = platform.replace("-", "_").replace(".", "_").lower()
    if plat.startswith("linux_"):
        arch = plat[len("linux_"):]
        return any(t.startswith(("manylinux", "linux")) and t.endswith("_" + arch) for t in tags)
    if plat.startswith("macosx"):
        arch = plat.rsplit("_", 1)[-1]
        return any(t.startswith("macosx") and t.endswith((arch, "universal2")) for t in tags)
    return plat in tags  # Windows and others: the same tag


def _python_tag(python: str | None) -> str:
    if python is None:
        return f"cp{sys.version_info.major}{sys.version_info.minor}"
    text = str(python).strip().lower()
    if re.fullmatch(r"cp3\d+", text):
        return text
    m = re.fullmatch(r"(\d)\.(\d+)(\.\d+)?", text)
    if not m:
        raise InputError(f"python={python!r}: expected a version such as '3.10' or a tag such as 'cp310'")
    return f"cp{m.group(1)}{m.group(2)}"


def _cuda_tag(torch_version: str) -> str:
    """The local tag of ``torch_version`` (``"2.1.2+cu121"``: ``"cu121"``; ``"cpu"``), else the installed torch's."""
    local = torch_version.partition("+")[2].lower()
    if re.fullmatch(r"cu\d+|cpu", local):
        return local
    try:
        import torch
    except ImportError:
        return "cpu"
    return f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"


def expected_build_time() -> str:
    """Expected time to compile mmcv from source here (on Colab, or on this machine's cores), in words."""
    if in_colab():
        return f"about {BUILD_TIME_COLAB}"
    cores = os.cpu_count() or 2
    if cores <= 2:
        return f"about {BUILD_TIME_2_CORES}"
    low, high = max(5, round(45 * 2 / cores)), max(10, round(60 * 2 / cores))
    return f"roughly {low}-{high} minutes on {cores} cores ({BUILD_TIME_2_CORES})"


def _fetch(url: str, timeout: float) -> tuple[str | None, bool, str]:
    """(text or None, reachable, error) for an http(s):// or file:// URL."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read().decode("utf-8", "replace"), True, ""
    except urllib.error.HTTPError as exc:
        return None, exc.code in (403, 404, 410), f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (FileNotFoundError, NotADirectoryError)):
            return None, True, "no such file"
        return None, False, str(exc.reason)
    except (OSError, ValueError) as exc:  # timeouts, bad URLs
        return None, False, f"{type(exc).__name__}: {exc}"


def check_mmcv_wheels(index_url: str = OPENMMLAB_MMCV_INDEX, python: str | None = None, torch: str | None = None,
                      *, mmcv: str | None = None, platform: str | None = None, timeout: float = 15.0) -> WheelCheck:
    """Whether a prebuilt mmcv wheel matches this Python, torch and CUDA, decided before installing anything.

    Reads ``{index_url}/{cuda_tag}/torch{major.minor}/index.html`` (``mim install mmcv``'s page; or ``index_url``
    itself, a page) within ``timeout`` seconds. ``python``, ``torch`` (a local tag such as ``+cu118`` names the
    CUDA), ``mmcv`` and ``platform`` default to this machine's and :func:`pins_for`'s. A missing page or server is
    reported in the :class:`WheelCheck`; InputError for a ``python`` or ``torch`` that is no version, or no torch."""
    py_tag = _python_tag(python)
    if torch is None:
        torch = package_version("torch")
        if torch is None:
            raise InputError("torch=None and torch is not installed: install torch first, or pass torch='2.1'")
    series = torch_series(torch)
    cuda_tag = _cuda_tag(torch)
    want = mmcv or pins_for(torch).mmcv
    plat = platform or sysconfig.get_platform()
    base = str(index_url).rstrip("/")
    # OpenMMLab's docs name the page torch2.1/, mim asks for torch2.1.0/ (checked with openmim 0.3.9): try both.
    pages = [base] if base.endswith(".html") else [f"{base}/{cuda_tag}/torch{series}/index.html",
                                                     f"{base}/{cuda_tag}/torch{series}.0/index.html"]
    common = dict(python_tag=py_tag, torch_series=series, cuda_tag=cuda_tag, platform=plat, mmcv_version=want)
    where = f"Python {py_tag[2]}.{py_tag[3:]}, torch {series}, {cuda_tag}, {plat}"
    here = expected_build_time()
    others = [t for t in (BUILD_TIME_COLAB, BUILD_TIME_2_CORES) if t not in here]
    fallback = (f"Compiling mmcv from source instead would take {here}"
                + (f" (for reference: {', '.join(others)})" if others else "")
                + " and can fail against new torch. Use the 'dwpose' landmark backend: the same DWPose weights "
                "and maths in plain torch, no mmcv.")

    for page in pages:
        text, reachable, error = _fetch(page, timeout)
        if text is not None or not reachable:
            break
    if text is None and not reachable:
        return WheelCheck(False, page, **common, page_found=False, reachable=False,
                          message=f"Could not reach {page} ({error}), so it is unknown whether a prebuilt mmcv "
                                  f"{want} wheel exists for {where}. `mim install mmcv` would then try to compile "
                                  f"it. {fallback}")
    if text is None:
        return WheelCheck(False, pages[0], **common, page_found=False,
                          message=f"OpenMMLab has no mmcv wheels for torch {series} with {cuda_tag}: no page at "
                                  f"{' or '.join(pages)} ({error}). No prebuilt mmcv {want} for {where}. {fallback}")
    wheels = {name: info for name in wheel_links(text) if (info := parse_wheel_name(name)) and info["name"] == "mmcv"}
    listed = list(wheels)
    matching = [name for name, info in wheels.items() if info["version"] == want and py_tag in info["py"].split(".")
                and any(a in (py_tag, "abi3", "none") for a in info["abi"].split("."))
                and _platform_matches(info["plat"], plat)]
    if matching:
        return WheelCheck(True, page, **common, matching=tuple(matching), listed=tuple(listed),
                          recommended_backend="mmpose",
                          message=f"Prebuilt mmcv {want} wheel for {where}: {matching[0]} ({page}). "
                                  f"install_mmpose() installs it without compiling (a few minutes).")
    versions = sorted({info["version"] for info in wheels.values()})
    pythons = sorted({t for info in wheels.values() if info["version"] == want for t in info["py"].split(".")})
    detail = (f"the page lists {len(listed)} mmcv wheels (versions {', '.join(versions) or 'none'}; "
              f"mmcv {want} for {', '.join(pythons) or 'no Python'})")
    return WheelCheck(False, page, **common, listed=tuple(listed),
                      message=f"No prebuilt mmcv {want} wheel for {where} at {page}: {detail}. {fallback}")


@dataclass
class StepResult:
    """One install command that ran: its argument list, exit status, seconds and the end of its output."""

    command: list[str]
    returncode: int
    seconds: float
    output_tail: str = ""


@dataclass
class MimInstallResult:
    """What :func:`install_mmpose` did (or, for a ``dry_run``, would do). ``ok``: every command succeeded, torch,
    torchvision and numpy are unchanged and the self-check passed; ``steps``: those of the ``commands`` that ran;
    ``constraints``: the text of the file passed with ``-c``; ``verify``: the JSON report of the self-check."""

    ok: bool
    dry_run: bool
    commands: list[list[str]]
    constraints_path: Path
    constraints: str
    pins: PinSet
    wheel_check: WheelCheck | None = None
    steps: list[StepResult] = field(default_factory=list)
    verify: dict | None = None
    seconds: float = 0.0
    message: str = ""

    def __str__(self) -> str:
        return self.message

    def _repr_markdown_(self) -> str:
        lines = [f"**mmpose install: {'dry run' if self.dry_run else ('ok' if self.ok else 'failed')}** "
                 f"({self.seconds:.0f} s)  ", self.message, "", "```"]
        lines += [shlex.join(c) for c in self.commands]
        return "\n".join(lines + ["```"])


# One line (no shell involved): the versions of torch, numpy and torchvision in another interpreter, as JSON.
_VERSIONS_SNIPPET = ("import json,sys,sysconfig,importlib.metadata as m;print(json.dumps({**{d:next((x.version for x "
                     "in m.distributions(name=d)),None) for d in ('torch','numpy','torchvision')},'python':'%d.%d'%"
                     "sys.version_info[:2],'platform':sysconfig.get_platform()}))")
_HELD = ("torch", "numpy", "torchvision")


def _versions_of(python: str) -> dict:
    """torch/numpy/torchvision versions installed for ``python`` (this process's metadata when it is us), with its
    ``python`` version ``"3.12"`` and wheel ``platform`` (``sysconfig.get_platform()``)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return {**{d: package_version(d) for d in _HELD}, "python": "{}.{}".format(*sys.version_info[:2]),
                "platform": sysconfig.get_platform()}
    res = subprocess.run([python, "-c", _VERSIONS_SNIPPET], capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise MissingDependencyError(f"python={python!r} could not report its package versions: "
                                     f"{res.stderr.strip()[-400:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def install_mmpose(dry_run: bool = False, *, python: str | None = None, only_binary: bool = False,
                   wheel_check: WheelCheck | None = None, mmcv_base_url: str | None = None) -> MimInstallResult:
    """Install mmengine, mmcv, mmdet and mmpose through openmim, torch, torchvision and numpy held by ``-c
    <constraints>``: openmim and ``setuptools<81`` (mim imports ``pkg_resources``), ``mim install`` mmengine, mmcv and
    mmdet, ``pip install --no-deps mmpose`` (its ``chumpy`` does not build) and what mmpose imports; then a
    self-check with random weights in a new interpreter. A failed command stops the install with ``ok`` False; a
    ``dry_run`` only writes the constraints file (in a shared temporary folder) and returns the commands. ``python``
    (default: this one) is the interpreter installed into, whose torch, torchvision and numpy are held; the versions
    are :func:`pins_for` its torch; ``only_binary`` refuses to compile mmcv; ``wheel_check`` defaults to
    :func:`check_mmcv_wheels` now, for ``python``'s version and platform; ``mmcv_base_url`` is a mirror of
    ``https://download.openmmlab.com`` (mim's ``MMCV_BASE_URL``); each command may take :data:`STEP_TIMEOUT_S`.
    MissingDependencyError without torch or numpy.

    Source: ``README.md:151-185`` (quirk Q29)."""
    python = python or sys.executable
    found = _versions_of(python)
    held = {name: found[name] for name in _HELD if found.get(name)}  # torch, numpy, torchvision if there
    torch_version, numpy_version = held.get("torch"), held.get("numpy")
    if not torch_version or not numpy_version:
        raise MissingDependencyError(f"install_mmpose holds torch and numpy at their installed versions, but "
                                     f"{python} has torch={torch_version!r}, numpy={numpy_version!r}. Install torch "
                                     f"and numpy first (on Colab they are preinstalled).")
    pins = pins_for(torch_version)
    constraints = "".join(f"{name}=={ver}\n" for name, ver in held.items())
    # One shared folder, the file named by its content, so that repeated dry runs reuse one file instead of leaving
    # a new temporary folder each time; the file stays, since the commands shown refer to it.
    digest = hashlib.sha256(constraints.encode()).hexdigest()[:12]
    cons_path = Path(tempfile.gettempdir()) / "nbhelpers-mim" / f"constraints-{digest}.txt"
    with atomic_path(cons_path) as tmp:
        tmp.write_text(constraints)

    numpy2 = int(numpy_version.split(".")[0]) >= 2
    pip = [python, "-m", "pip", "install", "-c", str(cons_path)]
    mim = [python, "-m", "mim", "install", "-c", str(cons_path)]
    commands = [
        pip + ["openmim>=0.3.9", "setuptools<81", "wheel"] + (["cython"] if numpy2 else []),
        mim + [f"mmengine{pins.mmengine}"],
        mim + [f"mmcv=={pins.mmcv}"] + (["--only-binary", "mmcv"] if only_binary else []),
        mim + [f"mmdet=={pins.mmdet}"],
        pip + ["--no-deps", f"mmpose=={pins.mmpose}"],
        pip + ["json_tricks", "munkres", "scipy", "matplotlib", "pillow"],
        pip + (["--no-binary", "xtcocotools", "--no-build-isolation"] if numpy2 else []) + ["xtcocotools>=1.12"],
    ]
    result = MimInstallResult(ok=False, dry_run=dry_run, commands=commands, constraints_path=cons_path,
                              constraints=constraints, pins=pins, wheel_check=wheel_check)
    if dry_run:
        result.message = (f"Dry run: {len(commands)} commands for mmcv {pins.mmcv}, mmdet {pins.mmdet}, mmpose "
                          f"{pins.mmpose} ({pins.note}); torch {torch_version} and numpy {numpy_version} held by "
                          f"{cons_path}.")
        return result

    if result.wheel_check is None:
        index = f"{mmcv_base_url.rstrip('/')}/mmcv/dist" if mmcv_base_url else OPENMMLAB_MMCV_INDEX
        # the wheel tags of the interpreter installed into, which need not be this one
        result.wheel_check = check_mmcv_wheels(index, python=found["python"], torch=torch_version, mmcv=pins.mmcv,
                                               platform=found["platform"])
    start = time.perf_counter()
    env = dict(os.environ)
    if mmcv_base_url:
        env["MMCV_BASE_URL"] = mmcv_base_url.rstrip("/")
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    for cmd in commands:
        t0 = time.perf_counter()
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, env=env,
                                 stdin=subprocess.DEVNULL)
            code, out = res.returncode, (res.stdout + res.stderr)
        except subprocess.TimeoutExpired as exc:
            code, out = -9, f"timed out after {STEP_TIMEOUT_S:.0f} s\n{exc.stdout or ''}{exc.stderr or ''}"
        result.steps.append(StepResult(cmd, code, round(time.perf_counter() - t0, 2), str(out)[-3000:]))
        if code != 0:
            result.seconds = round(time.perf_counter() - start, 2)
            result.message = (f"Install step failed (exit {code}) after {result.seconds:.0f} s: {' '.join(cmd)}\n"
                              f"{str(out)[-1500:]}\n{result.wheel_check.message if result.wheel_check else ''}")
            return result

    after = _versions_of(python)
    changed = {d: (v, after.get(d)) for d, v in held.items() if after.get(d) != v}
    cmd = [python, "-m", "nbhelpers.faces.mmpose_backend", "--self-check", "--device", "cpu"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    try:
        result.verify = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result.verify = {"ok": False, "reason": (res.stdout + res.stderr)[-1500:]}
    result.seconds = round(time.perf_counter() - start, 2)
    verified = bool(result.verify.get("ok"))
    result.ok = verified and not changed
    if changed:
        result.message = (f"Installed, but these changed although they were held: {changed}. Restart the runtime "
                          f"and check the environment.")
    elif not verified:
        result.message = (f"Installed in {result.seconds:.0f} s, but the verification failed: "
                          f"{result.verify.get('reason', '')}")
    else:
        result.message = (f"mmpose {pins.mmpose} with mmcv {pins.mmcv} installed in {result.seconds:.0f} s; torch "
                          f"{torch_version} and numpy {numpy_version} unchanged; model build "
                          f"{result.verify.get('build_seconds')} s, one landmark pass "
                          f"{result.verify.get('pass_seconds')} s ({result.verify.get('weights')} weights). Restart "
                          "the runtime if mmpose was imported before.")
    return result
