"""Compiled models that never make a job wait: eager at once, compiled in the background, cached across sessions.

A :class:`BackgroundCompiler` is given models and one example call of each. It installs a dispatcher as each
model's ``forward`` and compiles the original ``forward`` with ``torch.compile`` in a background thread, at low
CPU priority. Until a model's compiled code is ready, and for every call whose inputs differ from the example's
(shape, dtype, strides, device: the last, smaller batch of a clip, a batch halved after out-of-memory), the eager
``forward`` runs. So the first frame of a job comes as soon as it would eagerly, and no call ever triggers a
compile of its own.

The compiler's caches (inductor's graphs and kernels, Triton's binaries, autotuning results) are saved as one file
with ``torch.compiler.save_cache_artifacts`` and loaded with ``torch.compiler.load_cache_artifacts`` before the next
compile (PyTorch's "Mega-Cache"; torch >= 2.7), in a versioned folder keyed by the torch, Triton and CUDA versions,
the GPU and the caller's description of the models (configs, dtype, batch shape). A file of another key is never
read. A compile that fails leaves the eager models in place and says why in a :class:`~nbhelpers.errors.FallbackWarning`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FallbackWarning, InputError

COMPILE_MODES = ("auto", "on", "off")
CACHE_FORMAT = 1  # bump when the file layout or the key's facts change
CACHE_KEEP = 6  # cache files kept per folder (newest first); each is tens of MB
MIN_CAPABILITY = (7, 0)  # Triton's oldest supported NVIDIA architecture (Volta); a T4 is 7.5
BACKGROUND_NICE = 10  # added niceness of the compile thread (and the compile workers it starts), Linux only


@dataclass
class CompileStatus:
    """Where the background compile stands.

    Attributes:
        state: ``"off"`` (not asked for or not possible), ``"waiting"``, ``"compiling"``, ``"ready"`` or
            ``"failed"``.
        reason: Why it is in that state, in words.
        seconds: Wall-clock seconds the compile took (None before it ends).
        warm: True when cache artifacts of an earlier session were loaded first.
        cache_file: The cache file read or written, or None.
        parts: Model name -> ``"eager"``, ``"compiled"`` or ``"failed"``.
    """

    state: str = "off"
    reason: str = ""
    seconds: float | None = None
    warm: bool = False
    cache_file: Path | None = None
    parts: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        took = f" in {self.seconds:.0f} s" if self.seconds is not None else ""
        warm = " (warm cache)" if self.warm else ""
        return f"compile {self.state}{took}{warm}: {self.reason}"


def _signature(args: tuple, kwargs: dict) -> tuple:
    """What a compiled call depends on: each tensor's shape, dtype, strides and device; other values as they are."""
    import torch

    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return ("T", tuple(v.shape), v.dtype, v.stride(), v.device, v.requires_grad)
        if isinstance(v, (list, tuple)):
            return tuple(one(x) for x in v)
        return ("V", type(v).__name__, v if isinstance(v, (int, float, str, bool, type(None))) else id(v))

    return (one(args), tuple(sorted((k, one(v)) for k, v in kwargs.items())), torch.is_inference_mode_enabled(),
            torch.is_grad_enabled())


class _Dispatch:
    """Installed as ``module.forward``: the compiled forward when ready and the call matches the example."""

    def __init__(self, name: str, eager: Callable) -> None:
        self.name = name
        self.eager = eager
        self.compiled: Callable | None = None
        self.signature: tuple | None = None
        self.calls = {"eager": 0, "compiled": 0}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        compiled = self.compiled
        if compiled is not None and _signature(args, kwargs) == self.signature:
            self.calls["compiled"] += 1
            return compiled(*args, **kwargs)
        self.calls["eager"] += 1
        return self.eager(*args, **kwargs)


@dataclass
class _Part:
    name: str
    module: Any
    dispatch: _Dispatch
    example_args: tuple
    example_kwargs: dict


