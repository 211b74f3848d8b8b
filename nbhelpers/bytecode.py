"""One bytecode cache for the Python processes a local Ray batch starts, where the installed packages have none.

Python runs a module from its compiled bytecode (``.pyc``) when one is there, and otherwise compiles the source
first. ``pip`` writes the ``.pyc`` of every file it installs; uv does not by default ("Unlike pip, uv does not
compile .py files to .pyc files during installation by default", uv's PIP_COMPATIBILITY.md, "Bytecode
compilation"), and images that also set ``PYTHONDONTWRITEBYTECODE=1`` never write any. There, every new process
compiles again what it imports: a batch worker imports about 3,600 modules (76 MB of source: torch, sympy, scipy,
diffusers, transformers, Ray), which took it 13-18 s on the project's GPU machine, an image of that kind
(bench/RESULTS.md, sessions of 2026-12-02 and 2026-12-03), while the single process of a loop pays it once.

Where that is so for torch (:func:`plan`; the rule is torch's, the largest, since with a prefix Python passes over
every ``__pycache__``, torch's included), a local batch gives Ray's processes one cache to share: ``PYTHONPYCACHEPREFIX``
points them at a folder of ours, so they read and write bytecode there and never in the packages' own folders
(Python's documentation, "PYTHONPYCACHEPREFIX": "Python will write .pyc files in a mirror directory tree at this
path, instead of in __pycache__ directories within the source tree"). ``PYTHONDONTWRITEBYTECODE`` is dropped for
them only, so that they write into that folder; this process and the packages' folders are left as they are.
Python checks every cached file against its source (its modification time and size, recorded in the ``.pyc``
header: PEP 552) before using it; each environment (its Python and the versions of torch, diffusers, transformers,
Ray and a few more) also gets a tree of its own, so an upgrade that kept its files' times is not run stale.

On a machine with at least :data:`MIN_WARM_CPUS` CPUs, the packages a worker imports are also compiled ahead in
parallel (``compileall``, all CPUs but two) while Ray starts, once per installed version: a worker that starts
seconds later then finds them compiled. With fewer CPUs the workers fill the cache as they import, and later runs
find it filled.

The folder (default ``$XDG_CACHE_HOME/musetalk-workbook/bytecode-v2``, i.e. ``~/.cache/...``) must belong to this
user and be writable by nobody else, since what it holds is run, and be empty or tagged as ours (a
``CACHEDIR.TAG``, which backup tools also heed), so that a folder of other files is never used or emptied; it is
emptied when it grows over :data:`CAP_BYTES`, and not used where less than :data:`MIN_FREE_BYTES` is free.
The folders above it must not let another user replace it (each of this user or root, writable by nobody else
unless sticky, as ``/tmp``). ``NBHELPERS_BYTECODE_CACHE=0`` turns all of this off; a path there is used as the
folder. On Windows, where ``os.stat`` reports every folder as writable by all, it is never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SWITCH = "NBHELPERS_BYTECODE_CACHE"
FOLDER_NAME = "bytecode-v2"  # v2: tagged, one mirror tree (``PYTHONPYCACHEPREFIX``'s) per environment
CAP_BYTES = 2 * 2**30  # what one full warm-up writes is about 0.3 GB (torch, transformers, diffusers, Ray, scipy, sympy)
MIN_FREE_BYTES = 2 * 2**30
MIN_WARM_CPUS = 4  # with fewer, a compile ahead would take the CPUs Ray's start and the first worker need
# The packages a batch worker imports, Ray's first (a worker process starts with them), then by the size of their
# source it imports: measured in a Ray worker that imported a batch worker's modules (development machine, Ray 2.60,
# diffusers 0.39, transformers 5): torch 22.9 MB, sympy 9.4, scipy 9.2, diffusers 6.2, transformers 5.7, the
# standard library 5.3, numpy 3.5, Ray 2.4, huggingface_hub 1.5, mpmath 1.5, then 0.1-0.7 MB each; 76 MB in all.
# One that is not installed is passed over; one left out here is compiled by the first worker that imports it.
PACKAGES = ("ray", "google", "torch", "sympy", "scipy", "diffusers", "transformers", "numpy", "huggingface_hub",
            "mpmath", "urllib3", "nbhelpers", "rich", "jinja2", "wcwidth", "charset_normalizer", "click", "lark",
            "arrow", "httpx", "PIL", "filelock", "psutil", "yaml", "requests", "dateutil", "pygments", "attr",
            "regex", "httpcore", "idna", "torchgen", "jsonschema", "tqdm", "safetensors", "msgpack", "packaging")
# Left out of the compile ahead, under a package: its own test suites; under the standard library (whose bytecode
# is not read either while PYTHONPYCACHEPREFIX is set, so a worker would compile what it imports of it again): the
# installed packages (site-packages may lie inside it) and the parts no worker imports.
PACKAGE_SKIP = r"(.*[\\/])?tests?[\\/]"
STDLIB_SKIP = r"(site-packages|dist-packages|test|idlelib|turtledemo|lib2to3|ensurepip|tkinter)[\\/]"
_OFF = {"0", "off", "false", "no"}
_ON = {"1", "on", "true", "yes", "auto"}  # the default folder, as with the variable unset
# The folder's tag (the Cache Directory Tagging Specification, bford.info/cachedir: a file CACHEDIR.TAG whose first 43
# bytes are this signature; backup tools such as GNU tar --exclude-caches skip the folder), with a line of ours: only
# a folder that holds it, or an empty one, is used, and only such a folder is ever emptied.
TAG_NAME = "CACHEDIR.TAG"
TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
            "# This file is a cache directory tag created by nbhelpers (the bytecode cache of its Ray batches).\n"
            "# For information about cache directory tags, see: https://bford.info/cachedir/\n")

_warmups: list[subprocess.Popen] = []
_warmups_lock = threading.Lock()


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` decided.

    Attributes:
        folder: The mirror tree Ray's processes are given (``PYTHONPYCACHEPREFIX``), this environment's under the
            tagged cache folder (:func:`default_folder`), or None when none is used.
        reason: Why, in a sentence (shown in the batch's summary and its docstring's terms).
        missing: The packages found without bytecode that Python may not write beside them.
        warm_dirs: The folders to compile ahead in the order a worker imports them, the standard library's after
            torch's (empty: none, or done for these versions already).
        marker: The file a finished warm-up writes (so that the next batch does not compile again).
    """

    folder: Path | None
    reason: str
    missing: tuple[str, ...] = ()
    warm_dirs: tuple[Path, ...] = ()
    marker: Path | None = None


