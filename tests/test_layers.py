"""The shape of the package: layers that point one way, no import cycles, and imports that stay light.

Every module of ``nbhelpers`` belongs to a layer (``RANKS``, the table of docs/architecture.md) and imports
only modules of its own layer or of layers below, without cycles. Imports are read from the source with ``ast``
wherever they are in a file (a function-level import ties two modules together as much as a module-level one),
except under ``if TYPE_CHECKING:``. Imports inside functions are for heavy or optional third-party libraries only.
A package module that imports torch at its top (a network's module) is loaded at call time through
``errors.require("nbhelpers....", install)``; such a call is an edge of the graph too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, loaded_by

pytestmark = pytest.mark.notorch

PACKAGE = ROOT / "nbhelpers"

# Layer of each top-level module or subpackage of nbhelpers (a subpackage's modules share its rank). Modules that
# do not exist yet are listed so that the table holds when they land; a module missing here fails the test.
RANKS = {
    # 0 foundations
    "__init__": 0,  # the package itself: it imports nothing at import time (its names resolve lazily)
    "constants": 0,
    "errors": 0,
    "progress": 0,
    "hashing": 0,
    "display": 0,
    "framestore": 0,
    "config": 0,
    "gpu": 0,
    "media": 0,
    "weights": 0,
    # 1 core maths
    "resample": 1,
    "audio": 1,
    "latents": 1,
    "faces": 1,
    "parsing": 1,
    "blending": 1,
    "restore": 1,
    "models": 1,
    "groupnorm": 1,  # GroupNorm statistics from per-channel moments; models.load_vae routes the decoder
    "upsampling": 1,  # the VAE decoder's upsampling in phase form; models.load_vae routes every decoder
    "quality": 1,  # sync measures (SyncNet, MFCC, mouth-audio lag): faces and models, no job
    # 2 engine
    "engine": 2,
    "checks": 2,
    "offline": 2,
    "result": 2,
    "reference": 2,
    # 3 pipeline
    "pipeline": 3,
    # 4 jobs
    "avatar": 4,
    "live": 4,
    "batch": 4,
    "testing": 4,
    # 5 front ends
    "ui": 5,
    "workbook": 5,
    "env": 5,
    "cli": 5,
    "__main__": 5,
}

# The setup notebook imports these before the workbook's dependencies are installed (env.install_missing installs
# them), so they import with the standard library alone; the package modules they use that need numpy are imported
# inside the functions that use them (the one place where a function imports a module of the package).
STDLIB_ONLY = ("nbhelpers.env", "nbhelpers.workbook")

# Modules that still break a rule below: owned by another branch of the redesign, which takes them out of this set
# when it lands. Nothing else may be added here.
PENDING: set[str] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """Ids of the nodes under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(x) for stmt in node.body for x in ast.walk(stmt))
    return skip


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The nbhelpers modules an import statement loads (the deepest module each name resolves to)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]
    out = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def _imports(module: str) -> list[tuple[ast.Import | ast.ImportFrom, set[str], bool]]:
    """Every import statement of ``module`` outside ``if TYPE_CHECKING:``: (node, nbhelpers targets, in a function).

    Imports of other libraries come with an empty set of targets."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    in_function = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(id(x) for x in ast.walk(fn) if x is not fn)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
            found.append((node, _targets(module, path, node), id(node) in in_function))
    return found


def _required(module: str) -> set[str]:
    """The package modules that ``module`` loads at call time with ``require("nbhelpers....", install)``."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and node.args[0].value.startswith("nbhelpers.")):
            found.add(node.args[0].value)
    return found


REQUIRED = {m: _required(m) for m in MODULES}
GRAPH = {m: sorted({t for _, targets, _ in _imports(m) for t in targets} | REQUIRED[m]) for m in MODULES}


def _third_party(node: ast.Import | ast.ImportFrom) -> set[str]:
    """The libraries outside the standard library and nbhelpers that an import statement loads."""
    if isinstance(node, ast.ImportFrom):
        names = [] if node.level or not node.module else [node.module]
    else:
        names = [alias.name for alias in node.names]
    return {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"nbhelpers"}


def _loaded_at_import(module: str) -> tuple[set[str], set[str]]:
    """The package modules importing ``module`` runs (its parents included) and the other libraries they load."""
    seen, libraries, todo = set(), set(), [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if "." in m:
            todo.append(m.rpartition(".")[0])  # importing a submodule runs its package's __init__ first
        for node, targets, in_function in _imports(m):
            if not in_function:
                todo.extend(targets)
                libraries |= _third_party(node)
    return seen, libraries


def _stdlib_only(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in STDLIB_ONLY)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _strongly_connected(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (the import cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_every_module_has_a_layer():
    unknown = sorted(m for m in MODULES if _layer(m) not in RANKS)
    assert not unknown, f"give these modules a rank in RANKS (tests/test_layers.py): {unknown}"


def test_pending_names_only_modules_that_exist():
    assert PENDING <= set(MODULES), sorted(PENDING - set(MODULES))


def test_required_names_are_package_modules():
    unknown = {m: sorted(names - set(MODULES)) for m, names in REQUIRED.items() if names - set(MODULES)}
    assert not unknown, f"require() names modules that do not exist: {unknown}"


def test_no_import_cycles():
    cycles = [c for c in _strongly_connected(GRAPH) if not set(c) <= PENDING]
    assert not cycles, "import cycles (imports inside functions count too):\n" + "\n".join(map(str, cycles))


def test_the_cycle_finder_finds_cycles():
    graph = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": ["e"], "f": []}
    assert _strongly_connected(graph) == [["a", "b", "c"]]


def test_each_module_imports_only_its_layer_or_lower():
    upward = [f"{m} (rank {RANKS[_layer(m)]}) imports {t} (rank {RANKS[_layer(t)]})"
              for m, targets in GRAPH.items() if m not in PENDING and _layer(m) in RANKS
              for t in targets if _layer(t) in RANKS and RANKS[_layer(t)] > RANKS[_layer(m)]]
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def test_no_function_level_import_of_a_package_module():
    """Inside functions only heavy or optional third-party libraries are imported (torch, cv2, ...); the one
    exception is a STDLIB_ONLY module importing a package module that needs another library."""
    found = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}"
             for m in MODULES if m not in PENDING
             for node, targets, in_function in _imports(m) if in_function and targets
             if not (_stdlib_only(m) and all(_loaded_at_import(t)[1] for t in targets))]
    assert not found, "move these imports to the top of their module:\n" + "\n".join(found)


def test_the_setup_modules_import_with_the_standard_library_alone():
    stdlib_only = [m for m in MODULES if _stdlib_only(m)]
    assert "nbhelpers.env.install" in stdlib_only and "nbhelpers.workbook" in stdlib_only
    loads = {m: sorted(_loaded_at_import(m)[1]) for m in stdlib_only}
    assert not any(loads.values()), {m: libs for m, libs in loads.items() if libs}
    code = ("import sys; sys.modules['numpy'] = None; import nbhelpers.env, nbhelpers.workbook; "
            "print(nbhelpers.env.run_mode())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_packages_import_without_heavy_libraries():
    heavy = ("torch", "cv2", "diffusers", "transformers", "onnxruntime", "onnx", "dlib", "huggingface_hub",
             "matplotlib", "ipywidgets", "spandrel")
    code = ("import nbhelpers, nbhelpers.gpu, nbhelpers.weights, nbhelpers.media, nbhelpers.env, nbhelpers.faces, "
            "nbhelpers.models, nbhelpers.testing, nbhelpers.restore, nbhelpers.workbook")
    assert loaded_by(code, heavy) == []
