"""The landmark-backend registry and the automatic choice between backends.

Backends register as ``"module:factory"`` strings, imported when first used, so listing them loads no torch,
cv2, dlib or onnxruntime. A factory is called as ``Factory(weights_dir=..., device=..., **kwargs)``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import warnings
from collections import UserDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import FallbackWarning, InputError, MissingDependencyError
from ..models import LOAD_LOCK
from .base import DLIB_INSTALL, DWPOSE_ONNX_FILE, DWPOSE_PTH_FILE, S3FD_FILE, LandmarkBackend, weights_root

# Weight files (relative to a weights dir, the official `models/` folder) that the detector backends need.
NEEDS_WEIGHTS = {"mmpose": (DWPOSE_PTH_FILE, S3FD_FILE), "dwpose": (DWPOSE_PTH_FILE, S3FD_FILE),
                 "dwpose-onnx": (DWPOSE_ONNX_FILE, S3FD_FILE)}
# The automatic choice, in order: (backend, the module that must import for it).
AUTO_ORDER = (("mmpose", "mmpose"), ("dwpose", "torch"), ("dwpose-onnx", "onnxruntime"))


class BackendRegistry(UserDict):
    """``name -> factory`` mapping whose values may be ``"module:attribute"`` strings, imported lazily.

    Assign a callable or a string to add or replace a backend: ``BACKENDS["mine"] = "mypkg.faces:MyBackend"``."""

    def __getitem__(self, name: str) -> Callable[..., LandmarkBackend]:
        target = self.data[name]
        if not isinstance(target, str):
            return target
        module_name, _, attr = target.partition(":")
        if not attr:
            raise InputError(f"backend {name!r} is registered as {target!r}; the form is 'module:factory'.")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise MissingDependencyError(f"landmark backend {name!r} could not be imported from "
                                         f"{module_name} ({exc}).") from exc
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"BackendRegistry({self.data!r})"


BACKENDS = BackendRegistry({
    "mmpose": "nbhelpers.faces.mmpose_backend:MMPoseBackend",
    "dwpose": "nbhelpers.faces.dwpose_torch:DWPoseBackend",
    "dwpose-onnx": "nbhelpers.faces.dwpose_onnx:DWPoseOnnxBackend",
    "dlib": "nbhelpers.faces.dlib_backend:DlibBackend",
})


def _set_reason(backend: Any, reason: str) -> Any:
    with contextlib.suppress(AttributeError):  # __slots__ or a read-only attribute: the reason is lost, not fatal
        backend.reason = reason
    return backend


def _imports(module: str) -> tuple[bool, str]:
    if importlib.util.find_spec(module) is None:
        return False, f"{module} is not installed"
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - mmcv/mmpose can fail in many ways; any failure means "not usable"
        return False, f"{module} is installed but does not import ({type(exc).__name__}: {str(exc)[:120]})"
    return True, f"{module} imports"


def get_backend(name: str | LandmarkBackend = "auto", weights_dir: str | os.PathLike | None = None,
                device: str | None = None, **kwargs: Any) -> LandmarkBackend:
    """A landmark backend by name, or chosen: ``"auto"`` takes the first of :data:`AUTO_ORDER` whose package imports
    and whose files (:data:`NEEDS_WEIGHTS`) are in the weights dir, else ``dlib``; one that fails to start is skipped
    with a warning. The backend's ``reason`` says which was chosen and why. A backend object is returned unchanged;
    ``weights_dir`` None is :func:`nbhelpers.weights.default_dir`; ``kwargs`` go to the factory (``upsample=1`` for
    dlib). InputError for an unknown name or ``"boxes"`` (pass ``boxes=`` to ``track``); MissingDependencyError when
    the backend's packages are missing or (auto) none is usable; WeightsError for a named backend's bad weights.

    Source: the official code builds DWPose (mmpose) and S3FD at import (``preprocessing.py:15-23``; quirk Q20)."""
    if not isinstance(name, str):
        if callable(getattr(name, "detect", None)):
            return name
        raise InputError(f"backend must be a name ({', '.join(map(repr, ['auto', *BACKENDS]))}) or an object with "
                         f"a detect(frames) method; got {name!r}.")
    if name == "boxes":
        raise InputError("backend 'boxes' is not a detector: pass the crop boxes to nbhelpers.faces.track("
                         "frames, boxes=...) and no detector runs.")
    try:
        wd = weights_root(weights_dir)
    except Exception:  # noqa: BLE001 - no usable default: the weight-based backends are skipped with a reason
        wd = None
    if name != "auto" and name not in BACKENDS:
        raise InputError(f"unknown landmark backend {name!r}; the choices are "
                         f"{', '.join(map(repr, ['auto', *BACKENDS]))}.")

    with LOAD_LOCK:  # one model built at a time in the process (nbhelpers.models.LOAD_LOCK)
        if name == "auto":
            return _auto(wd, device, **kwargs)
        backend = BACKENDS[name](weights_dir=wd, device=device, **kwargs)
    return _set_reason(backend, f"asked for {name!r}")


def _auto(wd: Path | None, device: str | None, **kwargs: Any) -> LandmarkBackend:
    notes: list[str] = []
    where = str(wd) if wd is not None else "no weights dir"
    for name, module in AUTO_ORDER:
        ok, note = _imports(module)
        missing = [f for f in NEEDS_WEIGHTS[name] if wd is None or not (wd / f).is_file()]
        if ok and wd is None:
            ok, note = False, f"{note} but no weights dir is known (pass weights_dir=)"
        elif ok and missing:
            ok, note = False, f"{note} but {', '.join(missing)} missing in {where}"
        if ok:
            try:
                backend = BACKENDS[name](weights_dir=wd, device=device, **kwargs)
            except InputError:
                raise  # the caller's argument is wrong (a bad device, say): no other backend would take it either
            except Exception as exc:  # noqa: BLE001 - fall through to the next candidate, loudly
                warnings.warn(f"landmark backend {name!r} could not start ({type(exc).__name__}: {exc}); "
                              "trying the next one.", FallbackWarning, stacklevel=3)
                notes.append(f"{name} failed to start ({type(exc).__name__})")
                continue
            return _set_reason(backend, "auto: " + "; ".join([*notes, f"{note} and its weights are in {where}"])
                               + f" -> {name}")
        notes.append(note)
    try:
        backend = BACKENDS["dlib"](weights_dir=wd, device=device, **kwargs)
    except MissingDependencyError as exc:
        raise MissingDependencyError(
            "no landmark backend is usable: " + "; ".join(notes) + f"; dlib: {exc}. Install one of:\n"
            f"    {DLIB_INSTALL}   (no weights needed)\n"
            "    pip install torch   (the dwpose backend; then download the weights: notebook 01 / nbhelpers.weights)\n"
            "or give the crop boxes yourself: nbhelpers.faces.track(frames, boxes=(x1, y1, x2, y2)).") from exc
    return _set_reason(backend, "auto: " + "; ".join(notes) + " -> dlib")