def default_folder() -> Path:
    """``$NBHELPERS_BYTECODE_CACHE`` when it names a folder, else ``$XDG_CACHE_HOME/musetalk-workbook/bytecode-v2``
    (``~/.cache/musetalk-workbook/bytecode-v2``; a relative ``XDG_CACHE_HOME`` is ignored, as the XDG Base
    Directory Specification says), beside the weights' default folder (:func:`nbhelpers.weights.default_dir`).
    Always absolute: Ray's processes may run in other working folders."""
    chosen = os.environ.get(SWITCH, "").strip()
    if chosen and chosen.lower() not in _OFF | _ON:
        return Path(os.path.abspath(Path(chosen).expanduser()))
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(cache).expanduser() if cache and os.path.isabs(os.path.expanduser(cache)) else Path.home() / ".cache"
    return Path(os.path.abspath(base / "musetalk-workbook" / FOLDER_NAME))


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity where the platform has one (as ``taskset`` sets it), at most
    a cgroup v2 CPU quota (``/sys/fs/cgroup/cpu.max``, as ``docker --cpus`` sets it)."""
    try:
        cpus = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cpus = max(1, os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def _package_folders(name: str) -> tuple[Path | None, tuple[Path, ...]]:
    """The ``__init__.py`` of an installed package (None for a namespace package) and its folders, found without
    importing it; ``(None, ())`` where it is absent or not a package of source files."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None, ()
    locations = tuple(Path(p) for p in (getattr(spec, "submodule_search_locations", None) or ()))
    if spec is None or not locations:
        return None, ()
    origin = getattr(spec, "origin", None)
    if origin and str(origin).endswith(".py"):
        return Path(origin), locations
    return (None, locations) if not origin or origin == "namespace" else (None, ())


