"""The notebook linter as tests: every rule of tools/nblint.py over every notebook, plus the linter's own checks.

The rules (STYLE.md §14-15): canonical JSON without outputs, one H1 then the Colab badge, the common setup cell
(at most 4 plain lines) and run-mode cell, one ``parameters`` cell, code cells of at most 3 lines, a sentence or two
of second-person markdown before each code cell, no "we", a licence line naming each media file, timing cells
tagged for nbval, ``env`` used for the run mode and inputs only, and a final ``nbh.workbook.check`` cell. The
notebooks must also be exactly what tools/make_notebooks.py writes from their jupytext sources
(notebooks/src/*.py), and the sources exactly what jupytext writes back.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest
from helpers import ROOT

nbformat = pytest.importorskip("nbformat")

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


@pytest.mark.parametrize("name", make_notebooks.BOOK)
def test_committed_notebook_is_what_the_generator_writes(name):
    path = ROOT / "notebooks" / f"{name}.ipynb"
    assert path.read_text(encoding="utf-8") == make_notebooks.render(name), (
        f"{path.name} differs from notebooks/src/{name}.py: edit the source and run python tools/make_notebooks.py")


def test_setup_cell_is_identical_short_and_plain():
    firsts = {nbformat.read(p, as_version=4).cells[2].source for p in NOTEBOOKS}
    assert firsts == {make_notebooks.SETUP_CELL}
    assert len(make_notebooks.SETUP_CELL.splitlines()) <= 4
    assert nblint._not_plain(make_notebooks.SETUP_CELL) == []
    # On Colab it installs the pinned ref with its [colab] extra in one pip call; it never names torch as a
    # package and fetches nothing else by address (00_setup read requirements-colab.txt from GitHub: offline it
    # failed).
    assert f'"musetalk-workbook[colab] @ git+{make_notebooks.REPO}@{make_notebooks.REF}"' in make_notebooks.SETUP_CELL
    assert "raw/" not in make_notebooks.SETUP_CELL and " -r " not in make_notebooks.SETUP_CELL
    assert "install torch" not in make_notebooks.SETUP_CELL and '"torch' not in make_notebooks.SETUP_CELL


def test_the_ref_the_setup_cell_installs_exists_and_agrees_with_the_version():
    """Every notebook installs make_notebooks.REF; a release tag there must be ``v<package version>``, and the ref
    must exist in this repository (the cell installed a tag v0.1.0 the repository never had: it failed on Colab)."""
    import subprocess

    import nbhelpers

    ref = make_notebooks.REF
    for path in NOTEBOOKS:
        assert f'musetalk-workbook@{ref}"' in nbformat.read(path, as_version=4).cells[2].source, path.name
    if ref.startswith("v") and ref[1:2].isdigit():
        assert ref == f"v{nbhelpers.__version__}", "the pinned release tag is not the package's version"
    root = Path(make_notebooks.__file__).resolve().parents[1]
    refs = subprocess.run(["git", "-C", str(root), "for-each-ref", "--format=%(refname)"], capture_output=True,
                          text=True)
    if refs.returncode != 0 or not refs.stdout.strip():
        pytest.skip("not a git checkout with refs (an sdist or a detached shallow clone)")
    names = refs.stdout.split()
    assert (f"refs/tags/{ref}" in names or f"refs/heads/{ref}" in names
            or any(n.startswith("refs/remotes/") and n.endswith(f"/{ref}") for n in names)), \
        f"the notebooks install {ref!r}, which is no tag or branch of this repository"


def _run_setup_cell(monkeypatch, colab: bool) -> list:
    """Execute the setup cell as a kernel would (IPython's transforms applied), with subprocess.run recorded."""
    pytest.importorskip("IPython")
    import subprocess

    from IPython.core.inputtransformer2 import TransformerManager

    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: calls.append((args, kwargs)))
    if colab:
        monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    source = TransformerManager().transform_cell(make_notebooks.SETUP_CELL)
    exec(compile(source, "<setup cell>", "exec"), {})
    return calls


def test_setup_cell_does_nothing_outside_colab(monkeypatch):
    assert _run_setup_cell(monkeypatch, colab=False) == []


def test_setup_cell_installs_on_colab(monkeypatch):
    """In Colab the same cell runs pip of the kernel's own Python once, with the pinned git URL."""
    calls = _run_setup_cell(monkeypatch, colab=True)
    repo, tag = make_notebooks.REPO, make_notebooks.REF
    assert calls == [(([sys.executable, "-m", "pip", "install", "-q",
                        f"musetalk-workbook[colab] @ git+{repo}@{tag}"],), {"check": True})]


def test_run_mode_cell_reports_the_runtime(monkeypatch):
    """The second cell imports the package, reads the run mode and ends with the setup report."""
    monkeypatch.setenv("NBHELPERS_MODE", "ci")
    namespace = {}
    *body, last = make_notebooks.MODE_CELL.splitlines()
    exec(compile("\n".join(body), "<mode cell>", "exec"), namespace)
    report = eval(last.split("#")[0], namespace)
    assert namespace["MODE"] == "ci" and report.mode == "ci"


@pytest.mark.parametrize("name", make_notebooks.BOOK)
def test_source_is_what_jupyter_saves(name):
    """A source is in jupytext's own form: opening it in Jupyter and saving it changes no byte."""
    jupytext = pytest.importorskip("jupytext")
    path = make_notebooks.source_path(name)
    text = path.read_text(encoding="utf-8")
    nb = jupytext.reads(text, fmt=make_notebooks.FORMAT)
    nb.metadata = dict(make_notebooks.SOURCE_METADATA)
    assert jupytext.writes(nb, fmt=make_notebooks.FORMAT) == text


def test_generator_is_byte_stable_and_refuses_a_changed_setup_cell(tmp_path, monkeypatch):
    first = make_notebooks.render("04_lipsync")
    assert make_notebooks.render("04_lipsync") == first
    source = make_notebooks.source_path("04_lipsync").read_text(encoding="utf-8")
    monkeypatch.setattr(make_notebooks, "SOURCES", tmp_path)
    (tmp_path / "04_lipsync.py").write_text(source.replace(f"@{make_notebooks.REF}\"", "@v0.0.9\""), encoding="utf-8")
    with pytest.raises(make_notebooks.SourceError, match="SETUP_CELL"):
        make_notebooks.render("04_lipsync")
    with pytest.raises(make_notebooks.SourceError, match="missing"):
        make_notebooks.render("01_weights")


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
    nb.cells[2].source = nb.cells[2].source.replace(f"@{make_notebooks.REF}\"", "@v0.0.9\"")
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


def test_linter_flags_env_plumbing_and_unplain_setup():
    path, nb = _good()
    nb.cells[8].source = "WEIGHTS = env.weights_dir(MODE)\nvideo, audio = nbh.env.workbook_inputs(MODE)"
    assert _problems(nblint.rule_env_only_mode_and_inputs, path, nb) == [
        "code cell 3 uses env.weights_dir: cells take only run_mode, workbook_inputs, upload, sample_audios from "
        "env; use the public API (nbh.workbook for where things go, the pipeline object for the work)"]
    assert nblint._not_plain("import sys; x = 1") == ["statements chained with ';'"]
    assert nblint._not_plain('get_ipython().run_line_magic("pip", "x")') == ["get_ipython()"]
    assert nblint._not_plain('s = "a; b"\n%pip install x') == ["an IPython magic or shell line"]


def test_sentence_counter():
    assert nblint._sentences("You run it. Then you look, e.g. at `a.b`.") == 2
    assert nblint._sentences("You choose *Runtime > Restart session* and run it again!") == 1
