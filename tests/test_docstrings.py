"""Docstrings agree with signatures: the names of a Google-style ``Args:`` section are the function's parameters.

Applies to every public function and method of ``nbhelpers`` (a name without a leading underscore, in a module whose
name has none) whose docstring has an ``Args:`` section, and to a public class whose docstring has one (checked
against its ``__init__``). Names are compared in order. ``self`` and ``cls`` are not listed; ``*args`` and
``**kwargs`` may be listed with or without their stars; ``a, b: ...`` lists two names. Read from the source with
``ast``, so nothing is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.notorch

PACKAGE = Path(__file__).resolve().parents[1] / "nbhelpers"

# Args sections allowed to disagree with their signatures (none). Keys are "module:qualname".
KNOWN_MISMATCHES: set[str] = set()

_NAME = r"\*{0,2}[A-Za-z_][A-Za-z0-9_]*"
_ENTRY = re.compile(rf"^({_NAME}(?:, {_NAME})*)\s*(\([^)]*\))?\s*:")


def args_section(doc: str) -> list[str] | None:
    """Names listed in the ``Args:`` section of a cleaned docstring, in order; None when there is none."""
    lines = doc.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "Args:"]
    if not starts:
        return None
    base = len(lines[starts[0]]) - len(lines[starts[0]].lstrip())
    names, entry_indent = [], None
    for line in lines[starts[0] + 1:]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= base:
            break
        if entry_indent is None:
            entry_indent = indent
        if indent == entry_indent:
            match = _ENTRY.match(line.strip())
            if match:
                names += [name.lstrip("*") for name in match.group(1).split(", ")]
            else:
                names.append(line.strip())
    return names


def parameters(func: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> list[str]:
    """The signature's parameter names in order, without ``self``/``cls`` and with stars removed."""
    a = func.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if is_method and names and names[0] in ("self", "cls") and not _is_static(func):
        names = names[1:]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return names


def _is_static(func) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in func.decorator_list)


def public_functions():
    """Yield ``(key, docstring, function node, is_method)`` for every public function, method and class.

    A class is checked with its own docstring against its ``__init__``, where it documents the constructor's Args.
    """
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        module = ".".join(parts)
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                yield f"{module}:{node.name}", ast.get_docstring(node), node, False
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
                if init is not None:
                    yield f"{module}:{node.name}", ast.get_docstring(node), init, True
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                        yield f"{module}:{node.name}.{item.name}", ast.get_docstring(item), item, True


def mismatches() -> dict[str, str]:
    found = {}
    for key, doc, func, is_method in public_functions():
        listed = args_section(doc) if doc else None
        if listed is None:
            continue
        expected = parameters(func, is_method)
        if listed != expected:
            found[key] = f"Args lists {listed}, the signature has {expected}"
    return found


def test_args_sections_match_signatures():
    found = mismatches()
    unexpected = {k: v for k, v in found.items() if k not in KNOWN_MISMATCHES}
    assert not unexpected, "\n".join(f"{k}: {v}" for k, v in sorted(unexpected.items()))


def test_known_mismatches_are_still_mismatches():
    """An entry of KNOWN_MISMATCHES that now agrees (or no longer exists) must leave the set."""
    stale = KNOWN_MISMATCHES - set(mismatches())
    assert not stale, f"remove from KNOWN_MISMATCHES: {sorted(stale)}"


def test_the_check_reads_args_sections():
    def sample(self, a, *rest, b=1, **extra):
        """Do a thing.

        Args:
            a: First, with a long description
                that wraps.
            *rest: More.
            b, extra: Said together.

        Returns:
            Nothing.
        """

    tree = ast.parse("class C:\n" + "\n".join("    " + line for line in _source(sample).splitlines()))
    func = tree.body[0].body[0]
    assert args_section(ast.get_docstring(func)) == ["a", "rest", "b", "extra"]
    assert parameters(func, is_method=True) == ["a", "rest", "b", "extra"]


def _source(func) -> str:
    import inspect
    import textwrap

    return textwrap.dedent(inspect.getsource(func))
