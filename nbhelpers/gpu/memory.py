"""Peak-memory discipline: the CUDA allocator setting, releasing models and caches, stage peaks, host-to-GPU copies."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from .model import GIB

ALLOCATOR_SETTING = "expandable_segments:True"


def prefer_expandable_segments() -> bool:
    """Set ``PYTORCH_CUDA_ALLOC_CONF`` to :data:`ALLOCATOR_SETTING` on Linux unless an allocator setting exists,
    ``NBHELPERS_ALLOCATOR`` is ``default`` or CUDA has started; True when this call set it. Batches of several
    sizes leave the default allocator blocks it cannot reuse; expandable segments lower the peak reserved memory
    (bench/RESULTS.md, "Memory by stage")."""
    if (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")
            or os.environ.get("NBHELPERS_ALLOCATOR", "").lower() == "default" or not sys.platform.startswith("linux")):
        return False
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return False
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_SETTING
    return True


prefer_expandable_segments()

_PEAK_SEEN: dict[int, float] = {}  # device index -> largest max_memory_reserved seen before a reset (bytes)


def _cuda(device: Any = None):
    """(torch, device index) when CUDA is usable, else (None, None). Never raises."""
    try:
        import torch

        dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        if dev.type != "cuda" or not torch.cuda.is_available():
            return None, None
        return torch, dev.index if dev.index is not None else torch.cuda.current_device()
    except Exception:  # noqa: BLE001
        return None, None


def empty_cache() -> None:
    """Run ``gc.collect()`` and ``torch.cuda.empty_cache()`` (the latter only when CUDA is usable)."""
    gc.collect()
    torch, _ = _cuda()
    if torch is not None:
        torch.cuda.empty_cache()


def release(*objects: Any) -> float:
    """Give up the memory of models and tensors a stage no longer needs, then empty the caches; return the GiB freed.

    Modules move to the ``meta`` device, tensors get an empty storage, containers are emptied, and an object's
    attributes are released one level deep (``*objects`` of any other kind are ignored). Still ``del`` your names."""
    torch, index = _cuda()
    before = torch.cuda.memory_reserved(index) if torch is not None else 0
    for obj in objects:
        _release_one(obj, depth=0)
    empty_cache()
    after = torch.cuda.memory_reserved(index) if torch is not None else 0
    return max(0, before - after) / GIB


def _release_one(obj: Any, depth: int) -> None:
    torch = sys.modules.get("torch")
    if obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if torch is not None:
        if isinstance(obj, torch.nn.Module):
            with contextlib.suppress(Exception):  # modules that refuse .to(); gc may still free them
                obj.to(device="meta")
            return
        if isinstance(obj, torch.Tensor):
            with contextlib.suppress(Exception), torch.no_grad():
                obj.data = torch.empty(0, dtype=obj.dtype, device=obj.device)
            return
    if depth > 1:
        return
    for item in _children(obj):
        _release_one(item, depth + 1)
    if isinstance(obj, (list, dict, set)):
        obj.clear()


def _children(obj: Any) -> list[Any]:
    """The items of a list, tuple, set or dict (its values), else the values of ``obj.__dict__`` (or [])."""
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    attrs = getattr(obj, "__dict__", None)
    return list(attrs.values()) if isinstance(attrs, dict) else []


@dataclass
class StageMemory:
    """Memory of one stage, GiB, filled when its :func:`memory_scope` exits (all 0 on the CPU): the peaks of
    ``torch.cuda.max_memory_reserved`` / ``_allocated`` in the stage, and what stays reserved at its end."""

    stage: str
    peak_reserved_gib: float = 0.0
    peak_allocated_gib: float = 0.0
    reserved_after_gib: float = 0.0

    def __str__(self) -> str:
        return (f"{self.stage}: peak {self.peak_reserved_gib:.2f} GiB reserved "
                f"({self.peak_allocated_gib:.2f} GiB allocated), {self.reserved_after_gib:.2f} GiB after release")


@contextmanager
def memory_scope(stage: str, device: Any = None) -> Iterator[StageMemory]:
    """Yield the :class:`StageMemory` named ``stage`` on ``device`` (None: current): entry resets the peak counters
    (:func:`peak_memory` keeps the overall peak); exit, also on error, fills it in."""
    record = StageMemory(stage)
    torch, index = _cuda(device)
    if torch is not None:
        _remember_peak(torch, index)
        torch.cuda.reset_peak_memory_stats(index)
    try:
        yield record
    finally:
        if torch is not None:
            record.peak_reserved_gib = torch.cuda.max_memory_reserved(index) / GIB
            record.peak_allocated_gib = torch.cuda.max_memory_allocated(index) / GIB
            record.reserved_after_gib = torch.cuda.memory_reserved(index) / GIB


def _remember_peak(torch: Any, index: int) -> None:
    _PEAK_SEEN[index] = max(_PEAK_SEEN.get(index, 0), torch.cuda.max_memory_reserved(index))


@dataclass(frozen=True)
class PeakMemory:
    """Peak GPU memory of this process so far, GiB: the largest ``torch.cuda.max_memory_reserved`` seen across
    :func:`memory_scope` resets, ``max_memory_allocated`` since the last reset, and the CUDA context (``total - free
    - reserved`` less other processes; None on the CPU)."""

    reserved_gib: float = 0.0
    allocated_gib: float = 0.0
    context_gib: float | None = None

    def __str__(self) -> str:
        ctx = "unknown" if self.context_gib is None else f"{self.context_gib:.2f} GiB"
        return (f"peak {self.reserved_gib:.2f} GiB reserved + context {ctx} = "
                f"{self.reserved_gib + (self.context_gib or 0.0):.2f} GiB ({self.allocated_gib:.2f} GiB allocated)")


def peak_memory(device: Any = None, others_gib: float = 0.0) -> PeakMemory:
    """This process's :class:`PeakMemory` on ``device`` (None: current), for benchmarks (zeros without CUDA).
    ``others_gib``: GiB other processes hold there."""
    torch, index = _cuda(device)
    if torch is None:
        return PeakMemory()
    _remember_peak(torch, index)
    reserved = torch.cuda.memory_reserved(index)
    free, total = torch.cuda.mem_get_info(index)
    context = max(0.0, (total - free - reserved) / GIB - others_gib)
    return PeakMemory(reserved_gib=_PEAK_SEEN[index] / GIB,
                      allocated_gib=torch.cuda.max_memory_allocated(index) / GIB, context_gib=context)


def to_device(array: Any, device: Any):
    """A numpy array or CPU tensor on ``device`` (same dtype and shape), copied through pinned memory on CUDA so that
    the host does not wait for the GPU's queue (CUDA Runtime API, "API synchronization behavior")."""
    import numpy as np
    import torch

    t = array if isinstance(array, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(array))
    device = torch.device(device)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


