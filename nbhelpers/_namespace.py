"""One namespace for a module split into a package (``tools/split_modules.py``): the package and its submodules.

``nbhelpers.gpu``, ``weights``, ``env`` and ``media`` were single modules; each is now a package whose submodules
own one concern and import what they use from each other. Setting a name on the package (as
``monkeypatch.setattr(gpu, "_read_report", fake)`` does) would change only the package's attribute, while the
submodules that use the name hold their own binding. :func:`share` makes such a set reach every submodule of the
package that holds the same object under that name, and a delete remove it there, so that the package behaves like
the one module it replaced.

Source: none (ours); module ``__class__`` assignment is the documented way to customise a module's attribute
setting (Python data model, "Customizing module attribute access").
"""

from __future__ import annotations

import sys
import types
from typing import Any

_PACKAGES: dict[str, tuple[str, ...]] = {}
_MISSING = object()


class SharedNamespace(types.ModuleType):
    """A package whose attribute sets and deletes also reach the submodules that hold the same name."""

    def __setattr__(self, name: str, value: Any) -> None:
        for module in _holders(self, name):
            setattr(module, name, value)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        for module in _holders(self, name):
            delattr(module, name)
        super().__delattr__(name)


def _holders(package: types.ModuleType, name: str) -> list[types.ModuleType]:
    """The loaded submodules of ``package`` whose global ``name`` is the package's current value."""
    current = package.__dict__.get(name, _MISSING)
    if current is _MISSING or name.startswith("__"):
        return []
    out = []
    for sub in _PACKAGES.get(package.__name__, ()):
        module = sys.modules.get(f"{package.__name__}.{sub}")
        if module is not None and module.__dict__.get(name, _MISSING) is current:
            out.append(module)
    return out


def share(package_name: str, submodules: tuple[str, ...]) -> None:
    """Make the package ``package_name`` (already in ``sys.modules``) one namespace with its ``submodules``.

    Args:
        package_name: The package's ``__name__``.
        submodules: Names of its submodules (relative), all imported by the package's ``__init__``.
    """
    _PACKAGES[package_name] = tuple(submodules)
    sys.modules[package_name].__class__ = SharedNamespace
