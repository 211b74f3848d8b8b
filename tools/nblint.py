#!/usr/bin/env python
"""The workbook's notebook linter (STYLE.md §14-15): the rules every notebook in notebooks/ keeps.

    python tools/nblint.py                 # lint every notebook; exit 1 on a problem
    python tools/nblint.py notebooks/x.ipynb

tests/test_notebooks_lint.py runs the same rules as tests. Each rule is a function ``rule(path, nb, text) ->
list[str]`` returning problems in words; :data:`RULES` lists them.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
EXPECTED = ("00_setup", "01_weights", "02_media", "03_avatar", "04_lipsync", "05_realtime", "06_inside_musetalk",
            "quickstart")

MAX_CODE_LINES = 3  # lines of a code cell (STYLE.md §3: cells of 1-3 lines)
MAX_SETUP_LINES = 4  # lines of the setup cell: plain Python a newcomer reads (no `;`, no magics, no get_ipython)
MAX_SENTENCES = 3  # sentences of the markdown before a code cell ("one or two", a third for a needed remark)
# Code cells allowed more than MAX_CODE_LINES lines, as (notebook, first line) -> justification. Keep it short.
LONG_CELLS: dict[tuple[str, str], str] = {}

# Functions whose use means the notebook shows media files, so it needs the licence line.
MEDIA_CALLS = ("workbook_inputs", "sample_audios", "demo_inputs", "upload(")
LICENCE_MARK = "**Media licences:**"
MEDIA_FILES = ("astronaut.png", "demo-speech.wav", "face-sing-576x768-25fps.mp4", "speech-en-short.wav",
               "sing-44k1-mono.wav")
FIRST_PERSON_PLURAL = re.compile(r"\b(we|we're|we've|we'll|we'd|us|our|ours|ourselves|let's)\b", re.IGNORECASE)
SECOND_PERSON = re.compile(r"\b(you|your|yours|yourself)\b", re.IGNORECASE)
IGNORE_TAG = "nbval-ignore-output"
# What a code cell may take from nbhelpers.env: the run mode and the inputs. Everything else a cell needs is the
# public API (the pipeline object, nbhelpers.workbook for where things go, ui, media, weights...).
ENV_ALLOWED = ("run_mode", "workbook_inputs", "upload", "sample_audios")
ENV_USE = re.compile(r"\benv\.(\w+)")
TIMING_CALLS = ("plot_timings", "fps_table", "install_missing(", ".plan(", "lipsync(", ".generate(",
                "prepare_avatar(", ".download(", "check_mmcv_wheels(", "install_mmpose(")


def _code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def _badge(name: str, org_repo: str) -> str:
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{org_repo}/blob/main/notebooks/{name}.ipynb)")


def _org_repo() -> str:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import make_notebooks

        return make_notebooks.ORG_REPO
    finally:
        sys.path.pop(0)


def _setup_cells() -> tuple[str, str]:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import make_notebooks

        return make_notebooks.SETUP_CELL, make_notebooks.MODE_CELL
    finally:
        sys.path.pop(0)


# ---------------------------------------------------------------------------------------------------- rules


def rule_canonical(path: Path, nb, text: str) -> list[str]:
    """The file is exactly what nbformat writes (indent 1, sorted keys, trailing newline) and is valid."""
    problems = []
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        problems.append(f"not a valid nbformat 4 notebook: {exc.message}")
    if text != nbformat.writes(nb) + "\n":
        problems.append("not canonical JSON: regenerate with python tools/make_notebooks.py")
    return problems


def rule_no_outputs(path: Path, nb, text: str) -> list[str]:
    """No outputs and no execution counts are committed."""
    return [f"code cell {i} has outputs or an execution count: strip them"
            for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]


def rule_single_h1_and_badge(path: Path, nb, text: str) -> list[str]:
    """One H1, on the first line of the first cell, followed by the notebook's own Colab badge."""
    problems = []
    h1 = [line for c in nb.cells if c.cell_type == "markdown"
          for line in c.source.splitlines() if re.match(r"^#\s", line)]
    if len(h1) != 1:
        problems.append(f"expected exactly one H1 heading, found {len(h1)}: {h1}")
    first = nb.cells[0] if nb.cells else None
    if first is None or first.cell_type != "markdown" or not first.source.startswith("# "):
        return problems + ["the first cell must be markdown starting with the H1 title"]
    lines = [line for line in first.source.splitlines()[1:] if line.strip()]
    if not lines or lines[0].strip() != _badge(path.stem, _org_repo()):
        problems.append(f"the line after the H1 must be the Colab badge of {path.stem}.ipynb")
    return problems


