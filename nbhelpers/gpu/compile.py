"""Compiled models that never make a job wait: eager at once, compiled in the background, cached across sessions.

:class:`BackgroundCompiler` compiles with ``torch.compile`` in a low-priority thread while :class:`_Dispatch` serves
each call eagerly until compiled code for its inputs is ready; a failed compile leaves the eager method and warns
(``FallbackWarning``). Caches: ``torch.compiler.save_cache_artifacts`` (torch >= 2.7), keyed by :func:`cache_key`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..constants import COMPILE_MODES
from ..errors import FallbackWarning, InputError
from ..hashing import atomic_path

CACHE_FORMAT = 1  # bump when the file layout or the key's facts change
CACHE_KEEP = 12  # cache files kept per folder, newest used first; each holds tens of MB
MIN_CAPABILITY = (7, 0)  # Triton's oldest supported NVIDIA architecture (Volta); a T4 is 7.5
BACKGROUND_NICE = 10  # added niceness of the compile thread and of the compile workers it starts (Linux)
GRAD_MODES = ("inference", "no_grad")
AUTO_REQUEST_AFTER = 2  # calls of one signature without compiled code before it is compiled unasked
# compile="auto" compiles on a GPU whose measured fp16 matmul rate is below this (TFLOP/s): there the GPU limits a
# job (a T4's published peak is 65). Above it (an A100 312, an H100 or H200 about 750) the CPU side does, and
# the compile's CPU time would cost more than it saves (bench/RESULTS.md, "T4-class GPU").
GPU_WALL_TFLOPS = 200.0
_RATES: dict[str, float] = {}
RECOMPILE_LIMIT = 64  # compiled variants dynamo keeps per function; a decoder has several (batch sizes, dynamic)


@dataclass
class CompileStatus:
    """Where the background compile stands: ``state`` ``"off"`` (not asked for, or not possible here), ``"idle"``,
    ``"compiling"``, ``"ready"`` (all asked is compiled) or ``"failed"`` (every compile failed), the ``reason`` in
    words, wall-clock ``seconds`` spent compiling, ``warm`` (an earlier session's cache files loaded), ``parts``
    (``"name batch-shape"`` -> ``"compiling"``, ``"compiled"`` or ``"failed"``) and ``part_seconds`` (the same keys
    -> wall-clock seconds of that compile).
    """

    state: str = "off"
    reason: str = ""
    seconds: float = 0.0
    warm: bool = False
    parts: dict[str, str] = field(default_factory=dict)
    part_seconds: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        warm = ", warm cache" if self.warm else ""
        return f"compile {self.state} ({self.seconds:.0f} s{warm}): {self.reason}"


def _signature(args: tuple, kwargs: dict, dynamic_batch: bool = False) -> tuple:
    """What compiled code depends on: each tensor's shape, dtype, strides, device and grad flags; other values. With
    ``dynamic_batch`` the first dimension of every tensor of 2 or more dimensions and 2 or more rows counts as any
    batch (compiled code made with that dimension dynamic serves them all; one row is its own case)."""
    import torch

    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            shape = tuple(v.shape)
            if dynamic_batch and v.ndim >= 2 and shape[0] >= 2:
                shape = ("B", *shape[1:])
            return ("T", shape, v.dtype, v.stride()[1:] if shape[:1] == ("B",) else v.stride(), v.device,
                    v.requires_grad, v.is_inference())
        if isinstance(v, (list, tuple)):
            return tuple(one(x) for x in v)
        return ("V", type(v).__name__, v if isinstance(v, (int, float, str, bool, type(None))) else id(v))

    return (one(args), tuple(sorted((k, one(v)) for k, v in kwargs.items())), torch.is_inference_mode_enabled(),
            torch.is_grad_enabled())


def _map_tensors(value: Any, fn: Callable[[Any], Any]) -> Any:
    """``value`` with ``fn`` applied to each tensor in it, through tuples (returned as tuples), lists and dicts."""
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(_map_tensors(v, fn) for v in value)
    if isinstance(value, list):
        return [_map_tensors(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


class _Dispatch:
    """Installed in place of a model's method: compiled code for calls that match a compiled example, the code made
    for that exact shape first, then code made with a dynamic batch dimension. A call signature seen
    :data:`AUTO_REQUEST_AFTER` times without compiled code is handed to the compiler (with copies of the call's
    tensors; a dynamic batch where ``dynamic_batch``), so a path no job asked for ahead still gets compiled code."""

    def __init__(self, name: str, eager: Callable, compiler: BackgroundCompiler, dynamic_batch: bool) -> None:
        self.name = name
        self.eager = eager
        self.compiler = compiler
        self.dynamic_batch = dynamic_batch
        self.compiled: dict[bool, Callable] = {}  # dynamic batch or not -> the torch.compile wrapper
        self.ready: frozenset = frozenset()
        self.asked: set[tuple] = set()
        self.seen: dict[tuple, int] = {}
        self.calls = {"eager": 0, "compiled": 0}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiler.paused_depth:
            return self.eager(*args, **kwargs)
        sig = _signature(args, kwargs)
        fn = self.compiled.get(False) if sig in self.ready else None
        any_batch = None  # the signature with a dynamic batch, made at most once a call
        if fn is None and True in self.compiled:
            any_batch = _signature(args, kwargs, True)
            fn = self.compiled[True] if any_batch in self.ready else None
        if fn is not None and not _fx_tracing():
            try:
                out = fn(*args, **kwargs)
            except RuntimeError as err:  # the compiler thread began tracing after the check above
                if "symbolically trace a dynamo-optimized" not in str(err):
                    raise
            else:
                self.calls["compiled"] += 1
                return out
        self.calls["eager"] += 1
        if self.dynamic_batch:
            sig = any_batch or _signature(args, kwargs, True)
        if sig not in self.asked and not sig[-1]:  # autograd on: never compiled
            self.seen[sig] = self.seen.get(sig, 0) + 1
            if self.seen[sig] >= AUTO_REQUEST_AFTER:
                self.compiler._ask(self, sig, _copies(args), _copies(kwargs),
                                   "inference" if sig[-2] else "no_grad", self.dynamic_batch)
        return self.eager(*args, **kwargs)


def _label(name: str, sig: tuple) -> str:
    """``name`` and the first tensor's shape ("B" for any batch): how the status and the cache files name a part."""
    first = next((a for a in sig[0] if a[:1] == ("T",)), None)
    return f"{name} {'x'.join(map(str, first[1])) if first else '-'}"


def _fx_tracing() -> bool:
    """Whether some thread is inside FX tracing (process-wide in torch), when compiled code raises RuntimeError
    "Detected that you are using FX to symbolically trace a dynamo-optimized function"."""
    import torch.fx._symbolic_trace as fx_trace

    check = getattr(fx_trace, "is_fx_symbolic_tracing", None) or getattr(fx_trace, "is_fx_tracing", None)
    return bool(check()) if check is not None else False


def _copies(value: Any) -> Any:
    """Copies of the tensors in ``value`` with the same shape, strides and inference flag (others kept as is)."""
    import torch

    def copy(t: Any) -> Any:
        with torch.inference_mode() if t.is_inference() else torch.no_grad():
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)

    return _map_tensors(value, copy)