_CONSTANTS: dict[tuple, Any] = {}


def device_constant(values: Any, device: Any, dtype: Any = None):
    """A small read-only tensor of ``values`` (at most 1 MiB) on ``device``, uploaded once through pinned memory and
    shared; ``dtype`` defaults to the array's, float32 for floats, int64 for integers.
    Raises InputError: ``values`` is larger than 1 MiB."""
    import numpy as np
    import torch

    arr = np.asarray(values)
    if arr.nbytes > 1 << 20:
        raise InputError(f"device_constant is for small constants (<= 1 MiB); got {arr.nbytes} bytes.")
    t = torch.from_numpy(np.array(arr, order="C"))  # a copy: the cached tensor must not alias the caller's array
    if dtype is None:
        dtype = torch.float32 if t.is_floating_point() else (torch.bool if t.dtype == torch.bool else torch.int64)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (arr.tobytes(), arr.shape, str(arr.dtype), str(dtype), str(device))
    cached = _CONSTANTS.get(key)
    if cached is None:
        cached = to_device(t.to(dtype), device)
        if len(_CONSTANTS) > 256:  # bounded: constants are few; a caller making many distinct ones gets no cache
            _CONSTANTS.clear()
        _CONSTANTS[key] = cached
    return cached


def host_wait(device: Any = None) -> None:
    """Wait, sleeping rather than spinning a CPU core, until the GPU has done the work queued on ``device``'s stream:
    a blocking CUDA event (cudaEventBlockingSync) leaves the core to the video encoder. No-op without CUDA."""
    torch, index = _cuda(device)
    if torch is None:
        return
    event = torch.cuda.Event(blocking=True)
    event.record(torch.cuda.current_stream(index))
    event.synchronize()