def rule_setup_cells(path: Path, nb, text: str) -> list[str]:
    """The first code cell is the setup cell (<= MAX_SETUP_LINES plain lines: no `;`, no magics, no
    get_ipython) and the second the run-mode cell, the same everywhere."""
    setup, mode = _setup_cells()
    code = _code_cells(nb)
    problems = []
    if len(setup.splitlines()) > MAX_SETUP_LINES:
        problems.append(f"the setup cell has more than {MAX_SETUP_LINES} lines")
    problems += [f"the setup cell is not plain Python: {why}" for why in _not_plain(setup)]
    if not code or code[0].source != setup:
        problems.append("the first code cell must be the common setup cell (tools/make_notebooks.py SETUP_CELL)")
    if len(code) < 2 or code[1].source != mode:
        problems.append("the second code cell must be the common run-mode cell (MODE_CELL)")
    return problems


def _not_plain(source: str) -> list[str]:
    """What keeps ``source`` from being plain Python a newcomer reads: statements chained with `;`, IPython
    magics or shell lines, get_ipython()."""
    import io
    import tokenize

    why = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    if any(t.type == tokenize.OP and t.string == ";" for t in tokens):
        why.append("statements chained with ';'")
    if any(line.lstrip().startswith(("%", "!")) for line in source.splitlines()):
        why.append("an IPython magic or shell line")
    if "get_ipython" in source:
        why.append("get_ipython()")
    return why


def rule_parameters(path: Path, nb, text: str) -> list[str]:
    """Exactly one cell tagged ``parameters`` (papermill), holding assignments only."""
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        return [f"expected one cell tagged 'parameters', found {len(tagged)}"]
    tree = ast.parse(tagged[0].source)
    if not all(isinstance(node, ast.Assign) for node in tree.body):
        return ["the parameters cell must hold plain assignments only (papermill overrides them)"]
    return []


def rule_code_cells(path: Path, nb, text: str) -> list[str]:
    """Code cells parse, are at most MAX_CODE_LINES lines (or justified in LONG_CELLS) and never touch Colab APIs
    directly (nbhelpers.env wraps them so that they are no-ops elsewhere)."""
    problems = []
    setup, _ = _setup_cells()
    for i, c in enumerate(_code_cells(nb)):
        if c.source == setup:
            continue  # rule_setup_cells
        try:
            ast.parse(c.source)
        except SyntaxError as exc:
            problems.append(f"code cell {i} does not parse: {exc}")
        lines = [line for line in c.source.splitlines() if line.strip()]
        key = (path.stem, lines[0] if lines else "")
        if len(lines) > MAX_CODE_LINES and key not in LONG_CELLS:
            problems.append(f"code cell {i} has {len(lines)} lines (max {MAX_CODE_LINES}; justify an exception in "
                            f"tools/nblint.py LONG_CELLS): {lines[0]!r}")
        if "google.colab" in c.source and c.source != setup:
            problems.append(f"code cell {i} uses google.colab directly: go through nbhelpers.env")
        if "import *" in c.source:
            problems.append(f"code cell {i} star-imports")
    return problems


def rule_markdown_before_code(path: Path, nb, text: str) -> list[str]:
    """Each code cell follows a markdown cell of 1-3 sentences that speaks to the reader (second person)."""
    problems = []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        before = nb.cells[i - 1] if i else None
        if before is None or before.cell_type != "markdown":
            problems.append(f"cell {i} ({c.source.splitlines()[0]!r}) has no markdown right before it")
            continue
        prose = _prose(before.source)
        n = _sentences(prose)
        if not 1 <= n <= MAX_SENTENCES:
            problems.append(f"the markdown before cell {i} has {n} sentences of prose (want 1-{MAX_SENTENCES})")
        if not SECOND_PERSON.search(prose):
            problems.append(f"the markdown before cell {i} does not speak to the reader ('you', 'your')")
    return problems


