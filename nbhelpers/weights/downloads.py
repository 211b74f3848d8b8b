"""Downloads that survive real networks: sources in order, retries, staging, and acceptance only once verified.

Each source (the hub through ``huggingface_hub``, Google Drive through ``gdown``, plain HTTP) is tried up to
:data:`ATTEMPTS_PER_SOURCE` times, resuming; a file is renamed into place only after its checks. ``HF_ENDPOINT``,
``HF_TOKEN`` (never sent to a mirror) and ``HF_HUB_OFFLINE`` are honoured; partial files live in
``<weights dir>/.nbhelpers-downloads/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.resources
import os
import re
import shutil
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import progress
from ..errors import InputError, NbHelpersWarning, WeightsError, plural
from ..hashing import sha256_file
from .inspect import MISSING, inspect_file
from .manifest import (
    ENV_VAR,
    MANIFEST,
    STAGING_DIR,
    TINY_MARKER,
    TRY_TINY,
    Manifest,
    Source,
    WeightFile,
    _human,
    _Report,
    hub_endpoint,
    is_tiny,
    resolve_dir,
)
from .verification import _check, _State

ATTEMPTS_PER_SOURCE = 3  # tries of one source before moving to the next (each try resumes where possible)
RETRY_DELAY_S = 1.0  # seconds between tries of one source
HTTP_TIMEOUT_S = 30.0  # seconds without data before a plain-HTTP transfer is considered stalled
_CHUNK = 1 << 20  # bytes per read when streaming (1 MiB)


@dataclasses.dataclass(frozen=True)
class DownloadRow:
    """What :func:`download` did for the manifest file ``name`` at layout ``path``: ``action`` ``"present"`` (nothing
    fetched), ``"downloaded"``, ``"replaced"`` (a bad file), ``"failed"`` or ``"not kept"`` (a config copied from the
    package, removed again because other files failed), from ``source`` ("" when none), ``size`` bytes on disk
    afterwards (None when failed), wall-clock ``seconds``, and a ``note``: the checks done, or every source's error."""

    name: str
    path: str
    action: str
    source: str
    size: int | None
    seconds: float
    note: str = ""


@dataclasses.dataclass(frozen=True)
class DownloadReport(_Report):
    """The result of :func:`download` for the weights dir ``directory``: one :class:`DownloadRow` per file."""

    directory: Path
    rows: tuple[DownloadRow, ...]

    @property
    def ok(self) -> bool:
        """True when no file failed."""
        return not self.failed

    @property
    def failed(self) -> tuple[DownloadRow, ...]:
        """The rows whose every source failed."""
        return tuple(r for r in self.rows if r.action == "failed")

    @property
    def downloaded_bytes(self) -> int:
        """Bytes of the files fetched in this call."""
        return sum(r.size or 0 for r in self.rows if r.action in ("downloaded", "replaced"))

    _HEADERS = ("file", "action", "size", "seconds", "source", "note")

    def _rows(self) -> list[list[str]]:
        return [[r.path, r.action, _human(r.size), f"{r.seconds:.1f}", r.source, r.note] for r in self.rows]

    def _styles(self) -> list[str]:
        return ["background:#fde0dc" if r.action == "failed" else "" for r in self.rows]

    def _summary(self) -> str:
        got = sum(r.action in ("downloaded", "replaced") for r in self.rows)
        return (f"{self.directory}: {plural(len(self.rows), 'file')}, {got} fetched ({_human(self.downloaded_bytes)}), "
                f"{sum(r.action == 'present' for r in self.rows)} already present, {len(self.failed)} failed")


class _Rejected(Exception):
    """A source delivered something that is not the file (wrong size, hash, HTML page...): try the next one."""


class _Skipped(Exception):
    """A source cannot be used here (offline mode, package missing, host unreachable): try the next one, no retry."""


_HOSTS: dict[tuple[str, int], str] = {}  # (host, port) -> "" when reachable, else the reason (per download call)


