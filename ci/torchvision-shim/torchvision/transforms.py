"""The one name mmpose imports from torchvision at import time (see __init__.py); using it fails loudly."""


class ToPILImage:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("torchvision.transforms.ToPILImage: nbhelpers' CI stand-in for torchvision cannot "
                           "do this; run mmpose's visualisers in an environment with the real torchvision")


def __getattr__(name):
    raise AttributeError(f"torchvision.transforms.{name}: not provided by nbhelpers' CI stand-in for torchvision")