def usable_bytes(device: Any = None) -> int | None:
    """Bytes this process may still allocate on ``device``: free memory plus the allocator's unused cache, within
    ``set_per_process_memory_fraction``; None without CUDA."""
    torch, index = _cuda(device)
    if torch is None:
        return None
    free, total = torch.cuda.mem_get_info(index)
    reserved, allocated = torch.cuda.memory_reserved(index), torch.cuda.memory_allocated(index)
    usable = free + max(0, reserved - allocated)
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.7
    if get_fraction is not None:
        fraction = float(get_fraction(index))
        if fraction < 1.0:
            usable = min(usable, int(fraction * total) - allocated)
    return max(0, int(usable))


MODULE_SEARCH_DEPTH = 4  # attribute levels module_bytes looks through (backend -> detector -> network: 2)


def module_bytes(*objects: Any, device: Any = None) -> int:
    """Bytes that the parameters and buffers of the torch modules in ``objects`` hold on ``device`` (None: any).

    Modules are found up to :data:`MODULE_SEARCH_DEPTH` levels into attributes and containers; each storage counts
    once; loose tensors and other libraries' memory do not count. 0 when torch is not imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    want = None if device is None else torch.device(device)
    seen: set[int] = set()
    storages: dict[tuple[str, int], int] = {}  # (device, data pointer) -> bytes

    def on_device(t: Any) -> bool:
        return want is None or (t.device.type == want.type and want.index in (None, t.device.index))

    def visit(obj: Any, depth: int) -> None:
        if obj is None or isinstance(obj, (str, bytes, int, float, bool)) or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            for t in itertools.chain(obj.parameters(), obj.buffers()):
                if on_device(t) and t.device.type != "meta":
                    storage = t.untyped_storage()
                    storages[(str(t.device), storage.data_ptr())] = storage.nbytes()
            return
        if isinstance(obj, torch.Tensor) or depth >= MODULE_SEARCH_DEPTH:
            return
        for item in _children(obj):
            visit(item, depth + 1)

    for obj in objects:
        visit(obj, 0)
    return sum(storages.values())


def reset_peak(device: Any = None) -> None:
    """Forget the peaks so far on ``device`` (None: current): torch's counters and the one :func:`peak_memory`
    keeps; nothing happens without CUDA."""
    torch, index = _cuda(device)
    if torch is not None:
        _PEAK_SEEN.pop(index, None)
        torch.cuda.reset_peak_memory_stats(index)


def cast_and_move(module: Any, device: Any, dtype: Any = None) -> Any:
    """Move ``module`` to ``device`` and cast its floating tensors to ``dtype`` (None: kept), tensor by tensor.

    A tensor leaving the CPU is cast before the copy, so the GPU never holds fp32 weights of an fp16 model; to the
    CPU it is copied, then cast. ``nn.Module._apply`` keeps diffusers' and transformers' ``.to`` warnings quiet.

    Returns ``module`` itself, changed in place, training/eval mode unchanged.
    Raises InputError: ``module`` is not a ``torch.nn.Module`` or ``dtype`` is not a floating dtype.
    Source: ``inference.py:53-56`` moves to the GPU, then calls ``.half()``."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise InputError(f"module must be a torch.nn.Module; got {type(module).__name__}.")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise InputError(f"dtype must be a floating torch dtype (torch.float16, torch.float32) or None; got {dtype!r}.")
    target = torch.device(device)

    def convert(t):
        want = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
        if want == t.dtype:
            return t.to(device=target)
        cast_first = t.device.type == "cpu" or (
            target.type != "cpu" and torch.finfo(want).bits < torch.finfo(t.dtype).bits)
        return t.to(dtype=want).to(device=target) if cast_first else t.to(device=target).to(dtype=want)

    with torch.no_grad():
        module._apply(convert)
    return module
