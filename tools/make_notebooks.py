#!/usr/bin/env python
"""Write the workbook's notebooks (notebooks/*.ipynb) from their sources (notebooks/src/*.py), canonical, no outputs.

    python tools/make_notebooks.py          # (re)write every notebook
    python tools/make_notebooks.py --check  # exit 1 when a committed notebook differs from what this writes

The sources are jupytext "percent" files: plain Python where ``# %%`` starts a code cell (``# %% tags=[...]`` adds
its tags) and ``# %% [markdown]`` a markdown cell written as ``#`` comments. Edit them in any editor, or open them in
Jupyter (with jupytext installed, *Open With > Notebook*) and save; then run this script. It adds what every
notebook shares and no source repeats: the notebook metadata (Colab's GPU hint, the python3 kernel) and cell ids
derived from the notebook's name and the cell's position, so regenerating an unchanged notebook changes no byte. It
refuses a source whose setup or run-mode cell differs from :data:`SETUP_CELL` / :data:`MODE_CELL` (the same in
every notebook), and the linter (tests/test_notebooks_lint.py) checks the result.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SOURCES = NOTEBOOKS / "src"

ORG_REPO = "musetalk-workbook/musetalk-workbook"  # GitHub owner/name of this repository
REPO = f"https://github.com/{ORG_REPO}"
# The git ref the notebooks install on Colab: the main branch, a ref that always exists (the repository makes no
# release tags), so a workshop gets the fixes of the day; tests/test_notebooks_lint.py checks that every notebook
# installs it, that it exists in this checkout, and that a release tag, if one is ever pinned here, is the
# package's version.
REF = "main"

# The first code cell of every notebook: four plain lines. On Colab it installs this repository at the pinned
# ref with its [colab] extra (what Colab lacks: floors, never torch) in one pip call of the kernel's own Python
# (what %pip does), fetching nothing else; elsewhere the package is installed already and the cell does nothing.
SETUP_CELL = f"""import subprocess, sys
WORKBOOK = "musetalk-workbook[colab] @ git+{REPO}@{REF}"
if "google.colab" in sys.modules:  # on Colab: install this workbook (torch stays as it is)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", WORKBOOK], check=True)"""

# The second code cell of every notebook: the package, the run mode (where inputs and weights come from) and the
# runtime report.
MODE_CELL = """import nbhelpers as nbh  # the workbook's package: pipeline, media, widgets and plots
MODE = nbh.env.run_mode()  # "colab", "ci" (the tests set NBHELPERS_MODE=ci) or "local"
nbh.setup(MODE)  # your runtime: GPU, versions, weights folder"""

# The notebooks in reading order (each has notebooks/src/<name>.py).
BOOK = ("00_setup", "01_weights", "02_media", "03_avatar", "04_lipsync", "05_realtime", "06_inside_musetalk",
        "quickstart")
# How the sources are written (what jupytext writes back when a source is saved from Jupyter): no header, only
# the cells' tags kept.
FORMAT = "py:percent"
SOURCE_METADATA = {"jupytext": {"notebook_metadata_filter": "-all", "cell_metadata_filter": "tags"}}


class SourceError(ValueError):
    """A notebook source breaks a rule the generator keeps (the message names the file and the fix)."""


def source_path(name: str) -> Path:
    """``notebooks/src/<name>.py``."""
    return SOURCES / f"{name}.py"


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def read_source(name: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """The cells of a source as ``(kind, text, tags)``, checked for the common setup and run-mode cells.

    Raises:
        SourceError: The source is missing, or its first two code cells are not SETUP_CELL and MODE_CELL.
    """
    import jupytext  # here, not at import: the linter and its tests read this module's constants without it

    path = source_path(name)
    if not path.is_file():
        raise SourceError(f"{_shown(path)} is missing: every notebook in BOOK needs its source")
    nb = jupytext.reads(path.read_text(encoding="utf-8"), fmt=FORMAT)
    cells = [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in nb.cells]
    code = [text for kind, text, _ in cells if kind == "code"]
    for i, (want, label) in enumerate(((SETUP_CELL, "SETUP_CELL"), (MODE_CELL, "MODE_CELL"))):
        if len(code) <= i or code[i] != want:
            raise SourceError(f"{_shown(path)}: code cell {i + 1} must be the common {label} of "
                              "tools/make_notebooks.py (the same in every notebook): change it there and in every "
                              "source together")
    return cells


def build(name: str, cells: list | None = None) -> nbformat.NotebookNode:
    """A notebook (nbformat 4.5) of ``cells`` (default: its source's) with deterministic ids, Colab's GPU hint and
    no outputs."""
    cells = read_source(name) if cells is None else cells
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "accelerator": "GPU",
        "colab": {"gpuType": "T4", "provenance": []},
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, (kind, text, tags) in enumerate(cells):
        cell = nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
        cell.id = f"{name.replace('_', '-')}-{i:02d}"
        if tags:
            cell.metadata["tags"] = list(tags)
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    """The canonical file text of notebook ``name`` (what nbformat.write would write)."""
    return nbformat.writes(build(name)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a notebook is stale")
    args = parser.parse_args(argv)
    stale = []
    for name in BOOK:
        path = NOTEBOOKS / f"{name}.ipynb"
        text = render(name)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path.relative_to(ROOT).as_posix())
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print("stale (run python tools/make_notebooks.py):", *stale, sep="\n  ")
        return 1
    print(("stale: " if args.check else "written: ") + (", ".join(stale) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