def _prose(source: str) -> str:
    """Markdown text without headings, the badge and the licence line."""
    keep = [line for line in source.splitlines()
            if line.strip() and not line.startswith("#") and not line.startswith("[![")
            and not line.startswith(LICENCE_MARK)]
    return " ".join(keep)


def _sentences(prose: str) -> int:
    text = re.sub(r"`[^`]*`", "x", prose)  # code spans may hold dots
    text = re.sub(r"\b(e\.g|i\.e|etc|vs)\.", r"\1", text)
    return len(re.findall(r"[.!?](?=\s|$)", text))


def rule_no_we(path: Path, nb, text: str) -> list[str]:
    """Markdown speaks to the reader: no 'we', 'us', 'our', 'let's'."""
    problems = []
    for i, c in enumerate(nb.cells):
        if c.cell_type == "markdown":
            for match in FIRST_PERSON_PLURAL.finditer(re.sub(r"`[^`]*`", "", c.source)):
                problems.append(f"markdown cell {i} says {match.group(0)!r}: write to the reader ('you')")
    return problems


def rule_media_licences(path: Path, nb, text: str) -> list[str]:
    """A notebook that shows media has a licence line naming every media file it may use."""
    code = "\n".join(c.source for c in _code_cells(nb))
    if not any(call in code for call in MEDIA_CALLS):
        return []
    lines = [line for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
             if line.startswith(LICENCE_MARK)]
    if not lines:
        return [f"the notebook uses media but has no '{LICENCE_MARK}' line"]
    missing = [name for name in MEDIA_FILES if not any(name in line for line in lines)]
    return [f"the licence line does not name {', '.join(missing)}"] if missing else []


def rule_ignored_outputs(path: Path, nb, text: str) -> list[str]:
    """Cells whose output is a progress bar, a timing or machine-dependent are tagged nbval-ignore-output."""
    return [f"cell {i} ({c.source.splitlines()[0]!r}) shows timings or progress: tag it {IGNORE_TAG}"
            for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and any(call in c.source for call in TIMING_CALLS)
            and IGNORE_TAG not in c.metadata.get("tags", [])]


def rule_final_check(path: Path, nb, text: str) -> list[str]:
    """The last code cell checks that this run produced its result (nbhelpers.workbook.check), or, in the setup
    notebook, that the runtime is ready (nbhelpers.workbook.check_setup)."""
    code = _code_cells(nb)
    if not code or not any(call in code[-1].source for call in ("workbook.check(", "workbook.check_setup(")):
        return ["the last code cell must call nbh.workbook.check(...) on this run's result "
                "(nbh.workbook.check_setup(...) in a setup notebook)"]
    return []


def rule_env_only_mode_and_inputs(path: Path, nb, text: str) -> list[str]:
    """Code cells take only the run mode and the inputs from nbhelpers.env (ENV_ALLOWED); the rest is the public
    API, so that a cell shows what the library does rather than the workbook's plumbing."""
    return [f"code cell {i} uses env.{name}: cells take only {', '.join(ENV_ALLOWED)} from env; use the public API "
            "(nbh.workbook for where things go, the pipeline object for the work)"
            for i, c in enumerate(_code_cells(nb)) for name in ENV_USE.findall(c.source) if name not in ENV_ALLOWED]


def rule_kernel(path: Path, nb, text: str) -> list[str]:
    """The kernel is python3 (Colab and nbval --nbval-current-env)."""
    spec = nb.metadata.get("kernelspec", {})
    return [] if spec.get("name") == "python3" else [f"kernelspec name is {spec.get('name')!r}, want 'python3'"]


RULES = [rule_canonical, rule_no_outputs, rule_single_h1_and_badge, rule_setup_cells, rule_parameters,
         rule_code_cells, rule_markdown_before_code, rule_no_we, rule_media_licences, rule_ignored_outputs,
         rule_final_check, rule_env_only_mode_and_inputs, rule_kernel]


def lint(path: Path) -> list[str]:
    """Every problem of one notebook, each prefixed with the rule's name."""
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    return [f"{rule.__name__}: {p}" for rule in RULES for p in rule(path, nb, text)]


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    failed = 0
    for path in paths:
        for problem in lint(path):
            print(f"{path}: {problem}")
            failed += 1
    print(f"{len(paths)} notebooks, {failed} problems")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
