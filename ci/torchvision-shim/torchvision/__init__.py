"""A stand-in for torchvision, used only by ci/mmpose-env.sh's test overlay. Not a torchvision.

Why: PyPI's torchvision wheels for Linux x86_64 are CUDA builds whose compiled ops need ``libtorch_cuda.so``; beside
the CPU torch of the CI venv they fail at import ("operator torchvision::nms does not exist"). A real torchvision
next to it would need the 5.5 GB CUDA torch, which the CI machine's disk cannot hold. mmpose 1.3.2 imports
torchvision on the landmark path only for ``torchvision.transforms.ToPILImage`` at the top of
``mmpose/visualization/simcc_vis.py`` (a heatmap visualiser the landmark model never runs); mmengine, mmcv and mmdet
import it only inside functions the tests never call. Anything else asked of this module fails loudly.
"""

__version__ = "0.0.0+nbhelpers.ci.shim"


def __getattr__(name):
    raise AttributeError(f"torchvision.{name}: this is nbhelpers' CI stand-in for torchvision "
                         "(ci/torchvision-shim), which provides only what importing mmpose needs")
