"""The shape of the package: layers that point one way, and imports that stay light."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.notorch

HEAVY = ("torch", "cv2", "diffusers", "transformers", "onnxruntime", "dlib", "huggingface_hub", "matplotlib",
         "ipywidgets")


def test_the_packages_import_without_heavy_libraries():
    code = ("import sys, nbhelpers, nbhelpers.gpu, nbhelpers.weights, nbhelpers.media, nbhelpers.env, "
            f"nbhelpers.faces; bad = [m for m in {HEAVY!r} if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