def _check_host(url: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`_Skipped` when ``url``'s host cannot be connected to (once per host: no retries per file)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    key = host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    if key not in _HOSTS:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                _HOSTS[key] = ""
        except OSError as exc:
            _HOSTS[key] = f"{host} cannot be reached from this machine ({exc.strerror or exc})"
    if _HOSTS[key]:
        raise _Skipped(_HOSTS[key])


def _permanent(exc: BaseException) -> bool:
    """True for errors that another try of the same source cannot fix (404, 401, 403, bad content)."""
    if isinstance(exc, (_Rejected, _Skipped)):
        return True
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"RepositoryNotFoundError", "EntryNotFoundError", "RevisionNotFoundError", "GatedRepoError",
                "RemoteEntryNotFoundError", "DisabledRepoError", "LocalEntryNotFoundError",
                "FileURLRetrievalError"}:
        return True
    status = getattr(exc, "code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 429)


SHORT_CHARS = 600  # an error's text in a download row: whole sentences up to about this many characters


def _short(exc: BaseException) -> str:
    """``exc`` on one line (gdown's first line says only "Failed to retrieve file url:"), cut at a sentence end."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if len(text) > SHORT_CHARS:
        end = text.rfind(". ", 0, SHORT_CHARS)
        text = text[:end + 1] + " [...]" if end > 0 else text
    if isinstance(exc, (_Skipped, _Rejected)):  # our own reasons: no internal class name
        return text or "skipped"
    return f"{type(exc).__name__}: {text}".rstrip(": ")


def _staging(root: Path, *parts: str) -> Path:
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "--", p) for p in parts]
    folder = root.joinpath(STAGING_DIR, *safe)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _fetch_hub(source: Source, root: Path) -> tuple[Path, int | None, str | None, str]:
    try:
        import huggingface_hub as hf
    except ImportError as exc:
        raise _Skipped("huggingface_hub is not installed (pip install huggingface_hub)") from exc
    mirror = source.endpoint is not None and source.endpoint.rstrip("/") != hub_endpoint()
    token: Any = False if mirror else None  # never send the user's HF token to a third-party mirror
    endpoint = source.endpoint.rstrip("/") if source.endpoint else None
    size = sha = None
    commit = ""
    # The LFS oid is the sha256 of the file; paths-info states it explicitly. Mirrors may lack this API: the HEAD
    # below still gives size and etag.
    with contextlib.suppress(Exception):
        api = hf.HfApi(endpoint=endpoint, token=token)
        info = api.get_paths_info(source.repo, [source.filename], revision=source.revision)
        if info:
            size, sha = getattr(info[0], "size", None), getattr(getattr(info[0], "lfs", None), "sha256", None)
    try:
        url = hf.hf_hub_url(source.repo, source.filename, revision=source.revision, endpoint=endpoint)
        meta = hf.get_hf_file_metadata(url, token=token)
        size = size if size is not None else meta.size
        commit = meta.commit_hash or ""
        etag = (meta.etag or "").strip('"').lower()
        if sha is None and re.fullmatch(r"[0-9a-f]{64}", etag):
            sha = etag  # the hub's etag of an LFS file is its sha256
    except Exception as exc:  # noqa: BLE001 - a failed HEAD is reported by hf_hub_download just below
        if _permanent(exc):
            raise
    staged = hf.hf_hub_download(source.repo, source.filename, revision=source.revision,
                                local_dir=_staging(root, "hub", endpoint or "default", source.repo),
                                endpoint=endpoint, token=token)
    where = f"hub {source.repo}@{commit[:12] or source.revision}" + (f" via {endpoint}" if mirror else "")
    return Path(staged), (int(size) if size is not None else None), sha, where


def _fetch_gdrive(source: Source, root: Path, rel: str) -> tuple[Path, int | None, str | None, str]:
    try:
        import gdown
    except ImportError as exc:
        raise _Skipped("gdown is not installed (pip install gdown)") from exc

    out = _staging(root, "gdrive", source.id) / Path(rel).name
    quiet = bool(progress._settings.get("disable"))
    try:
        result = gdown.download(id=source.id, output=str(out), quiet=quiet, resume=True)
    except OSError:  # requests' errors are OSErrors: an unreachable host gets one plain line and no retry
        _check_host(source.address())
        raise
    if not result or not out.is_file():
        raise OSError(f"gdown could not fetch Drive id {source.id} (quota exceeded, or the file is not shared)")
    return out, None, None, f"Google Drive {source.id}"


def _fetch_url(source: Source, root: Path, rel: str) -> tuple[Path, int | None, str | None, str]:
    """Stream ``source.url`` into a ``.part`` file of the staging folder, resuming it with a Range request."""
    import urllib.error
    import urllib.request

    url, desc = source.url, Path(rel).name
    part = _staging(root, "url") / (desc + ".part")
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "nbhelpers (musetalk-workbook)", "Accept-Encoding": "identity",
               **({"Range": f"bytes={have}-"} if have else {})}
    try:  # the URLs are the manifest's
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=HTTP_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # asked past the end: the .part is already whole (checked by the caller)
            match = re.search(r"/(\d+)", exc.headers.get("Content-Range", ""))
            return part, int(match.group(1)) if match else have, None, f"URL {url}"
        raise
    with response:
        if response.headers.get_content_type() == "text/html":
            raise _Rejected(f"{url} answered with a web page (Content-Type text/html), not the file")
        length = response.headers.get("Content-Length")
        if response.status == 206:
            match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != have:
                raise OSError(f"{url} answered a resume request with a different range; starting again")
            total = int(match.group(2)) if match.group(2) != "*" else None
            mode = "ab"
        else:  # 200: the server ignored the Range request (or there was none): start from zero
            have = 0
            total = int(length) if length is not None else None
            mode = "wb"
        with open(part, mode) as f, progress.bar(total=total, desc=desc, unit="B", unit_scale=True,
                                                 unit_divisor=1024, initial=have) as pbar:
            while block := response.read(_CHUNK):
                f.write(block)
                pbar.update(len(block))
    got = part.stat().st_size
    if total is not None and got < total:
        raise OSError(f"connection closed at {got} of {total} bytes")
    return part, total, None, f"URL {url}"


def _fetch_bundled(source: Source, root: Path, rel: str) -> tuple[Path, int | None, str | None, str]:
    data = importlib.resources.files("nbhelpers").joinpath("configs", source.resource).read_bytes()
    out = _staging(root, "bundled") / Path(rel).name
    out.write_bytes(data)
    return out, len(data), hashlib.sha256(data).hexdigest(), f"bundled nbhelpers/configs/{source.resource}"


def _fetch(source: Source, root: Path, rel: str) -> tuple[Path, int | None, str | None, str]:
    if source.kind == "bundled":
        return _fetch_bundled(source, root, rel)
    if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
        raise _Skipped("HF_HUB_OFFLINE is set: no network source is tried")
    if source.kind == "hub":
        _check_host((source.endpoint or hub_endpoint()).rstrip("/"))
        return _fetch_hub(source, root)
    if source.kind == "gdrive":
        return _fetch_gdrive(source, root, rel)
    if source.kind == "url":
        _check_host(source.address())
        return _fetch_url(source, root, rel)
    raise _Skipped(f"unknown source kind {source.kind!r}")


def _accept(entry: WeightFile, staged: Path, size: int | None, sha: str | None) -> str:
    """Check a fetched file before it is renamed into place; raise :class:`_Rejected` when it is not the file."""
    insp = inspect_file(staged, entry.format)
    if insp.bad:
        raise _Rejected(f"{insp.state}: {insp.detail}")
    got = staged.stat().st_size
    notes = [insp.detail]
    if entry.size is not None and entry.size.verified and got != int(entry.size.value):
        raise _Rejected(f"{got} bytes, the manifest says {entry.size.value}")
    if size is not None:
        if got != size:
            raise _Rejected(f"{got} bytes, the source said {size}")
        notes.append(f"size {got} as stated by the source")
    wanted = {"the source": sha}
    if entry.sha256 is not None and entry.sha256.verified:
        wanted["the manifest"] = str(entry.sha256.value)
    wanted = {who: value.lower() for who, value in wanted.items() if value}
    if wanted:
        digest = sha256_file(staged, desc=Path(entry.path).name)
        for who, value in wanted.items():
            if digest != value:
                raise _Rejected(f"sha256 {digest[:16]}... but {who} says {value[:16]}...")
        notes.append("sha256 matches")
    return "; ".join(notes)


def _download_one(entry: WeightFile, root: Path, state: _State, replacing: bool) -> DownloadRow:
    start = time.monotonic()
    errors: list[str] = []
    target = root / entry.path
    for source in entry.sources:
        if (source.kind == "hub" and source.endpoint
                and source.endpoint.rstrip("/") == hub_endpoint()
                and any(s.kind == "hub" and s.endpoint is None and s.repo == source.repo for s in entry.sources)):
            continue  # HF_ENDPOINT already points at this mirror: it was tried as the first source
        for attempt in range(1, ATTEMPTS_PER_SOURCE + 1):
            staged = None
            try:
                staged, size, sha, where = _fetch(source, root, entry.path)
                note = _accept(entry, staged, size, sha)
            except _Rejected as exc:
                errors.append(f"{source.describe()}: rejected ({exc})")
                if staged is not None:
                    with contextlib.suppress(OSError):
                        Path(staged).unlink()
                break
            except Exception as exc:  # noqa: BLE001 - every failure moves on; all of them are reported
                errors.append(f"{source.describe()} (try {attempt}): {_short(exc)}")
                if _permanent(exc) or attempt == ATTEMPTS_PER_SOURCE:
                    break
                time.sleep(RETRY_DELAY_S)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged, target)
            st = target.stat()
            known_size = st.st_size if size is None and sha else size  # a file that matched its sha256 is whole
            state.record_facts(entry.path, known_size, sha, where)
            if sha:
                state.record_sha256(entry.path, st, sha)
            state.save()
            if errors:
                note += f" (after: {' | '.join(errors)})"
            return DownloadRow(entry.name, entry.path, "replaced" if replacing else "downloaded", where,
                               st.st_size, time.monotonic() - start, note)
    return DownloadRow(entry.name, entry.path, "failed", "", None, time.monotonic() - start, " | ".join(errors))


def _failure_message(root: Path, rows: Sequence[DownloadRow], manifest: Manifest) -> str:
    lines = [f"{len(rows)} weight file(s) could not be downloaded into {root}:"]
    for row in rows:
        entry = manifest.get(row.name)
        lines.append(f"  {row.path} ({entry.expected_text()}):")
        lines += [f"    - {e}" for e in row.note.split(" | ")]
        lines.append(f"    by hand: fetch {entry.sources[0].address()} and save it as {root / row.path}")
    if all("cannot be reached from this machine" in row.note or "HF_HUB_OFFLINE" in row.note for row in rows):
        lines.append(
            "Fix: this machine cannot reach the weight hosts (no internet, or HF_HUB_OFFLINE is set). Copy the "
            f"files above into {root} by hand (the 'by hand' lines give each address), or point the job at a "
            "folder that already holds them: --weights DIR on the command line, weights_dir= in Python, or the "
            "NBHELPERS_WEIGHTS environment variable (a shared Google Drive folder works). " + TRY_TINY)
    else:
        lines.append(
            "Fix: check the network and run the download again (finished files are kept; the hub client resumes "
            "cut transfers). If huggingface.co is blocked set HF_ENDPOINT=https://hf-mirror.com; for a gated or "
            "private repository set HF_TOKEN; unset HF_HUB_OFFLINE to allow downloads. Or copy the files by hand "
            "and pass --weights DIR (weights_dir=, NBHELPERS_WEIGHTS).")
    return "\n".join(lines)


def _refuse_tiny(root: Path, directory: str | os.PathLike | None, n_files: int) -> None:
    """InputError: ``root`` holds tiny random test weights, and real files downloaded beside them would be loaded
    with the random ones."""
    named_by_env = directory is None and bool(os.environ.get(ENV_VAR))
    raise InputError(
        f"{root} holds tiny random test weights (its {TINY_MARKER} says so), so {plural(n_files, 'real weight file')} "
        "will not be downloaded into it: a job would load them beside the random ones. Download the real weights "
        "into a folder of their own (--weights DIR on the command line, directory= in Python, or the "
        f"{ENV_VAR} environment variable)" + (f"; {ENV_VAR} names the tiny folder now" if named_by_env else "")
        + ".")


def download(directory: str | os.PathLike | None = None, sets: str | Sequence[str] | None = None,
             files: str | Sequence[str] | None = None, *, manifest: Manifest = MANIFEST) -> DownloadReport:
    """Fetch the weight files of ``sets`` and ``files`` (as :meth:`Manifest.select` chooses them; None and None: the
    v1.5 inference set, about 4.2 GB) that are missing or bad into ``directory`` (made when missing; None:
    :func:`default_dir`), hashing each fetched file whose sha256 is known before it is put in place. Present files
    are checked (no hashing) and kept; a bad one is replaced with a warning.
    Raises InputError for an unknown set or file name, or for a folder of tiny random test weights that lacks a
    file (``tiny.json``: real files beside random ones would be loaded together); WeightsError when the folder
    cannot be written, or a file failed from every source (naming each source's error, the manual URL and the fix;
    files that succeeded are kept).
    Source: ``download_weights.sh:14-49`` (the same files; its ``hf-mirror.com`` endpoint is the second hub source)."""
    entries = manifest.select(sets, files)
    root = resolve_dir(directory)
    state = _State(root)
    _HOSTS.clear()
    checks = [(entry, _check(entry, root, state, deep=False)) for entry in entries]
    todo = [check for _, check in checks if check.bad]
    if todo and is_tiny(root):
        _refuse_tiny(root, directory, len(todo))
    for check in todo:
        if check.state != MISSING:
            warnings.warn(f"{root / check.path} is {check.state} ({check.detail}); downloading it again",
                          NbHelpersWarning, stacklevel=2)
    if todo:
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / f".nbhelpers-write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            names = ", ".join(c.path for c in todo)
            raise WeightsError(f"cannot write to the weights dir {root} ({exc}); {len(todo)} file(s) are missing "
                               f"or bad: {names}. Choose a writable folder (--weights DIR on the command line, "
                               f"directory= in Python, or the {ENV_VAR} environment variable), or ask the owner of "
                               "the shared folder to run the download.") from exc
        before = {p for p in root.rglob("*") if p.is_dir()}
    rows = [_download_one(entry, root, state, check.state != MISSING) if check.bad
            else DownloadRow(entry.name, check.path, "present", "", check.size, 0.0, check.detail)
            for entry, check in checks]
    if any(r.action == "failed" for r in rows):  # a bundled config copy alone would look like a half-present set
        for k, row in enumerate(rows):
            if row.action == "downloaded" and row.source.startswith("bundled"):
                (root / row.path).unlink(missing_ok=True)
                state.files.pop(row.path, None)
                rows[k] = dataclasses.replace(row, action="not kept", size=None,
                                              note="copied from the package with the files that failed, not before")
    report = DownloadReport(root, tuple(rows))
    state.save()
    if report.failed:
        # the folders this call made that hold nothing: a source that sent nothing, a bundled copy not kept (the
        # staging folders holding partial transfers stay, for the next call to resume)
        for folder in sorted({p for p in root.rglob("*") if p.is_dir()} - before, key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                folder.rmdir()
        error = WeightsError(_failure_message(root, report.failed, manifest))
        error.report = report  # type: ignore[attr-defined]
        raise error
    if todo:
        shutil.rmtree(root / STAGING_DIR, ignore_errors=True)
    return report
