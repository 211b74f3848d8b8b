"""nbval settings for the notebooks (pytest --nbval-lax --nbval-current-env notebooks/).

TEMPORARY: a notebook cell that calls a package function which has not landed yet is skipped with the name of that
function, so the rest of the notebook still runs in CI. Remove an entry as soon as the function exists (the
entry then has no effect anyway); the table must end up empty.
"""

from __future__ import annotations

import importlib
import os

import pytest

os.environ.setdefault("NBHELPERS_PROGRESS", "0")

# text in a cell -> (module, attribute) that must exist for the cell to run
PENDING = {
    "pipeline.preview(": ("nbhelpers.pipeline", "preview"),
}


def _missing(module: str, attribute: str) -> bool:
    try:
        return not hasattr(importlib.import_module(module), attribute)
    except ImportError:
        return True


def pytest_collection_modifyitems(config, items):
    for item in items:
        source = getattr(getattr(item, "cell", None), "source", "") or ""
        for text, (module, attribute) in PENDING.items():
            if text in source and _missing(module, attribute):
                item.add_marker(pytest.mark.skip(reason=f"{module}.{attribute} has not landed yet"))
