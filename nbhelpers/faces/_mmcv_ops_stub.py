"""A stand-in for ``mmcv.ops`` so that mmpose (and the mmdet modules it imports) load with ``mmcv-lite``.

DWPose's RTMPose needs no compiled mmcv operator, but mmpose and mmdet import names from ``mmcv.ops``.
:func:`install` puts ``mmcv.ops`` and the submodules they name into ``sys.modules`` when the real one does not
import; each operator there, and any other name asked for, raises :class:`NotImplementedError` when instantiated.
"""

from __future__ import annotations

import importlib
import sys
import types

# Names mmpose 1.3.2 and mmdet 3.3.0 import from mmcv.ops or its submodules.
KNOWN_OPS = (
    "DeformConv2d", "ModulatedDeformConv2d", "MultiScaleDeformableAttention", "RoIPool", "RoIAlign", "batched_nms",
    "nms", "nms_match", "roi_align", "point_sample", "rel_roi_point_to_rel_img_point", "deform_conv2d",
    "sigmoid_focal_loss", "MaskedConv2d", "CornerPool", "CARAFEPack", "SumCell", "ConcatCell", "GlobalPoolingCell",
)
SUBMODULES = ("nms", "roi_align", "carafe", "merge_cells", "modulated_deform_conv", "deform_conv",
              "multi_scale_deform_attn", "point_sample", "focal_loss", "roi_pool")


def _placeholder(name: str):
    message = (f"mmcv.ops.{name} is a compiled mmcv operator, and this environment has mmcv-lite (no compiled "
               f"operators) with nbhelpers' stand-in for mmcv.ops. The DWPose/RTMPose landmark model does not "
               f"use it; a model that does needs full mmcv (see nbhelpers.faces.mim.install_mmpose).")

    class _MissingOp:
        __doc__ = message

        def __init__(self, *args, **kwargs):  # subclassing at import time works; building one does not
            raise NotImplementedError(message)

    _MissingOp.__name__ = _MissingOp.__qualname__ = name
    return _MissingOp


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(name)
        setattr(self, name, value)
        return value


def real_ops_available() -> bool:
    """True when the real compiled ``mmcv.ops`` imports (full mmcv); the stub is then never installed."""
    if is_installed():
        return False
    try:
        importlib.import_module("mmcv.ops")
    except ImportError:
        for key in [k for k in sys.modules if k == "mmcv.ops" or k.startswith("mmcv.ops.")]:
            del sys.modules[key]  # drop the half-imported package left by the failed import
        return False
    return True


def is_installed() -> bool:
    """True when the stand-in is the ``mmcv.ops`` in ``sys.modules``."""
    return isinstance(sys.modules.get("mmcv.ops"), _StubModule)


def install() -> bool:
    """Put the stand-in ``mmcv.ops`` into ``sys.modules`` (before mmpose is imported) unless mmcv is absent or its
    real compiled operators import; True when the stand-in is (now) in place."""
    if is_installed():
        return True
    try:
        mmcv = importlib.import_module("mmcv")
    except ImportError:
        return False
    if real_ops_available():
        return False
    ops = _StubModule("mmcv.ops", __doc__)
    ops.__path__ = []  # a package, so that "import mmcv.ops.nms" finds the submodules below
    for name in KNOWN_OPS:
        setattr(ops, name, _placeholder(name))
    sys.modules["mmcv.ops"] = ops
    for sub in SUBMODULES:
        module = _StubModule(f"mmcv.ops.{sub}", f"nbhelpers stand-in for mmcv.ops.{sub} (see mmcv.ops)")
        for name in KNOWN_OPS:
            setattr(module, name, getattr(ops, name))
        sys.modules[f"mmcv.ops.{sub}"] = module
        if sub not in KNOWN_OPS:  # mmcv.ops.nms etc. are the functions, as in real mmcv, not the submodules
            setattr(ops, sub, module)
    mmcv.ops = ops
    return True