def cache_key(facts: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(16 hex digits, the dict hashed): the key of the JSON-serialisable ``facts`` of what is compiled (model
    configs, dtype, options) and of this runtime (torch, Triton, CUDA, Python, GPU)."""
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
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:16], full


def can_compile(device: Any) -> tuple[bool, str]:
    """Whether ``torch.compile`` can make GPU code for ``device`` here: (True, "") or (False, why not)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return False, f"the models run on {device.type}; compiling pays only on a CUDA GPU"
    try:
        import triton  # noqa: F401
    except ImportError:
        return False, "Triton is not installed (torch.compile makes its GPU code with it)"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        return False, f"the GPU's compute capability {cap[0]}.{cap[1]} is older than Triton supports (7.0)"
    return True, ""


def compile_decision(device: Any, mode: str = "auto") -> tuple[bool, str]:
    """Whether models on ``device`` are compiled under ``compile=mode`` (one of :data:`COMPILE_MODES`), and why, in
    words: ``off`` never; ``on`` where :func:`can_compile`; ``auto`` there too when the GPU's measured fp16 rate
    (:func:`fp16_tflops`) is under :data:`GPU_WALL_TFLOPS`."""
    possible, why = (False, "compile='off'") if mode == "off" else can_compile(device)
    if possible and mode == "auto":
        rate = fp16_tflops(device)
        if rate >= GPU_WALL_TFLOPS:
            return False, (f"compile='auto' and this GPU makes {rate:.0f} TFLOP/s in fp16: the CPU side limits jobs "
                           "here, so compiling would not pay (compile='on' compiles anyway)")
        why = f"this GPU makes {rate:.0f} TFLOP/s in fp16: the GPU limits jobs, compiled models pay"
    return possible, why


def fp16_tflops(device: Any) -> float:
    """The device's fp16 matrix-multiply rate in TFLOP/s, measured once per device (a 4096^3 product, median of 5
    after 2 warm-ups, CUDA events; about 20 ms on a T4)."""
    import torch

    key = str(torch.device(device))
    if key not in _RATES:
        n = 4096
        a, b = (torch.randn(n, n, device=key, dtype=torch.float16) for _ in range(2))
        times = []
        for i in range(7):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            end.synchronize()
            if i >= 2:
                times.append(start.elapsed_time(end))
        _RATES[key] = 2 * n**3 / (sorted(times)[len(times) // 2] * 1e-3) / 1e12
        del a, b
    return _RATES[key]


class BackgroundCompiler:
    """Compile models' methods in a background thread while their eager versions serve every call.

    ``mode`` ``"auto"`` compiles where :func:`can_compile` allows and the GPU limits jobs (:data:`GPU_WALL_TFLOPS`),
    ``"on"`` wherever it allows (with a warning where it does not), ``"off"`` never. ``cache_dir`` (made when
    missing; None: no cache across sessions) holds the cache files keyed by ``facts`` (:func:`cache_key`), or by
    what a function ``facts`` returns when the first compile starts (so that a CPU run reads no file); ``on_event``
    gets a one-line message when compiling starts and ends.
    Raises InputError: ``mode`` is not one of :data:`COMPILE_MODES`.
    Source: ``torch.compile``; PyTorch's recipe "Compile Time Caching in torch.compile" (Mega-Cache).
    """

    def __init__(self, device: Any, mode: str = "auto", cache_dir: str | os.PathLike | None = None,
                 facts: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        if mode not in COMPILE_MODES:
            raise InputError(f"compile must be one of {', '.join(map(repr, COMPILE_MODES))}; got {mode!r}.")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.facts = facts if callable(facts) else dict(facts or {})
        self.options: dict[str, Any] = {}  # torch.compile (inductor) options, set before the first compile
        self.on_event = on_event
        self._dispatches: list[tuple[Any, str, _Dispatch]] = []
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._compiled_here: list[str] = []  # labels this process compiled, in order
        self._saved: tuple[int, str | None] = (0, None)  # of those, how many the latest cache file holds; its stem
        self._from_cache: set[str] = set()  # the parts the cache files loaded at start hold
        self._cached: set[str] | None = None
        self.paused_depth = 0
        possible, why = compile_decision(device, mode)
        self.enabled = possible
        self.status = CompileStatus("idle" if possible else "off", why)
        if not possible and mode == "on":
            warnings.warn(f"compile='on', but the models stay eager: {why}.", FallbackWarning, stacklevel=2)

    def request(self, name: str, module: Any, *args: Any, method: str = "forward", grad: str = "inference",
                dynamic_batch: bool | None = None, cached_only: bool = False, **kwargs: Any) -> None:
        """Have ``module.<method>`` (replaced on the instance until :meth:`remove`) compiled for calls like
        ``module.<method>(*args, **kwargs)`` as the job makes them (same shapes, dtypes, memory layout) under
        autograd mode ``grad``; returns at once. ``name`` shows in the status; ``dynamic_batch`` compiles the first
        dimension as any batch of 2 or more, False this shape only (faster code: the VAE decoder's on a T4-class
        GPU); None: as the module's first request or :meth:`install` said (True), which also holds for calls
        compiled unasked. ``cached_only``: only where :meth:`cached_parts` holds it (then the compile takes seconds;
        a cold one would outlast a short stage and hold up the compiles queued after it), else nothing is installed.
        Raises InputError: ``grad`` is not one of :data:`GRAD_MODES`.
        """
        if grad not in GRAD_MODES:
            raise InputError(f"grad must be one of {GRAD_MODES}; got {grad!r}.")
        if not self.enabled:
            return
        import torch

        if dynamic_batch is None:
            existing = module.__dict__.get(method)
            dynamic_batch = existing.dynamic_batch if isinstance(existing, _Dispatch) else True
        with torch.inference_mode() if grad == "inference" else torch.no_grad():
            sig = _signature(args, kwargs, dynamic_batch)
        if cached_only and _label(name, sig) not in self.cached_parts():
            return
        dispatch = self.install(name, module, method, dynamic_batch=dynamic_batch)
        self._ask(dispatch, sig, args, kwargs, grad, dynamic_batch)

    def cached_parts(self) -> set[str]:
        """The parts (status labels such as ``"unet Bx8x32x32"``) whose compiled code this runtime's cache files
        hold, read once; empty without a cache folder."""
        if self._cached is None:
            facts = self.facts() if callable(self.facts) else self.facts
            key, folder, self._cached = cache_key({**facts, "options": self.options})[0], self._folder(), set()
            for meta_path in folder.glob(f"{key}-*.json") if folder is not None else ():
                with contextlib.suppress(Exception):  # an unreadable file holds nothing
                    self._cached.update(json.loads(meta_path.read_text())["parts"])
        return self._cached

    def install(self, name: str, module: Any, method: str = "forward", *,
                dynamic_batch: bool = True) -> _Dispatch | None:
        """Put the dispatcher in place of ``module.<method>`` without asking for a compile: the calls the job makes
        are compiled once a signature repeats (:data:`AUTO_REQUEST_AFTER`). None when compiling is off."""
        if not self.enabled:
            return None
        dispatch = module.__dict__.get(method)
        if not isinstance(dispatch, _Dispatch):
            dispatch = _Dispatch(name, getattr(module, method), self, dynamic_batch)
            setattr(module, method, dispatch)
            self._dispatches.append((module, method, dispatch))
        return dispatch

    def _ask(self, dispatch: _Dispatch, sig: tuple, args: tuple, kwargs: dict, grad: str, dynamic: bool) -> None:
        with self._lock:
            if sig in dispatch.asked:
                return
            dispatch.asked.add(sig)
            label = _label(dispatch.name, sig)
            self._pending += 1
            self.status.parts[label] = "compiling"
            self.status.state = "compiling"
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nbhelpers-compile", daemon=True)
                self._thread.start()
        self._queue.put((dispatch, sig, label, args, kwargs, grad, dynamic))

    def wait(self, timeout: float | None = None) -> CompileStatus:
        """Block until every requested compile has ended, or ``timeout`` seconds passed; returns the status."""
        with self._lock:
            self._lock.wait_for(lambda: self._pending == 0, timeout)
        return self.status

    @contextlib.contextmanager
    def paused(self):
        """Inside this block every call runs the eager method and asks for nothing (to time uncompiled models)."""
        self.paused_depth += 1
        try:
            yield self
        finally:
            self.paused_depth -= 1

    @property
    def busy(self) -> bool:
        """True while requested compiles are still running."""
        return self._pending > 0

    def calls(self) -> dict[str, dict[str, int]]:
        """Per model: how many calls ran eager and compiled code so far."""
        return {d.name: dict(d.calls) for _, _, d in self._dispatches}

    def remove(self) -> None:
        """Put every model's eager method back (compiled code is dropped; compiles under way finish unused)."""
        for module, method, dispatch in self._dispatches:
            if module.__dict__.get(method) is dispatch:
                delattr(module, method)
            dispatch.ready = frozenset()
        self._dispatches.clear()

    def _say(self, message: str) -> None:
        if self.on_event is not None:
            with contextlib.suppress(Exception):  # a failing printer must not stop the compile
                self.on_event(message)

    def _run(self) -> None:
        # lower this thread's CPU priority (Linux: niceness is per thread; the compile workers it starts inherit it)
        if sys.platform.startswith("linux") and hasattr(threading, "get_native_id"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        _raise_recompile_limit()
        facts = self.facts() if callable(self.facts) else self.facts
        key, full = cache_key({**facts, "options": self.options})
        folder = self._folder()
        if folder is not None:
            loaded = _load_artifacts(folder, key)
            self.status.warm, self._from_cache = loaded is not None, loaded or set()
        if self.status.warm and "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
            _no_worker_pool()
        how = "from the cache of an earlier session" if self.status.warm else "one time: minutes on 2 CPU cores"
        self._say(f"compiling the models for this GPU in the background ({how}); the job runs eagerly until they are "
                  "ready")
        while True:
            self._compile(*self._queue.get())
            if folder is not None:  # after every part: a process that ends mid-queue keeps what it finished
                self._save(folder, key, full)
            with self._lock:
                self._pending -= 1
                idle = self._pending == 0
            if idle:
                self._finish()
                with self._lock:
                    self._lock.notify_all()

    def _compile(self, dispatch: _Dispatch, sig: tuple, label: str, args: tuple, kwargs: dict, grad: str,
                 dynamic: bool) -> None:
        import torch

        t0 = time.perf_counter()
        try:
            if dynamic not in dispatch.compiled:
                dispatch.compiled[dynamic] = torch.compile(dispatch.eager, dynamic=None if dynamic else False,
                                                           options=self.options or None)
            if dynamic:  # the first dimension of tensors of 2+ dimensions and 2+ rows
                _map_tensors((args, kwargs), lambda t: t.ndim >= 2 and t.shape[0] >= 2
                             and torch._dynamo.maybe_mark_dynamic(t, 0))
            with torch.inference_mode() if grad == "inference" else torch.no_grad():
                dispatch.compiled[dynamic](*args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            dispatch.ready = dispatch.ready | {sig}  # a new frozenset: the job thread reads it lock-free
            self.status.parts[label] = "compiled"
            self._compiled_here.append(label)
        except Exception as exc:  # noqa: BLE001 - any compile failure leaves the eager method in place
            self.status.parts[label] = "failed"
            reason = f"{label}: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
            self.status.reason = reason
            warnings.warn(f"torch.compile failed; this model stays eager (same frames, slower): {reason}",
                          FallbackWarning, stacklevel=1)
        self.status.part_seconds[label] = time.perf_counter() - t0
        self.status.seconds += self.status.part_seconds[label]

    def _save(self, folder: Path, key: str, full: dict) -> None:
        """Write the artifacts of every part this process compiled as one cache file when a part was added since the
        last and not every part is in the files loaded at start, then remove this process's previous file, which the
        new one contains (torch's saved artifacts accumulate over the process). A warm session that compiled only
        cached parts writes nothing: the write would delay the next part for a file the folder already holds."""
        count, previous = self._saved
        if len(self._compiled_here) == count or set(self._compiled_here) <= self._from_cache:
            return
        stem = _save_artifacts(folder, key, self._compiled_here, full)
        if stem is None:
            return
        self._saved = (len(self._compiled_here), stem)
        if previous is not None and previous != stem:
            for suffix in (".bin", ".json"):
                with contextlib.suppress(OSError):
                    (folder / f"{previous}{suffix}").unlink()

    def _finish(self) -> None:
        failed = sum(p == "failed" for p in self.status.parts.values())
        self.status.state = "failed" if failed == len(self.status.parts) else "ready"
        if not failed:
            self.status.reason = f"{len(self.status.parts)} compiled: " + ", ".join(self.status.parts)
        self._say(str(self.status))

    def _folder(self) -> Path | None:
        import torch

        if self.cache_dir is None or not hasattr(torch.compiler, "save_cache_artifacts"):
            return None
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        # only a folder of this user's: cache files hold compiled code that is loaded and run
        return self.cache_dir if os.name != "posix" or self.cache_dir.stat().st_uid == os.getuid() else None


def cache_folder(weights_dir: str | os.PathLike) -> Path:
    """The compile cache folder (not created): ``$NBHELPERS_COMPILE_CACHE``, else ``compile-cache/v<format>`` beside
    the weights folder ``weights_dir`` (a new Colab session starts warm from Drive), else the user's cache folder."""
    env = os.environ.get("NBHELPERS_COMPILE_CACHE")
    if env:
        return Path(env).expanduser()
    parent = Path(weights_dir).expanduser().resolve().parent
    if os.access(parent, os.W_OK):
        return parent / "compile-cache" / f"v{CACHE_FORMAT}"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "nbhelpers" / "compile" / f"v{CACHE_FORMAT}"


def _raise_recompile_limit() -> None:
    """Let dynamo keep :data:`RECOMPILE_LIMIT` compiled variants of a function (default 8): past its limit a new
    shape or option set runs eagerly. ``recompile_limit``, named ``cache_size_limit`` before torch 2.6. Called in
    the thread that compiles (the setting can be per thread); a failure leaves dynamo's limit."""
    with contextlib.suppress(Exception):
        import torch._dynamo.config as dynamo_config

        name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
        setattr(dynamo_config, name, max(getattr(dynamo_config, name), RECOMPILE_LIMIT))


def _no_worker_pool() -> None:
    """Have inductor compile in this process: with the cache warm it finds its kernels made, and the worker pool it
    otherwise starts at its first compile (one process importing torch per core) would only take CPU from the job.
    ``TORCHINDUCTOR_COMPILE_THREADS`` set by the user wins. Source: ``torch._inductor.config.compile_threads``."""
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1


def _load_artifacts(folder: Path, key: str) -> set[str] | None:
    """Load every cache file of ``key`` whose bytes match the SHA-256 recorded beside it; the parts the loaded files
    hold (their ``parts``), None when none loaded."""
    import torch

    loaded: set[str] | None = None
    for meta_path in sorted(folder.glob(f"{key}-*.json")):
        path = meta_path.with_suffix(".bin")
        with contextlib.suppress(Exception):  # an unreadable file only costs a cold compile
            meta = json.loads(meta_path.read_text())
            data = path.read_bytes()
            if meta.get("format") == CACHE_FORMAT and hashlib.sha256(data).hexdigest() == meta.get("sha256"):
                torch.compiler.load_cache_artifacts(data)
                os.utime(path)  # the most recently used files are kept when the folder is trimmed
                loaded = (loaded or set()) | set(meta.get("parts") or ())
    return loaded


def _save_artifacts(folder: Path, key: str, labels: list[str], facts: dict[str, Any]) -> str | None:
    """Write this process's compile artifacts as ``<key>-<labels hash>.bin`` and its ``.json`` (temporary names, then
    renamed), the ``parts`` being ``labels``; returns the stem, None when nothing was written."""
    import torch

    with contextlib.suppress(Exception):  # a cache that cannot be written only costs the next session a compile
        saved = torch.compiler.save_cache_artifacts()
        if not saved or not saved[0]:
            return None
        data = saved[0]
        stem = f"{key}-{hashlib.sha256(json.dumps(sorted(labels)).encode()).hexdigest()[:8]}"
        meta = {"format": CACHE_FORMAT, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                "parts": sorted(labels), "facts": facts}
        for suffix, payload in ((".bin", data), (".json", json.dumps(meta, indent=1, default=str).encode())):
            with atomic_path(folder / f"{stem}{suffix}") as tmp:
                tmp.write_bytes(payload)
        files = sorted(folder.glob("*.bin"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in files[CACHE_KEEP:]:
            for p in (old, old.with_suffix(".json")):
                with contextlib.suppress(OSError):
                    p.unlink()
        return stem
    return None
