"""Verification: the weights folder checked against the manifest, with a fix for every bad file.

An unverified fact never makes a "mismatch". Facts the hub gave at download and cached sha256 results (keyed by
size and modification time) live in ``<weights dir>/.nbhelpers-weights.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError, WeightsError, plural
from ..hashing import atomic_path, sha256_file
from .inspect import (
    _FORMAT_BY_SUFFIX,
    BAD_STATES,
    HASH_MISMATCH,
    HTML_PAGE,
    LFS_POINTER,
    MISSING,
    OK,
    TRUNCATED,
    UNVERIFIABLE,
    WRONG_SIZE,
    inspect_file,
)
from .manifest import (
    DEFAULT_SETS,
    DOWNLOAD_COMMAND,
    MANIFEST,
    NOTEBOOK,
    STATE_FILE,
    TINY_MARKER,
    TRY_TINY,
    Manifest,
    WeightFile,
    _human,
    _Report,
    default_dir,
    is_tiny,
    missing_files,
    required_files,
    resolve_dir,
)


class _State:
    """``<weights dir>/.nbhelpers-weights.json``: hub facts recorded at download and sha256 results cached by (size,
    mtime). Writing is best effort, so a read-only shared folder still verifies."""

    def __init__(self, directory: Path):
        self.path = directory / STATE_FILE
        self.changed = False
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.files: dict[str, dict[str, Any]] = dict(data.get("files", {}))
        except (OSError, ValueError, AttributeError):
            self.files = {}

    def cached_sha256(self, rel: str, st: os.stat_result) -> str | None:
        rec = self.files.get(rel, {})
        return rec.get("sha256") if (rec.get("size"), rec.get("mtime_ns")) == (st.st_size, st.st_mtime_ns) else None

    def record_sha256(self, rel: str, st: os.stat_result, sha: str) -> None:
        self.files.setdefault(rel, {}).update(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha)
        self.changed = True

    def record_facts(self, rel: str, size: int | None, sha: str | None, source: str) -> None:
        self.files.setdefault(rel, {}).update(expected_size=size, expected_sha256=sha, facts_from=source)
        self.changed = True

    def facts(self, rel: str) -> tuple[int | None, str | None, str]:
        rec = self.files.get(rel, {})
        return rec.get("expected_size"), rec.get("expected_sha256"), rec.get("facts_from", "")

    def save(self) -> None:
        if not self.changed:
            return
        with contextlib.suppress(OSError):
            with atomic_path(self.path) as tmp:
                tmp.write_text(json.dumps({"version": 1, "files": self.files}, indent=1, sort_keys=True),
                               encoding="utf-8")
            self.changed = False


@dataclasses.dataclass(frozen=True)
class Expected:
    """What is known of one file of a weights dir: ``size`` and ``sha256`` from verified sources (or None), their
    ``source``, and an ``unverified_sha256`` shown but never used to reject."""

    size: int | None
    sha256: str | None
    source: str
    unverified_sha256: str | None = None


def expected_facts(directory: str | os.PathLike, name: str) -> Expected:
    """The :class:`Expected` size and sha256 of file ``name`` of ``directory``: verified manifest values, then the
    hub's at download; what ``models.load_checkpoint`` needs to allow a full unpickle. InputError for an unknown name.
    """
    entry = MANIFEST.get(name)
    rel = name if name in (entry.path, *entry.alternates) else entry.path
    return _expected(entry, rel, _State(Path(directory)))


def _expected(entry: WeightFile, rel: str, state: _State) -> Expected:
    size = sha = unverified = None
    sources = []
    if rel == entry.path:
        if entry.size is not None and entry.size.verified:
            size = int(entry.size.value)
            sources.append(f"manifest ({entry.size.source})")
        if entry.sha256 is not None:
            if entry.sha256.verified:
                sha = str(entry.sha256.value)
                sources.append(f"manifest ({entry.sha256.source})")
            else:
                unverified = str(entry.sha256.value)
    rec_size, rec_sha, rec_from = state.facts(rel)
    if size is None and rec_size is not None:
        size = int(rec_size)
        sources.append(rec_from)
    if sha is None and rec_sha:
        sha = str(rec_sha)
        if rec_from not in sources:
            sources.append(rec_from)
    return Expected(size, sha, "; ".join(s for s in sources if s), unverified)


@dataclasses.dataclass(frozen=True)
class FileCheck:
    """The verdict on the manifest file ``name`` at layout ``path`` (the primary one or the alternate on disk):
    ``size`` in bytes (None when missing), the ``expected`` size as text, its ``state`` (one of
    :mod:`nbhelpers.weights.inspect`'s), the ``detail`` checked or found, and the ``fix`` ("" when none is needed)."""

    name: str
    path: str
    size: int | None
    expected: str
    state: str
    detail: str
    fix: str = ""

    @property
    def bad(self) -> bool:
        """True when the file is missing or damaged."""
        return self.state in BAD_STATES


_STATE_COLOURS = {OK: "", UNVERIFIABLE: "background:#fff8e1"}


@dataclasses.dataclass(frozen=True)
class VerifyReport(_Report):
    """The result of :func:`verify`: one :class:`FileCheck` per file in ``checks`` for the weights dir ``directory``,
    whether sha256 values were computed (``deep``) and whether it holds ``tiny`` test weights."""

    directory: Path
    checks: tuple[FileCheck, ...]
    deep: bool = False
    tiny: bool = False

    @property
    def ok(self) -> bool:
        """True when no file is missing or damaged ("unverifiable" counts as usable)."""
        return not self.problems

    @property
    def problems(self) -> tuple[FileCheck, ...]:
        """The rows that are missing or damaged."""
        return tuple(c for c in self.checks if c.bad)

    def raise_for_problems(self) -> None:
        """Raise :class:`WeightsError` naming every bad file and its fix; do nothing when all are usable."""
        if self.problems:
            lines = [f"{len(self.problems)} weight file(s) under {self.directory} are not usable:"]
            lines += [f"  {c.path}: {c.state} - {c.detail}. Fix: {c.fix}" for c in self.problems]
            raise WeightsError("\n".join(lines))

    def _summary(self) -> str:
        kind = " (tiny random test weights)" if self.tiny else ""
        verdict = "all usable" if self.ok else f"{len(self.problems)} problem(s)"
        how = ("checked sizes, contents and sha256" if self.deep else
               "checked sizes and contents; sha256 not computed (--deep, or deep=True in Python, computes it)")
        return f"{self.directory}{kind}: {plural(len(self.checks), 'file')}, {verdict}; {how}"

    _HEADERS = ("file", "size", "expected", "state", "detail", "fix")

    def _rows(self) -> list[list[str]]:
        return [[c.path, _human(c.size), c.expected, c.state, c.detail, c.fix] for c in self.checks]

    def _styles(self) -> list[str]:
        return [_STATE_COLOURS.get(c.state, "background:#fde0dc") for c in self.checks]


def _weights_arg(root: Path) -> str:
    """`` --weights <root>`` for the download command, "" when ``root`` is :func:`default_dir`."""
    try:
        here = root.expanduser().resolve() == default_dir().expanduser().resolve()
    except OSError:
        here = False
    return "" if here else f" --weights {shlex.quote(str(root))}"


def _fix(entry: WeightFile, state: str, rel: str, root: Path) -> str:
    sets = "" if set(entry.sets) & set(DEFAULT_SETS) else f" --sets {entry.sets[0]}"
    cmd = f"`{DOWNLOAD_COMMAND}{_weights_arg(root)}{sets}` (or {NOTEBOOK})"
    if state == MISSING:
        return f"download it: {cmd}"
    if state == LFS_POINTER:
        return f"the folder was cloned without git-lfs; delete {rel} and run {cmd}, or `git lfs pull` in the clone"
    if state == HTML_PAGE:
        return (f"the server sent a web page (a quota, login or virus-scan page); delete {rel} and run {cmd}, "
                f"or fetch {entry.sources[0].address()} in a browser and save it as {rel}")
    return f"delete {rel} and download it again: {cmd} (download() also replaces bad files itself)"


def _check(entry: WeightFile, root: Path, state: _State, deep: bool) -> FileCheck:
    rel = next((p for p in (entry.path, *entry.alternates) if (root / p).is_file()), None)
    if rel is None:
        return FileCheck(entry.name, entry.path, None, entry.expected_text(), MISSING,
                         "not in the folder" + (f" (nor {', '.join(entry.alternates)})" if entry.alternates else ""),
                         _fix(entry, MISSING, entry.path, root))
    path = root / rel
    st = path.stat()
    exp = _expected(entry, rel, state)
    expected_text = (f"{_human(exp.size)} ({exp.source})" if exp.size is not None
                     else (entry.expected_text() if rel == entry.path else "unknown"))

    def found(verdict: str, detail: str, fix: str | None = None) -> FileCheck:
        fix = _fix(entry, verdict, rel, root) if fix is None else fix
        return FileCheck(entry.name, rel, st.st_size, expected_text, verdict, detail, fix)

    insp = inspect_file(path, _FORMAT_BY_SUFFIX.get(Path(rel).suffix.lower(), entry.format))
    if insp.bad:
        return found(insp.state, insp.detail)
    notes = [insp.detail]
    proven = insp.state == OK
    if exp.size is not None:
        if st.st_size != exp.size:
            return found(TRUNCATED if st.st_size < exp.size else WRONG_SIZE,
                         f"{st.st_size} bytes, expected {exp.size} ({exp.source})")
        notes.append("size matches")
        proven = True
    want_hash = exp.sha256 or exp.unverified_sha256 or (entry.sha256_prefix is not None and rel == entry.path)
    if deep and want_hash:
        sha = state.cached_sha256(rel, st)
        if sha is None:
            sha = sha256_file(path, desc=rel)
            state.record_sha256(rel, st, sha)
        if exp.sha256:
            if sha != exp.sha256:
                return found(HASH_MISMATCH, f"sha256 {sha[:16]}... but {exp.source} says {exp.sha256[:16]}...")
            notes.append(f"sha256 matches ({exp.source})")
            proven = True
        elif exp.unverified_sha256:
            same = sha == exp.unverified_sha256
            notes.append(f"sha256 {'matches' if same else 'differs from'} the unverified value "
                         f"({entry.sha256.source if entry.sha256 else ''})")
        if entry.sha256_prefix is not None and rel == entry.path:
            same = sha.startswith(str(entry.sha256_prefix.value))
            notes.append(f"sha256 {'starts' if same else 'does not start'} with {entry.sha256_prefix.value} "
                         f"({entry.sha256_prefix.source}, unverified)")
    elif want_hash:
        notes.append("sha256 not computed (deep=False)")
    if proven:
        return found(OK, "; ".join(notes), "")
    return found(UNVERIFIABLE, "; ".join(notes), "nothing known to check it against; it will be used as it is")


def verify(directory: str | os.PathLike | None = None, sets: str | Sequence[str] | None = None,
           files: str | Sequence[str] | None = None, deep: bool = False, manifest: Manifest = MANIFEST) -> VerifyReport:
    """Check the weight files of the weights dir ``directory`` (``~`` expanded; None: :func:`default_dir`): presence,
    size, contents and with ``deep`` sha256 where a value is known (cached for the next call). Downloads nothing.
    ``sets`` None checks the v1.5 inference set plus any other manifest file present; ``files`` adds names or layout
    paths. InputError for an unknown set or file name."""
    root = resolve_dir(directory)
    chosen = manifest.select(sets, files)
    if sets is None and files is None:
        names = {e.name for e in chosen}
        chosen = [e for e in manifest if e.name in names or any((root / p).is_file() for p in (e.path, *e.alternates))]
    state = _State(root)
    checks = tuple(_check(e, root, state, deep) for e in chosen)
    state.save()
    return VerifyReport(root, checks, deep=deep, tiny=is_tiny(root))


# Weight sets each landmark backend opens (faces/registry.py NEEDS_WEIGHTS, by set name); dlib and boxes need none.
_LANDMARK_SETS = {"dwpose": ("faces", "s3fd"), "dwpose-onnx": ("faces-onnx", "s3fd"),
                  "mmpose": ("faces-mmpose", "s3fd")}
# The modules that make "auto" try a backend (faces/registry.py AUTO_ORDER), in its order.
_AUTO_ORDER = (("mmpose", "mmpose"), ("dwpose", "torch"), ("dwpose-onnx", "onnxruntime"))


def _auto_landmark_sets(root: Path) -> tuple[str, ...]:
    """The sets the ``"auto"`` landmark choice would open, found without importing; () when it would use dlib."""
    for backend, module in _AUTO_ORDER:
        try:
            installed = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            installed = False
        if installed and not missing_files(root, [e.path for e in MANIFEST.select(_LANDMARK_SETS[backend])]):
            return _LANDMARK_SETS[backend]
    return ()


def job_files(version: str = "v15", landmark_backend: str = "auto", *, parsing: bool = True,
              directory: str | os.PathLike | None = None) -> list[WeightFile]:
    """The manifest entries a lip-sync job or avatar of ``version`` opens, in manifest order: BiSeNet with
    ``parsing``, and the files of ``landmark_backend`` (``"auto"``: the automatic choice's, predicted from the
    weights dir ``directory`` when given). InputError for an unknown version or landmark backend."""
    paths = required_files(version, parsing=parsing)  # raises InputError for an unknown version
    if landmark_backend == "auto":
        sets = _auto_landmark_sets(Path(directory)) if directory is not None else ()
    elif landmark_backend in (*_LANDMARK_SETS, "dlib", "boxes"):
        sets = _LANDMARK_SETS.get(landmark_backend, ())
    else:
        raise InputError(f"landmark_backend must be one of 'auto', 'dwpose', 'dwpose-onnx', 'mmpose', 'dlib', "
                         f"'boxes'; got {landmark_backend!r}.")
    names = {MANIFEST.get(rel).name for rel in paths} | {e.name for e in MANIFEST.select(sets)}
    return [e for e in MANIFEST if e.name in names]


def check_folder(directory: str | os.PathLike | None) -> Path:
    """The weights folder ``directory`` (None: :func:`default_dir`), ``~`` expanded. WeightsError when it does not
    exist (the message gives the download command into it); InputError when it is a file."""
    root = resolve_dir(directory)
    if root.is_dir():
        return root
    where = "(--weights DIR, weights_dir=, or the NBHELPERS_WEIGHTS environment variable)"
    if root.exists():
        raise InputError(f"the weights folder {str(root)!r} is a file, not a folder. Give the folder that holds "
                         f"the weight files {where}.")
    raise WeightsError(
        f"the weights folder {str(root)!r} does not exist. Download the weights into it with "
        f"`{DOWNLOAD_COMMAND}{_weights_arg(root)}` (or {NOTEBOOK}), or point the job at the folder that holds them "
        f"{where}. " + TRY_TINY)


def check_job_files(directory: str | os.PathLike | None, version: str = "v15", landmark_backend: str = "auto", *,
                    parsing: bool = True) -> VerifyReport:
    """Check every weight file a job will open (:func:`job_files`) without hashing, before any frame is decoded;
    returns the :class:`VerifyReport` (``directory`` None: :func:`default_dir`). Raises WeightsError when the folder
    does not exist or files are missing or unusable (one error names each, what is wrong, and the download command
    for that folder and those sets); InputError for a folder that is a file, or an unknown version or backend."""
    root = check_folder(directory)
    weights_arg = _weights_arg(root)
    report = verify(root, files=[e.name for e in job_files(version, landmark_backend, parsing=parsing, directory=root)])
    if report.ok:
        return report
    bad = report.problems
    lines = [f"{len(bad)} weight file(s) this job needs under {root} are not usable (checked before any frame is "
             "read):"]
    lines += [f"  {c.path}: {c.state} - {c.detail}" for c in bad]
    sets = dict.fromkeys(MANIFEST.get(c.name).sets[0] for c in bad)
    if (made := _tiny_made(root)) is not None and all(c.state == MISSING and c.path not in made[1] for c in bad):
        made_for = ", ".join(made[0]) or "no version"
        lines.append(f"{root} holds tiny random test weights made for {made_for} only, so it has none of these files; "
                     "downloading into it would mix real and random weights. Run it with a version it was made for "
                     f"({made_for}), or download the real weights into a folder of their own with `{DOWNLOAD_COMMAND} "
                     f"--weights DIR --sets {' '.join(sets)}` (or {NOTEBOOK}) and point the job at it (--weights DIR, "
                     "weights_dir=, NBHELPERS_WEIGHTS).")
        raise _with_report(WeightsError("\n".join(lines)), report)
    notes = [note for state, note in (
        (LFS_POINTER, "git-lfs pointers mean the folder was cloned without git-lfs (`git lfs pull` in the clone also "
                      "fixes them)"),
        (HTML_PAGE, "a web page was saved instead of the file (a quota, login or virus-scan page)"),
    ) if state in {c.state for c in bad}]
    lines.append(f"Fix: run `{DOWNLOAD_COMMAND}{weights_arg} --sets {' '.join(sets)}` (or {NOTEBOOK}): it "
                 "replaces bad files and fetches missing ones in that folder; or point the job at a folder that "
                 "holds good copies (--weights DIR, weights_dir=, NBHELPERS_WEIGHTS)."
                 + (f" Note: {'; '.join(notes)}." if notes else "") + " " + TRY_TINY)
    raise _with_report(WeightsError("\n".join(lines)), report)


def _with_report(error: WeightsError, report: VerifyReport) -> WeightsError:
    """``error`` carrying the :class:`VerifyReport` it was made from (``error.report``)."""
    error.report = report  # type: ignore[attr-defined]
    return error


def _tiny_made(root: Path) -> tuple[list[str], set[str]] | None:
    """(versions, relative file paths) that ``make_tiny_weights`` wrote into ``root``, from its ``tiny.json``;
    None for a folder of real weights or a marker that cannot be read as one."""
    if not is_tiny(root):
        return None
    try:
        marker = json.loads((root / TINY_MARKER).read_text(encoding="utf-8"))
        return [str(v) for v in marker["versions"]], {str(f) for f in marker["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
