"""The notebook linter as tests: every rule of tools/nblint.py over every notebook, plus the linter's own checks.

The rules (STYLE.md §14-15): canonical JSON without outputs, one H1 then the Colab badge, the common setup and
run-mode cells, one ``parameters`` cell, code cells of at most 3 lines, a sentence or two of second-person markdown
before each code cell, no "we", a licence line naming each media file, timing cells tagged for nbval, and a final
``env.check_result`` cell. The notebooks must also be exactly what tools/make_notebooks.py writes.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


nblint = _load("nblint")
make_notebooks = _load("make_notebooks")


def test_every_expected_notebook_exists():
    assert sorted(p.stem for p in NOTEBOOKS) == sorted(nblint.EXPECTED)


@pytest.mark.parametrize("rule", nblint.RULES, ids=lambda r: r.__name__)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_rule(path, rule):
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    assert rule(path, nb, text) == []


@pytest.mark.parametrize("name", list(make_notebooks.BOOK))
def test_committed_notebook_is_what_the_generator_writes(name):
    path = ROOT / "notebooks" / f"{name}.ipynb"
    assert path.read_text(encoding="utf-8") == make_notebooks.render(name), (
        f"{path.name} differs from tools/make_notebooks.py: edit the generator and run it")


def test_setup_cell_is_identical_and_short():
    firsts = {nbformat.read(p, as_version=4).cells[2].source for p in NOTEBOOKS}
    assert firsts == {make_notebooks.SETUP_CELL}
    assert len(make_notebooks.SETUP_CELL.splitlines()) <= 3
    # On Colab it installs the pinned release with its [colab] extra in one pip call; it never names torch and
    # fetches nothing else by address (00_setup read requirements-colab.txt from GitHub: offline it failed).
    assert '"musetalk-workbook[colab] @ git+{REPO}@{TAG}"' in make_notebooks.SETUP_CELL
    assert "raw/" not in make_notebooks.SETUP_CELL and " -r " not in make_notebooks.SETUP_CELL
    assert "torch" not in make_notebooks.SETUP_CELL


def test_setup_cell_runs_in_ipython_outside_colab(monkeypatch):
    """The setup cell's Colab branch is skipped and nbh.setup() returns the report (IPython transforms kept)."""
    pytest.importorskip("IPython")
    from IPython.core.inputtransformer2 import TransformerManager

    source = TransformerManager().transform_cell(make_notebooks.SETUP_CELL)
    calls = []

    class FakeShell:
        def run_line_magic(self, *args):  # pragma: no cover - must not be reached outside Colab
            calls.append(args)

    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setenv("NBHELPERS_MODE", "ci")
    namespace = {"get_ipython": FakeShell}
    exec(compile(source + "\n_report = nbh.setup()", "<setup cell>", "exec"), namespace)
    assert calls == []
    assert namespace["_report"].mode == "ci"


def test_setup_cell_installs_on_colab(monkeypatch):
    """In Colab the same cell calls %pip with the pinned git URL and the requirements file of that tag."""
    from IPython.core.inputtransformer2 import TransformerManager

    source = TransformerManager().transform_cell(make_notebooks.SETUP_CELL.splitlines()[0] + "\n"
                                                 + make_notebooks.SETUP_CELL.splitlines()[1])
    calls = []

    class FakeShell:
        def run_line_magic(self, *args):
            calls.append(args)

    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    exec(compile(source, "<setup cell>", "exec"), {"get_ipython": FakeShell})
    repo, tag = make_notebooks.REPO, make_notebooks.TAG
    assert calls == [("pip", f'install -q "musetalk-workbook[colab] @ git+{repo}@{tag}"')]


# -- the linter catches what it should: mutate a good notebook and expect the rule to complain -------------------


def _good():
    path = ROOT / "notebooks" / "04_lipsync.ipynb"
    return path, nbformat.read(path, as_version=4)


def _problems(rule, path, nb):
    text = nbformat.writes(nb) + "\n"
    return rule(path, nb, text)


def test_linter_flags_outputs_and_counts():
    path, nb = _good()
    nb.cells[2].execution_count = 3
    nb.cells[4].outputs = [nbformat.v4.new_output("stream", text="hi")]
    assert len(_problems(nblint.rule_no_outputs, path, nb)) == 2


def test_linter_flags_second_h1_and_missing_badge():
    path, nb = _good()
    bad = copy.deepcopy(nb)
    bad.cells[1].source = "# Another title\n\nYou read this."
    assert _problems(nblint.rule_single_h1_and_badge, path, bad)
    bad = copy.deepcopy(nb)
    bad.cells[0].source = bad.cells[0].source.replace("04_lipsync.ipynb", "03_avatar.ipynb")
    assert _problems(nblint.rule_single_h1_and_badge, path, bad)


def test_linter_flags_we_and_missing_second_person():
    path, nb = _good()
    nb.cells[7].source = "## Inputs\n\nWe load the inputs here."
    assert _problems(nblint.rule_no_we, path, nb)
    assert _problems(nblint.rule_markdown_before_code, path, nb)


def test_linter_flags_long_cells_and_missing_markdown():
    path, nb = _good()
    nb.cells[8].source = "a = 1\nb = 2\nc = 3\nd = 4"
    del nb.cells[7]
    problems = _problems(nblint.rule_code_cells, path, nb) + _problems(nblint.rule_markdown_before_code, path, nb)
    assert any("4 lines" in p for p in problems)
    assert any("no markdown" in p for p in problems)


def test_linter_flags_a_changed_setup_cell_and_missing_licence():
    path, nb = _good()
    nb.cells[2].source = nb.cells[2].source.replace("v0.1.0", "v0.0.9")
    assert _problems(nblint.rule_setup_cells, path, nb)
    nb.cells[0].source = nb.cells[0].source.replace("`demo-speech.wav`", "the speech")
    assert _problems(nblint.rule_media_licences, path, nb) == [
        "the licence line does not name demo-speech.wav"]


def test_linter_flags_untagged_timing_cells_and_missing_final_check():
    path, nb = _good()
    for cell in nb.cells:
        cell.metadata.pop("tags", None) if "plot_timings" in cell.source else None
    nb.cells = nb.cells[:-1]
    assert _problems(nblint.rule_ignored_outputs, path, nb)
    assert _problems(nblint.rule_final_check, path, nb)


def test_linter_flags_non_canonical_json():
    path, nb = _good()
    import json

    text = json.dumps(json.loads(nbformat.writes(nb)), indent=2) + "\n"  # indent 2: not what nbformat writes
    assert nblint.rule_canonical(path, nb, text)


def test_sentence_counter():
    assert nblint._sentences("You run it. Then you look, e.g. at `a.b`.") == 2
    assert nblint._sentences("You choose *Runtime > Restart session* and run it again!") == 1