def cache_key(facts: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The cache file's key: a hash of the caller's ``facts`` and of this runtime (torch, Triton, CUDA, GPU).

    Args:
        facts: JSON-serialisable description of what is compiled (model configs, dtype, batch shape, options).

    Returns:
        (16 hex digits, the full dict of facts that were hashed).
    """
    import torch

    runtime: dict[str, Any] = {"format": CACHE_FORMAT, "torch": torch.__version__, "cuda": torch.version.cuda,
                               "python": sys.version.split()[0]}
    try:
        import triton

        runtime["triton"] = triton.__version__
    except ImportError:
        runtime["triton"] = None
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        runtime["gpu"] = torch.cuda.get_device_name(index)
        runtime["capability"] = list(torch.cuda.get_device_capability(index))
    full = {"runtime": runtime, "models": facts}
    text = json.dumps(full, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16], full


def can_compile(device: Any) -> tuple[bool, str]:
    """Whether ``torch.compile`` can make GPU code here, and why not.

    Args:
        device: The torch device the models run on.

    Returns:
        (True, "") or (False, the reason in words).
    """
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return False, f"the models run on {device.type}; compiling pays only on a CUDA GPU"
    if not hasattr(torch, "compile"):
        return False, f"torch {torch.__version__} has no torch.compile"
    try:
        import triton  # noqa: F401
    except ImportError:
        return False, "Triton is not installed (torch.compile makes GPU code with it)"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        return False, f"the GPU's compute capability {cap[0]}.{cap[1]} is older than Triton supports (7.0)"
    return True, ""


def check_mode(mode: str) -> str:
    """Validate a compile setting (``"auto"``, ``"on"``, ``"off"``).

    Raises:
        InputError: For any other value.
    """
    if mode not in COMPILE_MODES:
        raise InputError(f"compile must be one of {', '.join(map(repr, COMPILE_MODES))}; got {mode!r}.")
    return mode


class BackgroundCompiler:
    """Compile models in a background thread while their eager versions serve calls.

    Args:
        device: The models' torch device.
        mode: ``"auto"`` (compile where :func:`can_compile` says it is possible), ``"on"`` (the same, with a
            warning when it is not possible) or ``"off"``.
        cache_dir: Folder of the cache files (made when missing), or None for no cache across sessions.
        facts: Description of what is compiled, for the cache key (see :func:`cache_key`).
        options: ``torch.compile`` options (inductor config names), e.g. ``{"coordinate_descent_tuning": True}``.
        on_event: Called with a short message when the compile starts and ends (the notebooks and CLI print it).

    Raises:
        InputError: When ``mode`` is not one of :data:`COMPILE_MODES`.

    Source: ``torch.compile`` and the Mega-Cache (PyTorch's "Compile Time Caching in torch.compile" recipe).
    """

    def __init__(self, device: Any, mode: str = "auto", cache_dir: str | os.PathLike | None = None,
                 facts: dict[str, Any] | None = None, options: dict[str, Any] | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        self.mode = check_mode(mode)
        self.device = device
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.facts = dict(facts or {})
        self.options = dict(options or {})
        self.on_event = on_event
        self.parts: list[_Part] = []
        self.status = CompileStatus()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        possible, why = (False, "compile='off'") if mode == "off" else can_compile(device)
        self.enabled = possible
        self.status.reason = why
        if not possible and mode == "on":
            warnings.warn(f"compile='on' but the models stay eager: {why}.", FallbackWarning, stacklevel=2)

    def add(self, name: str, module: Any, *example_args: Any, **example_kwargs: Any) -> None:
        """Serve ``module``'s calls through a dispatcher, and compile its forward for calls like the example.

        Args:
            name: Short name of the model (shown in the status), e.g. ``"unet"``.
            module: A ``torch.nn.Module`` (its ``forward`` is replaced on the instance until :meth:`remove`).
            *example_args: One call's positional arguments, as the job will make it (tensors on the device).
            **example_kwargs: Its keyword arguments.
        """
        if not self.enabled:
            return
        dispatch = _Dispatch(name, module.forward)
        module.forward = dispatch
        self.parts.append(_Part(name, module, dispatch, example_args, example_kwargs))
        self.status.parts[name] = "eager"

    def start(self) -> BackgroundCompiler:
        """Start compiling in a background thread (no-op when disabled or already started). Returns self."""
        if not self.enabled or not self.parts or self._thread is not None:
            if not self.enabled:
                self._done.set()
            return self
        self.status.state = "waiting"
        self._thread = threading.Thread(target=self._run, name="nbhelpers-compile", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> CompileStatus:
        """Block until the compile has ended (or ``timeout`` seconds passed); returns the status."""
        self._done.wait(timeout)
        return self.status

    def remove(self) -> None:
        """Put every model's eager forward back (the compiled code is dropped)."""
        for part in self.parts:
            if part.module.__dict__.get("forward") is part.dispatch:
                del part.module.forward
            part.dispatch.compiled = None

    # -- the background thread -------------------------------------------------------------------------------------

    def _say(self, message: str) -> None:
        if self.on_event is not None:
            try:
                self.on_event(message)
            except Exception:  # noqa: BLE001 - a failing printer must not stop the compile
                pass

    def _run(self) -> None:
        import torch

        _lower_priority()
        t0 = time.perf_counter()
        self.status.state = "compiling"
        key, full = cache_key({**self.facts, "options": self.options, "parts": [p.name for p in self.parts]})
        cache_file = self._cache_file(key)
        self.status.cache_file = cache_file
        if cache_file is not None:
            self.status.warm = _load_artifacts(cache_file)
        self._say(f"compiling {', '.join(p.name for p in self.parts)} for this GPU in the background "
                  f"({'warm cache' if self.status.warm else 'first time: a few minutes on 2 CPU cores'}); "
                  "the job runs eagerly meanwhile")
        failures = []
        for part in self.parts:
            try:
                compiled = torch.compile(part.dispatch.eager, dynamic=False, options=self.options or None)
                with torch.inference_mode():
                    compiled(*part.example_args, **part.example_kwargs)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                with torch.inference_mode():
                    part.dispatch.signature = _signature(part.example_args, part.example_kwargs)
                part.dispatch.compiled = compiled
                self.status.parts[part.name] = "compiled"
            except Exception as exc:  # noqa: BLE001 - any compile failure leaves the eager model in place
                failures.append(f"{part.name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}")
                self.status.parts[part.name] = "failed"
        self.status.seconds = time.perf_counter() - t0
        if failures:
            self.status.state = "failed" if len(failures) == len(self.parts) else "ready"
            self.status.reason = "; ".join(failures)
            warnings.warn(f"torch.compile failed, these models stay eager (same frames, slower): "
                          f"{self.status.reason}", FallbackWarning, stacklevel=1)
        else:
            self.status.state = "ready"
            self.status.reason = f"{len(self.parts)} model(s) compiled"
            if cache_file is not None and not self.status.warm:
                _save_artifacts(cache_file, full)
        self._say(str(self.status))
        self._done.set()

    def _cache_file(self, key: str) -> Path | None:
        if self.cache_dir is None or not hasattr(__import__("torch").compiler, "save_cache_artifacts"):
            return None
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        if not _private_folder(self.cache_dir):
            return None
        return self.cache_dir / f"{key}.bin"


def _lower_priority() -> None:
    """Lower this thread's CPU priority (Linux: niceness is per thread; processes it starts inherit it)."""
    if sys.platform.startswith("linux") and hasattr(threading, "get_native_id"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        except OSError:
            pass


def _private_folder(folder: Path) -> bool:
    """True when ``folder`` belongs to this user (cache files hold compiled code that is loaded and run)."""
    if os.name != "posix":
        return True
    return folder.stat().st_uid == os.getuid()


def _load_artifacts(path: Path) -> bool:
    """Load a cache file written by :func:`_save_artifacts` when its recorded SHA-256 matches; True if loaded."""
    import torch

    meta_path = path.with_suffix(".json")
    if not (path.is_file() and meta_path.is_file()):
        return False
    try:
        meta = json.loads(meta_path.read_text())
        data = path.read_bytes()
        if meta.get("format") != CACHE_FORMAT or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            return False
        torch.compiler.load_cache_artifacts(data)
        os.utime(path)  # newest used first when the folder is trimmed
        return True
    except Exception:  # noqa: BLE001 - an unreadable cache only costs a cold compile
        return False


def _save_artifacts(path: Path, facts: dict[str, Any]) -> None:
    """Write this process's compile artifacts to ``path`` (temporary name, then rename) and trim the folder."""
    import torch

    try:
        saved = torch.compiler.save_cache_artifacts()
        if not saved:
            return
        data = saved[0]
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        meta = {"format": CACHE_FORMAT, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                "written": time.time(), "facts": facts}
        tmp_meta = path.with_name(f".{path.stem}.{os.getpid()}.json.tmp")
        tmp_meta.write_text(json.dumps(meta, indent=1, default=str))
        os.replace(tmp, path)
        os.replace(tmp_meta, path.with_suffix(".json"))
        _trim(path.parent)
    except Exception:  # noqa: BLE001 - a cache that cannot be written only costs the next session a cold compile
        pass


def _trim(folder: Path) -> None:
    files = sorted(folder.glob("*.bin"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in files[CACHE_KEEP:]:
        for p in (old, old.with_suffix(".json")):
            try:
                p.unlink()
            except OSError:
                pass
