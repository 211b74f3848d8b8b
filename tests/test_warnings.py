"""Our warnings: every one has an nbhelpers category, and they print as ``Name: message`` without a source line."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings

import pytest
from helpers import ROOT

from nbhelpers.errors import FallbackWarning, NbHelpersWarning

PACKAGE = ROOT / "nbhelpers"
# testing.py only builds tiny weights for tests; its notes are for developers and keep Python's format.
EXEMPT = {"testing.py"}


def _warn_calls():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in EXEMPT:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "warn"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "warnings"):
                yield path, node


@pytest.mark.notorch
def test_every_warning_the_package_gives_has_an_nbhelpers_category():
    calls = list(_warn_calls())
    assert len(calls) >= 10  # the walk really found the package's warnings
    for path, node in calls:
        where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        category = node.args[1] if len(node.args) > 1 else next(
            (kw.value for kw in node.keywords if kw.arg == "category"), None)
        assert isinstance(category, ast.Name), f"{where}: warnings.warn without a category (UserWarning)"
        module_name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a module that needs torch at import, in the venv without torch
            assert exc.name == "torch", f"{module_name}: {exc}"
            continue
        cls = getattr(module, category.id)
        assert issubclass(cls, NbHelpersWarning), f"{where}: {category.id} is not an NbHelpersWarning"


@pytest.mark.notorch
def test_our_warnings_print_without_the_source_line_and_others_are_untouched():
    from nbhelpers.gpu import PlanWarning

    text = warnings.formatwarning("2 frames take about 3 s", PlanWarning, "/x/nbhelpers/gpu.py", 12, "line()")
    assert text == "PlanWarning: 2 frames take about 3 s\n"
    other = warnings.formatwarning("plain", UserWarning, "/x/y.py", 7, "source_line()")
    assert other.startswith("/x/y.py:7: UserWarning: plain") and "source_line()" in other


@pytest.mark.notorch
def test_in_a_fresh_interpreter_stderr_shows_the_short_form():
    code = ("import warnings, nbhelpers.errors as e\n"
            "warnings.warn('batch halved', e.FallbackWarning)\n"
            "warnings.warn('theirs', DeprecationWarning)\n")
    proc = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "FallbackWarning: batch halved"
    assert "<string>:3: DeprecationWarning: theirs" in proc.stderr


@pytest.mark.notorch
def test_fallback_warnings_are_still_runtime_warnings():
    # Code written against RuntimeWarning (the category before NbHelpersWarning) keeps catching them.
    with pytest.warns(RuntimeWarning, match="halved"):
        warnings.warn("halved", FallbackWarning, stacklevel=1)