def _without_bytecode(origin: Path) -> bool:
    """True where ``origin`` has no ``.pyc`` beside it (``__pycache__``) and Ray's processes will not write one
    there."""
    tag = sys.implementation.cache_tag
    if tag is None:  # an interpreter without bytecode caching: nothing to share
        return False
    if (origin.parent / "__pycache__" / f"{origin.stem}.{tag}.pyc").is_file():
        return False
    return not _python_writes_bytecode() or not os.access(origin.parent, os.W_OK)


def _python_writes_bytecode() -> bool:
    """Whether the processes Ray starts write bytecode beside the sources they compile: they inherit this
    process's environment (``PYTHONDONTWRITEBYTECODE``), not its command-line flags (``-B``)."""
    return not os.environ.get("PYTHONDONTWRITEBYTECODE")


def _safe_ancestors(folder: Path) -> str:
    """Why a folder above ``folder`` would let another user replace it, or "": each must belong to this user or
    root and be writable by nobody else, unless it has the sticky bit (as ``/tmp``), as OpenSSH's StrictModes
    checks a user's files."""
    if not hasattr(os, "getuid"):
        return ""
    for parent in folder.parents:
        try:
            st = parent.stat()
        except OSError as exc:
            return f"{parent} could not be read ({exc.strerror or exc})"
        if st.st_uid not in (0, os.getuid()):
            return f"{parent}, above it, belongs to another user"
        if st.st_mode & 0o022 and not st.st_mode & 0o1000:
            return f"{parent}, above it, can be written by other users (mode {st.st_mode & 0o777:o})"
    return ""


