"""A test-only stand-in for torchvision, so that spandrel imports beside the CPU torch of the test venv.

Why: spandrel imports ``torchvision.transforms.functional`` when it loads (``normalize`` for RestoreFormer's input,
``rotate`` and ``InterpolationMode`` for LaMa), and PyPI's torchvision for Linux x86_64 is a CUDA build that does not
import beside a CPU torch (docs/environments.md). Users have the real torchvision (Colab, conda, a CUDA pip install).
tests/test_restore.py puts this folder on sys.path only when no torchvision imports. ``normalize`` is implemented
(torchvision's documented maths: ``(x - mean) / std`` per channel); everything else fails loudly when used.
"""

__version__ = "0.0.0+nbhelpers-test-standin"


def __getattr__(name):
    raise AttributeError(f"torchvision.{name}: not provided by nbhelpers' test stand-in (tests/standins)")