def folder_problem(folder: Path) -> str:
    """Why ``folder`` may not hold bytecode that other processes will run, or "" when it may.

    It is made (mode 0700) where missing; it must be a folder of this user that nobody else can write to, either
    empty (it is then tagged, :data:`TAG_NAME`) or tagged by nbhelpers already, so that a folder of other files
    named by mistake is never used or emptied, with at least :data:`MIN_FREE_BYTES` free. Where it holds more than
    :data:`CAP_BYTES`, it is emptied first (its tag kept)."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = Path(os.path.realpath(folder))
        st = folder.stat()
    except OSError as exc:
        return f"{folder} could not be made ({exc.strerror or exc})"
    above = _safe_ancestors(folder)
    if above:
        return above
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{folder} belongs to another user"
    if st.st_mode & 0o022:
        return f"{folder} can be written by other users (mode {st.st_mode & 0o777:o})"
    tag = folder / TAG_NAME
    try:
        ours = tag.is_file() and not tag.is_symlink() and tag.read_text(errors="replace") == TAG_TEXT
        if not ours and not any(folder.iterdir()):
            tag.write_text(TAG_TEXT)
            ours = True
    except OSError as exc:
        return f"{folder} could not be read or tagged ({exc.strerror or exc})"
    if not ours:
        return (f"{folder} holds other files and no {TAG_NAME} of nbhelpers; give {SWITCH} an empty or new "
                f"folder")
    if _tree_bytes(folder) > CAP_BYTES:
        for child in folder.iterdir():
            if child.name == TAG_NAME:
                continue
            with contextlib.suppress(OSError):
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    try:
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        return f"the free space at {folder} could not be read ({exc.strerror or exc})"
    if free < MIN_FREE_BYTES:
        return f"{folder} has {free / 2**30:.1f} GiB free, less than {MIN_FREE_BYTES / 2**30:.0f} GiB"
    return ""


def _tree_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


_HEAVY = ("torch", "ray")  # the packages whose bytecode decides, the largest first (see PACKAGES)
_STAMPED = ("torch", "diffusers", "transformers", "ray", "numpy", "scipy", "sympy", "huggingface_hub")


def _environment_stamp() -> str:
    """A name for this environment's mirror tree: its Python and the versions of its main distributions. An
    upgrade of one of them gets a new tree, so bytecode of the old sources is never checked against new ones
    by their modification time alone (an installer may keep a file's time and size); old trees go at the cap."""
    import importlib.metadata

    versions = []
    for dist in _STAMPED:
        try:
            versions.append((dist, importlib.metadata.version(dist)))
        except Exception:  # noqa: BLE001 - absent or unreadable metadata: the name alone
            versions.append((dist, ""))
    return hashlib.sha256(repr((sys.version, sys.prefix, sys.executable, versions)).encode()).hexdigest()[:16]


def plan(cpus: int | None = None, packages: Sequence[str] | None = None) -> Plan:
    """Decide whether the processes of a local Ray start share a bytecode cache, and what to compile ahead.

    Args:
        cpus: CPUs for the compile ahead (default :func:`usable_cpus`); below :data:`MIN_WARM_CPUS` none is done.
        packages: Top-level packages to look at and compile (default :data:`PACKAGES`).

    Returns:
        A :class:`Plan`: ``folder`` None (and ``reason`` saying why) when it is turned off by
        ``NBHELPERS_BYTECODE_CACHE=0``, when ``PYTHONPYCACHEPREFIX`` is set already (the processes inherit it),
        when every package has its bytecode or Python may write it beside them, or when the folder may not be
        used (:func:`folder_problem`). Never raises for any of these.
    """
    if os.environ.get(SWITCH, "").strip().lower() in _OFF:
        return Plan(None, f"turned off by {SWITCH}={os.environ[SWITCH].strip()}")
    if os.environ.get("PYTHONPYCACHEPREFIX"):
        return Plan(None, f"PYTHONPYCACHEPREFIX is set ({os.environ['PYTHONPYCACHEPREFIX']}); Ray's processes use it")
    packages = PACKAGES if packages is None else tuple(packages)
    found = {name: _package_folders(name) for name in packages}
    origins = {name: origin for name, (origin, _) in found.items() if origin is not None}
    missing = tuple(name for name, origin in origins.items() if _without_bytecode(origin))
    if not missing:
        return Plan(None, "the installed packages have their bytecode, or Ray's processes write it beside them")
    heaviest = next((n for n in _HEAVY if n in origins), None)
    if heaviest is not None and heaviest not in missing:
        # with a prefix, Python reads no __pycache__ at all: torch's own bytecode would be passed over
        return Plan(None, f"{heaviest} has its bytecode ({', '.join(missing[:4])} not), which a shared cache would "
                          "have Python pass over", missing)
    root = default_folder()
    problem = folder_problem(root)
    if problem:
        return Plan(None, f"{', '.join(missing[:4])}{' and others' if len(missing) > 4 else ''} have no bytecode, "
                          f"but {problem}", missing)
    root = Path(os.path.realpath(root))
    folder = root / f"env-{_environment_stamp()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        return Plan(None, f"{folder} could not be made ({exc.strerror or exc})", missing)
    cpus = usable_cpus() if cpus is None else int(cpus)
    stamp = hashlib.sha256(repr(sorted(
        (name, str(o), o.stat().st_mtime_ns) for name, o in origins.items())).encode()).hexdigest()[:16]
    marker = folder / f"warmed-{stamp}"
    warm: tuple[Path, ...] = ()
    if cpus >= MIN_WARM_CPUS and not marker.exists():
        # the standard library after torch: a worker imports Ray's modules, then torch, then the rest
        folders = [d for n in packages for d in found[n][1]]
        at = next((k + 1 for k, n in enumerate(n for n in packages for _ in found[n][1]) if n == "torch"), 0)
        warm = tuple(folders[:at]) + (Path(sysconfig.get_paths()["stdlib"]),) + tuple(folders[at:])
    how = (f"compiling the standard library and {len(warm) - 1} package folders ahead on {cpus - 2} CPUs" if warm
           else "compiled ahead already" if marker.exists() else "the workers fill it as they import")
    named = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    return Plan(folder, f"{named} have no bytecode: Ray's processes share {folder} ({how})", missing, warm, marker)


# Run by the compile ahead (python -I: no environment, no site folders): its argument is JSON, the folders with
# the pattern of the paths left out of each, the marker and the worker count. Every file is listed first and the
# list goes, in the folders' order, to one pool of processes: compileall.compile_dir would make a pool per folder,
# whose starts (14 processes each) took most of a compile ahead of 38 folders on the GPU machine, so a worker
# starting then found little compiled. compileall.compile_file skips a file whose bytecode is up to date, writes
# each atomically (importlib's _write_atomic), and with quiet=2 says nothing of the packages' uncompilable files
# (py2 samples). The bytecode is checked by timestamp, as Python's own caching does, even where SOURCE_DATE_EPOCH
# would make py_compile hash the sources. The pool's processes are forked, so they keep this one's pycache_prefix;
# where there is no fork, the files are compiled here one after another. The marker records the seconds and counts.
# A lock file (flock) keeps a second compile ahead of the same tree, another batch's, from running beside it.
_WARM_SCRIPT = """
import compileall, functools, json, multiprocessing, os, py_compile, re, sys, time
from concurrent.futures import ProcessPoolExecutor
t0 = time.monotonic()
folders, marker, workers = json.loads(sys.argv[1])
try:  # one compile ahead at a time in a folder: another process's batch may be compiling it already
    import fcntl
    lock = open(os.path.join(os.path.dirname(marker), "warmup.lock"), "a")
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except ImportError:
    pass
except OSError:
    sys.exit(0)
files = []
for folder, skip in folders:
    rx = re.compile(skip)
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        files += [p for p in (os.path.join(root, n) for n in sorted(names) if n.endswith(".py")) if not rx.search(p)]
one = functools.partial(compileall.compile_file, quiet=2, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        ok = sum(map(bool, pool.map(one, files, chunksize=32)))
else:
    ok = sum(map(bool, map(one, files)))
with open(marker + ".tmp", "w") as f:
    json.dump({"seconds": round(time.monotonic() - t0, 2), "files": len(files), "compiled": ok}, f)
os.replace(marker + ".tmp", marker)
"""


def _skip_pattern(folder: Path, stdlib: bool) -> str:
    """The pattern of the paths under ``folder`` that the compile ahead leaves out (compileall matches it against
    each file's whole path, so it is anchored at the folder)."""
    return re.escape(str(folder)) + r"[\\/]" + (STDLIB_SKIP if stdlib else PACKAGE_SKIP)


def start_warmup(the_plan: Plan, cpus: int | None = None) -> subprocess.Popen | None:
    """Start compiling ``the_plan.warm_dirs`` into its folder in a background process; None when there is nothing
    to compile. The process is never waited on by the batch (:func:`reap` collects it); its output is dropped."""
    if the_plan.folder is None or not the_plan.warm_dirs:
        return None
    with _warmups_lock:
        if any(proc.poll() is None for proc in _warmups):  # this process's earlier one is still compiling
            return None
    import json

    cpus = usable_cpus() if cpus is None else int(cpus)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    folders = [[str(d), _skip_pattern(d, d == stdlib)] for d in the_plan.warm_dirs]
    args = json.dumps([folders, str(the_plan.marker), max(1, cpus - 2)])
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-X", f"pycache_prefix={the_plan.folder}", "-c",
                                 _WARM_SCRIPT, args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None
    with _warmups_lock:
        _warmups.append(proc)
    return proc


def reap(stop: bool = False) -> None:
    """Collect the compile-ahead processes that have ended; with ``stop``, end those still running first (a
    stopped batch): the process and its pool, which run in a session of their own (SIGTERM to its process group).
    Bytecode is written atomically, so a stop leaves complete files and at most a temporary file per process of
    the pool."""
    import signal

    with _warmups_lock:
        for proc in list(_warmups):
            if stop and proc.poll() is None:
                with contextlib.suppress(OSError):
                    if hasattr(os, "killpg"):
                        os.killpg(proc.pid, signal.SIGTERM)
                    else:
                        proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            if proc.poll() is not None:
                _warmups.remove(proc)


@contextlib.contextmanager
def for_local_ray(cpus: int | None = None) -> Iterator[Plan]:
    """Around a local ``ray.init``: per :func:`plan`, this process's environment holds ``PYTHONPYCACHEPREFIX``
    (and no ``PYTHONDONTWRITEBYTECODE``) while Ray starts its processes, which keep it, and the compile ahead is
    started; the environment is put back as it was on leaving. Yields the :class:`Plan`."""
    the_plan = plan(cpus)
    if the_plan.folder is None:
        yield the_plan
        return
    reap()
    start_warmup(the_plan, cpus)
    saved = {k: os.environ.get(k) for k in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    os.environ["PYTHONPYCACHEPREFIX"] = str(the_plan.folder)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        yield the_plan
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
