"""Batch dubbing on Ray: many (video, audio) jobs over every GPU of a machine or a cluster, with nothing lost.

A batch is a list of jobs (a CSV or JSON-lines file, or :class:`Job` objects): a face video, a speech file, an
output MP4 and optional settings per job. :func:`run` starts Ray on this machine (or joins a cluster with
``address=``), starts one worker per GPU (CPU workers when there is none; ``workers_per_gpu`` for more), each
holding one loaded :class:`~nbhelpers.pipeline.MuseTalkPipeline` and rendering one or two clips at once in threads
over it (``jobs_per_worker``: chosen from the free GPU memory when not given; a GPU worker holds as many jobs again,
whose audio and encoder are ready when a clip's last batch frees the GPU), and hands out the work:

- Jobs are grouped by source video (its content and the settings that shape the face cache). Each group's
  avatar is prepared once (:func:`nbhelpers.avatar.prepare_avatar`, cached under ``cache_dir`` on storage every
  worker sees) and every audio of the group is generated from it (:meth:`nbhelpers.avatar.Avatar.generate`, whose
  frames equal the offline job's with the default ``blur_ratio``). A worker keeps the avatars it loaded, so jobs of
  a face go to a worker that already holds it when one is free.
- Nothing is lost. Outputs are written under a temporary name and renamed (:class:`nbhelpers.media.VideoWriter`).
  A failing job (an unreadable file, no face) is recorded with its error and the batch goes on. A worker that dies
  during a job (killed, out of memory, a crashed driver) is restarted by Ray, its half-written files are removed and
  its jobs (every one it was running) are given to the next free worker, up to ``max_attempts`` times each. A batch
  stopped by Ctrl-C or SIGTERM shuts its workers down, removes their half-written files and writes the summary
  with the unfinished jobs as ``"interrupted"``. A batch holds locks on its avatar cache (``batch.lock``) and its
  outputs folder (``.batch.lock``) while it runs, so that a second one started over the same outputs is refused
  instead of making every clip again; its summary CSV replaces only an earlier summary.
- Running the same batch again skips finished outputs. Next to each output a small record
  (``.<name>.batch.json``) holds the fingerprints of what made it: the sizes and SHA-256 of video and audio, the
  settings, the weight files and the output's size. An output counts as finished only when it exists, its record
  matches and its size is the recorded one; a changed input or setting makes it again. A job that failed at the
  input checks (a missing or unreadable file) leaves a hint in ``cache_dir/failed``; a rerun where every unfinished
  job has a hint matching its unchanged files probes them again and reports them without starting Ray.

Progress bars count jobs and frames (:func:`nbhelpers.progress.bar`). The result, :class:`BatchResult`, is a table
(job, status, frames, seconds, fps, error) that shows itself in a notebook, also written as a CSV next to the
outputs.

Ray is an optional extra: ``pip install "ray>=2.10"`` (or the package's ``[batch]`` extra). Importing this module
does not import Ray or torch.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import html
import io
import json
import os
import shutil
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import FallbackWarning, InputError, MissingDependencyError, NbHelpersError

RECORD_FORMAT = 1  # bump when the output record's fields change (older records then make their outputs again)
HINT_FORMAT = 1  # bump when the input-failure hint's fields change (older hints are then ignored)
HINTS_NAME = "failed"  # folder of the input-failure hints, in the avatar cache
SUMMARY_NAME = "batch-summary.csv"
# Jobs a GPU worker holds per render slot beyond the one rendering (see _dispatch): one is enough for the next clip to
# be ready to render when a clip's last batch is done.
WAITING_PER_SLOT = 1
CACHE_NAME = "avatar-cache"
INSTALL_RAY = 'pip install "ray>=2.10"'
STATUSES = ("done", "skipped", "failed", "interrupted")  # "interrupted": only in the summary of a stopped batch
# Per-job settings: InferenceConfig fields a row may set (version, device and precision belong to the workers'
# pipelines) and "box", one crop box (x1, y1, x2, y2) for the clip.
ROW_SETTINGS = ("batch_size", "extra_margin", "bbox_shift", "parsing_mode", "left_cheek_width", "right_cheek_width",
                "landmark_backend", "smooth_boxes", "seed", "latent_mode", "blur_ratio", "box")
ERROR_WIDTH = 80  # characters of a job's error in the text table; the summary CSV has the whole message
SUMMARY_COLUMNS = ("job", "status", "frames", "seconds", "fps", "error", "video", "audio", "output", "attempts",
                   "worker")


def ray_installed() -> bool:
    """True when Ray can be imported (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _require_ray():
    """Import Ray, or raise :class:`MissingDependencyError` with the install line."""
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError(
            f"batch runs need Ray, which is not installed ({exc}). Install it with `{INSTALL_RAY}` (or install this "
            "package with its batch extra: `pip install -e \".[batch]\"` in a checkout), then run the batch "
            "again.") from exc
    return ray


# ------------------------------------------------------------------------------------------------------------------
# Jobs


@dataclass(frozen=True)
class Job:
    """One clip of a batch.

    Attributes:
        name: Unique name in the batch (default: the output file's stem).
        video: Face video or photo.
        audio: Speech file.
        output: The MP4 to write.
        settings: Per-job settings (see :data:`ROW_SETTINGS`): InferenceConfig fields such as ``bbox_shift`` or
            ``extra_margin``, and ``box`` = ``(x1, y1, x2, y2)`` in source pixels to skip face detection.
        source: Where the job was read (``"jobs.csv line 4"``; empty for jobs made in Python): messages about its
            settings name it.
    """

    name: str
    video: Path
    audio: Path
    output: Path
    settings: Mapping[str, Any] = field(default_factory=dict)
    source: str = field(default="", compare=False)  # where it was read ("jobs.csv line 4"), for messages


def _setting(key: str, value: Any, where: str) -> Any:
    """A per-job setting checked for its kind and converted from text (CSV) where needed; None for an empty cell.

    Whole-number settings (``batch_size``, ``extra_margin``, ``bbox_shift``, ...) take whole numbers (``12``,
    ``"12"``, ``12.0``), number settings (``blur_ratio``) any finite number, text settings text; a ``box`` four
    finite numbers. JSON's ``true``/``false`` is no number here.

    Raises:
        InputError: A value of the wrong kind (``2.5`` pixels of ``extra_margin``, ``[1]``, ``true``), not finite,
            or a box that is not four numbers.
    """
    import math

    from .config import InferenceConfig

    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if key == "box":
        parts = value.replace(" ", "").split(",") if isinstance(value, str) else value
        try:
            if isinstance(parts, (str, bytes, Mapping)) or any(isinstance(v, bool) for v in parts):
                raise TypeError
            numbers = [float(v) for v in parts]
            box = tuple(int(round(v)) for v in numbers) if all(map(math.isfinite, numbers)) else ()
        except (TypeError, ValueError, OverflowError):
            box = ()
        if len(box) != 4:
            raise InputError(f"{where}: box must be four finite numbers x1,y1,x2,y2 in source pixels; got {value!r}.")
        if not (box[0] < box[2] and box[1] < box[3]):
            raise InputError(f"{where}: box {value!r} is inverted: x1,y1 is the top-left corner and x2,y2 the "
                             "bottom-right one, so x1 < x2 and y1 < y2.")
        return box
    default = InferenceConfig.__dataclass_fields__[key].default
    kind = float if isinstance(default, float) else int if key == "batch_size" or isinstance(default, int) else str
    if kind is str:
        if not isinstance(value, str):
            raise InputError(f"{where}, setting {key}: must be text; got {value!r}.")
        return value.strip()
    what = "a whole number" if kind is int else "a number"
    number = None
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        with contextlib.suppress(ValueError, OverflowError):  # "twelve"; an int beyond a float's range
            number = float(value)
    if number is None or not math.isfinite(number) or (kind is int and not number.is_integer()):
        raise InputError(f"{where}, setting {key}: must be {what}; got {value!r}.")
    return int(number) if kind is int else number


def _setting_error(job: Job, config: Any, changes: Mapping[str, Any], exc: InputError) -> str:
    """The message of a job whose settings ``config`` refuses (a value out of its range), naming where the job was
    read and the setting at fault (``jobs.csv line 4 (job 'o10'), setting extra_margin: must be between ...``):
    each of the job's own settings is tried alone, the first one refused is named; a refusal of the settings
    together (or of the batch's own ``config``) keeps the whole message."""
    label = f"{job.source} (job {job.name!r})" if job.source else f"job {job.name!r}"
    for key, value in changes.items():
        if key not in job.settings:
            continue
        try:
            config.replace(**{key: value})
        except InputError as alone:
            text = str(alone)
            return f"{label}, setting {key}: {text[len(key) + 1:] if text.startswith(key + ' ') else text}"
    return f"{label}: {exc}"


def _clean_path(path: Path) -> Path:
    """``path`` made absolute, its folder resolved (no ``..``, folder links followed as the system follows them)
    and its own name kept as written (a linked file keeps the name its job gave it)."""
    path = Path.cwd() / path  # unchanged when absolute
    return path.resolve() if path.name in ("", "..") else path.parent.resolve() / path.name


def _job_from_row(row: Mapping[str, Any], base: Path, where: str) -> Job:
    row = {str(k).strip().lower(): v for k, v in row.items() if k is not None}  # "Video " is the video column
    settings_in = row.pop("settings", None) or {}
    if not isinstance(settings_in, Mapping):
        raise InputError(f"{where}: settings must be an object of setting names and values (\"settings\": "
                         f"{{\"bbox_shift\": 5}}); got {settings_in!r}.")
    settings_in = dict(settings_in)
    missing = [k for k in ("video", "audio") if not str(row.get(k) or "").strip()]
    if missing:
        raise InputError(f"{where}: {' and '.join(missing)} missing; every job needs a video and an audio file "
                         "(columns video, audio, output).")
    fixed = {k: row.pop(k) for k in ("name", "video", "audio", "output") if k in row}
    for key, value in fixed.items():  # a CSV cell is always text; a JSON value may be anything
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise InputError(f"{where}: {key} must be a path as text; got {value!r}.")
    settings_in.update(row)
    unknown = sorted(k for k in settings_in if k not in ROW_SETTINGS)
    if unknown:
        raise InputError(f"{where}: unknown column(s) {', '.join(unknown)}. A job has name, video, audio, output and "
                         f"optional settings: {', '.join(ROW_SETTINGS)}.")
    settings = {k: v for k, v in ((k, _setting(k, v, where)) for k, v in settings_in.items()) if v is not None}

    def path(value: Any) -> Path:
        return _clean_path(base / Path(os.fspath(value)).expanduser())  # an absolute value replaces base

    video, audio = path(str(fixed["video"]).strip()), path(str(fixed["audio"]).strip())
    out_text = str(fixed.get("output") or "").strip()
    output = path(out_text) if out_text else _clean_path(base / "results" / f"{video.stem}_{audio.stem}.mp4")
    if output.suffix.lower() != ".mp4":
        raise InputError(f"{where}: output must end in .mp4; got {str(output)!r}.")
    name = str(fixed.get("name") or "").strip() or output.stem
    return Job(name=name, video=video, audio=audio, output=output, settings=settings, source=where)


def read_jobs(path: str | os.PathLike) -> list[Job]:
    """Read a jobs file: CSV with a header row, or JSON lines (``.jsonl``/``.json``: one object per line).

    Columns (CSV) or keys (JSON): ``video``, ``audio``, ``output`` (default ``results/<video>_<audio>.mp4``),
    optional ``name``, and optional settings (:data:`ROW_SETTINGS`), as columns or, in JSON, also under
    ``"settings"``. Relative paths are relative to the jobs file's folder; every path comes back absolute with
    its folder resolved (``../clips/a.mp4`` becomes ``/data/clips/a.mp4``). Empty lines and lines starting with
    ``#`` are skipped. A ``box`` is four numbers ``x1,y1,x2,y2`` (source pixels, rounded to whole pixels; spaces
    allowed): in a CSV the cell holds commas, so it is quoted (``"190,160,360,330"``); in JSON a list or that text.

    Returns:
        The jobs in file order.

    Raises:
        InputError: The file is missing or empty, a row lacks video or audio, has an unknown column or a bad value,
            or two jobs share an output.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"jobs file {str(path)!r} does not exist; give a CSV (columns video,audio,output) or a "
                         "JSON-lines file.")
    try:
        text = path.read_text("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"jobs file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as "
                         "UTF-8 (in a spreadsheet: CSV UTF-8).") from None
    base = path.resolve().parent
    jobs: list[Job] = []
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        for k, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise InputError(f"{path.name} line {k} is not JSON ({exc}); write one job object per line.") from None
            if not isinstance(row, dict):
                raise InputError(f"{path.name} line {k}: a job is a JSON object; got {type(row).__name__}.")
            jobs.append(_job_from_row(row, base, f"{path.name} line {k}"))
    else:
        # Comment and empty lines are left out before the CSV reader sees the text; line_numbers maps the reader's
        # lines back to the file's, so that a message names the line an editor shows.
        line_numbers = [k for k, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.lstrip().startswith("#")]
        kept = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        # skipinitialspace: a quoted cell after ", " (`a.mp4, b.wav, o.mp4, "1,2,3,4"`) is still one cell
        reader = csv.DictReader(io.StringIO("\n".join(kept)), skipinitialspace=True)
        _check_header(reader.fieldnames or [], path.name)
        for row in reader:
            where = f"{path.name} line {line_numbers[reader.line_num - 1]}"
            if None in row:
                raise InputError(f"{where} has more cells than the header has columns (a box's commas need quotes: "
                                 '"190,160,360,330").')
            jobs.append(_job_from_row(row, base, where))
    if not jobs:
        raise InputError(f"jobs file {str(path)!r} holds no job; write a header (video,audio,output) and one row per "
                         "clip.")
    return check_jobs(jobs)


def _check_header(columns: Sequence[str], file_name: str) -> None:
    """Refuse a CSV header that cannot be a jobs header: an empty column name (a trailing comma), or one column
    holding another separator (a spreadsheet's semicolons or tabs).

    Raises:
        InputError: Saying what the header holds and how to write it.
    """
    names = [str(c).strip() for c in columns]
    if len(names) == 1:
        for sep, word in ((";", "semicolons"), ("\t", "tabs"), ("|", "bars")):
            if sep in names[0]:
                raise InputError(f"{file_name}: the header {names[0]!r} is separated by {word}; a jobs CSV separates "
                                 "its columns by commas (video,audio,output). Save it as CSV with commas.")
    if "" in names:
        raise InputError(f"{file_name}: the header {','.join(names)!r} has an empty column name (a comma at the end "
                         "of the line, or two in a row); remove it.")
    lowered = [n.lower() for n in names]
    twice = sorted({n for n in lowered if lowered.count(n) > 1})
    if twice:
        raise InputError(f"{file_name}: the header names {', '.join(twice)} more than once; keep one column each.")


def check_jobs(jobs: Iterable[Job | Mapping[str, Any]]) -> list[Job]:
    """Jobs as :class:`Job` objects (dicts are converted, relative paths taken from the working directory), with
    unique outputs; a name used twice gets a number (``clip``, ``clip-2``). Paths come back absolute, their
    folders resolved (no ``..``), so that the summary names each file one way.

    Raises:
        InputError: A job is malformed, two jobs share an output, or an output is a job's video or audio.
    """
    out: list[Job] = []
    for k, job in enumerate(jobs):
        if isinstance(job, Job):
            paths = [_clean_path(Path(os.fspath(p)).expanduser()) for p in (job.video, job.audio, job.output)]
            out.append(job if paths == [job.video, job.audio, job.output] else Job(job.name, *paths, job.settings, job.source))
        elif isinstance(job, Mapping):
            out.append(_job_from_row(job, Path.cwd(), f"job {k}"))
        else:
            raise InputError(f"job {k} must be a Job or a dict with video, audio and output; got {type(job).__name__}.")
    names: set[str] = set()
    for k, job in enumerate(out):  # names label the summary rows: a repeated one gets a number
        name, n = job.name, 1
        while name in names:
            n += 1
            name = f"{job.name}-{n}"
        names.add(name)
        if name != job.name:
            out[k] = Job(name, job.video, job.audio, job.output, job.settings, job.source)

    def label(k: int) -> str:
        return f"job {k + 1} ({out[k].name!r})"

    outputs: dict[Path, int] = {}
    for k, job in enumerate(out):
        key = job.output.resolve()
        if key in outputs:
            raise InputError(f"{label(outputs[key])} and {label(k)} both write {str(job.output)!r}; give each job "
                             "its own output.")
        outputs[key] = k
    for k, job in enumerate(out):  # an output that is a job's input would replace it (and the rerun, again)
        for kind, source in (("video", job.video), ("audio", job.audio)):
            writer = outputs.get(source.resolve())
            if writer is not None:
                whose = "its own" if writer == k else f"{label(k)}'s"
                raise InputError(f"{label(writer)} writes {str(source)!r}, which is {whose} {kind}: writing it would "
                                 "replace the input. Give another output path.")
    if not out:
        raise InputError("the batch holds no job.")
    return out


# ------------------------------------------------------------------------------------------------------------------
# Fingerprints and records


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return h.hexdigest()


class _Fingerprints:
    """Size and SHA-256 of input files, each hashed once per run."""

    def __init__(self):
        self._cache: dict[Path, dict[str, Any]] = {}

    def __call__(self, path: Path) -> dict[str, Any]:
        key = path.resolve()
        if key not in self._cache:
            self._cache[key] = {"size": key.stat().st_size, "sha256": _sha256(key)}
        return self._cache[key]


def record_path(output: Path) -> Path:
    """Where the record of ``output`` lives: ``.<name>.batch.json`` beside it."""
    return output.with_name(f".{output.name}.batch.json")


def _weights_state(weights_dir: Path, version: str) -> dict[str, list[int]]:
    from . import weights

    out = {}
    for name in weights.required_files(version, parsing=True):
        p = weights_dir / name
        if p.is_file():
            st = p.stat()
            out[name] = [st.st_size, int(st.st_mtime)]
    return out


def _finished(job: Job, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The record of ``job``'s output when the output is finished and was made from ``inputs``; else None."""
    rec_path = record_path(job.output)
    try:
        rec = json.loads(rec_path.read_text("utf-8"))
        size = job.output.stat().st_size
    except (OSError, ValueError):
        return None
    if rec.get("format") != RECORD_FORMAT or rec.get("inputs") != inputs or rec.get("output_size") != size:
        return None
    return rec


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), "utf-8")
    os.replace(tmp, path)


def _file_state(path: Path) -> dict[str, Any]:
    """A cheap fingerprint of an input file (one stat, no read): path, size and mtime_ns, or ``missing``."""
    try:
        st = path.stat()
    except OSError:
        return {"path": str(path), "missing": True}
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _hint_path(cache_path: Path, output: Path) -> Path:
    """Where the input-failure hint of ``output``'s job lives: ``<cache>/failed/<sha of the output path>.json``."""
    return cache_path / HINTS_NAME / f"{hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:24]}.json"


def _write_hint(cache_path: Path, job: Job, error: str) -> None:
    """Note that ``job`` failed at the input checks, with its inputs' cheap fingerprints, so that a rerun with
    the same inputs knows it needs no Ray for it. A hint only decides whether Ray starts while the inputs are
    probed: the probe still runs and decides the outcome, so a hint that cannot be written is left out."""
    hint = {"format": HINT_FORMAT, "output": str(job.output.resolve()), "stage": "inputs", "error": error,
            "inputs": {"video": _file_state(job.video), "audio": _file_state(job.audio)}}
    path = _hint_path(cache_path, job.output)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(path, hint)
    except OSError:
        pass


def _drop_hint(cache_path: Path, job: Job) -> None:
    """Remove ``job``'s input-failure hint (its inputs passed the checks now)."""
    try:
        _hint_path(cache_path, job.output).unlink(missing_ok=True)
    except OSError:
        pass


def _failed_at_inputs(cache_path: Path, job: Job) -> bool:
    """True when ``job`` failed at the input checks last time and its video and audio look unchanged since
    (same path, size and mtime, or still missing)."""
    try:
        hint = json.loads(_hint_path(cache_path, job.output).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(hint, dict) and hint.get("format") == HINT_FORMAT and hint.get("stage") == "inputs"
            and hint.get("output") == str(job.output.resolve())
            and hint.get("inputs") == {"video": _file_state(job.video), "audio": _file_state(job.audio)})


def _likely_work(job_list: Sequence[Job], cache_path: Path, rerun: bool) -> bool:
    """Whether the batch will probably need Ray: a rerun, or a job with neither its output and record (it may
    be finished) nor an input-failure hint that still matches its inputs (it will fail again before any worker).
    A wrong guess only costs time: without it Ray starts after the input checks, when some job is left to run."""
    return rerun or any(not (j.output.is_file() and record_path(j.output).is_file())
                        and not _failed_at_inputs(cache_path, j) for j in job_list)


def outputs_folder(job_list: Sequence[Job]) -> Path:
    """The folder of a batch's summary CSV and avatar cache when none is given: the deepest folder holding every
    output, or, when that is a filesystem root or a folder this user cannot write in (outputs under ``/tmp/a`` and
    ``/var/tmp/b`` share only ``/``), the first job's output folder."""
    folders = [j.output.resolve().parent for j in job_list]
    common = Path(os.path.commonpath([str(f) for f in folders]))
    if common.parent == common or not _writable(common):
        return folders[0]
    return common


def _writable(folder: Path) -> bool:
    """Whether this process can make files in ``folder``, or make ``folder`` (its nearest existing parent is a
    folder it can write in)."""
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    return existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def check_writable(folders: Iterable[Path]) -> None:
    """Check, before Ray starts, that the batch can write where it writes: every output folder, the avatar cache
    and the summary's folder (made when missing).

    Raises:
        InputError: A folder that is inside a file, or on read-only storage or not this user's to write in (the
            message names up to three and what to do).
    """
    import tempfile

    bad = []
    for folder in dict.fromkeys(Path(f) for f in folders):
        existing = folder
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        if not existing.is_dir():
            bad.append(f"{str(folder)!r} (a file, not a folder)" if existing == folder else
                       f"{str(folder)!r} (inside the file {str(existing)!r})")
            continue
        if not os.access(existing, os.W_OK | os.X_OK):
            bad.append(f"{str(folder)!r} (read-only or not yours)" if existing == folder else
                       f"{str(folder)!r} (its folder {str(existing)!r} is read-only or not yours)")
            continue
        try:  # what the permission bits do not say (root on /proc or /sys, a read-only bind): the folder is made
            folder.mkdir(parents=True, exist_ok=True)  # (the batch writes there anyway) and a file tried in it
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".nbhelpers-write-check-"):
                pass
        except OSError as exc:
            bad.append(f"{str(folder)!r} ({exc.strerror or type(exc).__name__})")
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise InputError(f"the batch cannot write in {', '.join(bad[:3])}{more}. Give the outputs (and any "
                         "cache_dir and summary) in folders you can write in.")


def check_summary_path(path: Path, job_list: Sequence[Job], jobs_file: Path | None = None) -> None:
    """Check, before Ray starts, that writing the summary CSV at ``path`` replaces nothing but an earlier summary:
    not a folder, not the jobs file, not a job's video, audio or output, and not any other file that exists
    (a file there must begin with the summary's header row).

    Raises:
        InputError: Naming what ``path`` is and what to give instead.
    """
    fix = "give the summary another path (summary=, --summary) or leave it out (<outputs folder>/batch-summary.csv)"
    if path.is_dir():
        raise InputError(f"the summary {str(path)!r} is a folder; {fix}.")
    target = path.resolve()
    if jobs_file is not None and target == Path(jobs_file).resolve():
        raise InputError(f"the summary {str(path)!r} is the jobs file: writing it would replace the jobs; {fix}.")
    for job in job_list:
        for kind, file in (("video", job.video), ("audio", job.audio), ("output", job.output)):
            if target == file.resolve():
                raise InputError(f"the summary {str(path)!r} is job {job.name!r}'s {kind}: writing it would replace "
                                 f"that file; {fix}.")
    if path.exists():
        try:
            with open(path, encoding="utf-8", newline="") as fh:
                first = fh.readline().strip()
        except (OSError, UnicodeDecodeError):
            first = ""
        if first != ",".join(SUMMARY_COLUMNS):
            raise InputError(f"{str(path)!r} exists and is not a batch summary: writing the summary there would "
                             f"replace it; {fix}.")


class _BatchLock:
    """An exclusive lock on a folder of a batch (its avatar cache, ``<cache>/batch.lock``, and its outputs folder,
    ``<outputs>/.batch.lock``; ``fcntl.flock``) held for the whole run, so that a second batch started over the same
    outputs (with the same cache or another one) is refused instead of rendering every clip again and removing the
    first one's files in progress. The file holds who holds it (pid, host, start time) for the
    refusal's message, and stays (removing a lock file races with the next taker). Where ``fcntl`` is missing
    (Windows) or the storage takes no locks (``flock`` fails other than by being held) there is no lock.

    Raises:
        InputError: On entry, when another process holds the lock.
    """

    def __init__(self, folder: Path, name: str = "batch.lock", what: str = "the avatar cache"):
        self.path = Path(folder) / name
        self.what = what
        self._fh = None

    def __enter__(self) -> _BatchLock:
        try:
            import fcntl
        except ImportError:
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"the batch cannot make its lock {str(self.path)!r} ({exc.strerror or exc}); give the "
                             "outputs and cache_dir in folders you can write in.") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held by another process
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise InputError(f"another batch is running over {self.what} {str(self.path.parent)!r} ({holder}): "
                             "wait for it to end, or give this batch its own outputs and cache_dir. Two batches "
                             "over the same outputs would each make every clip.") from None
        except OSError:  # storage without locks (some network file systems): the batch runs without one
            fh.close()
            return self
        import socket

        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the file gives the lock back
            self._fh = None


def remove_partials(output: Path) -> list[Path]:
    """Remove the half-written files a dead worker left for ``output`` (``VideoWriter``'s temporary names,
    ``.<stem>.partial-<8 hex><suffix>``). Returns what was removed."""
    removed = []
    if output.parent.is_dir():
        for p in output.parent.glob(f".{output.stem}.partial-*{output.suffix}"):
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


# ------------------------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class JobOutcome:
    """What happened to one job.

    Attributes:
        job: The job's name.
        status: ``"done"`` (made now), ``"skipped"`` (already finished from the same inputs) or ``"failed"``;
            ``"interrupted"`` in the summary CSV of a batch stopped before the job ended.
        frames: Output frames (25 fps); for a skipped job the recorded count; 0 when failed.
        seconds: Wall-clock seconds of the job on its worker (0 when skipped).
        error: ``"<ExceptionType>: <message>"`` when failed, else "".
        video: The face video.
        audio: The speech file.
        output: The output MP4.
        attempts: Times the job was started on a worker (more than 1 when a worker died during it).
        worker: The worker that made it (``host/pid device``), or "".
        ended_s: When the outcome came, seconds from the start of :func:`run` (0 for jobs settled before any
            worker: skipped, or failed at the input checks); not in the summary CSV.
        timings: Where a job made now spent its seconds on the worker (the clip's
            :attr:`nbhelpers.result.ClipResult.timings`: seconds per stage); empty otherwise; not in the summary CSV.
    """

    job: str
    status: str
    frames: int
    seconds: float
    error: str
    video: Path
    audio: Path
    output: Path
    attempts: int = 0
    worker: str = ""
    ended_s: float = 0.0
    timings: Mapping[str, float] = field(default_factory=dict)

    @property
    def fps(self) -> float:
        """Output frames per wall-clock second of the job (NaN when nothing ran)."""
        return self.frames / self.seconds if self.seconds > 0 else float("nan")

    def row(self) -> dict[str, Any]:
        """The summary row (:data:`SUMMARY_COLUMNS`)."""
        fps = "" if self.fps != self.fps else f"{self.fps:.2f}"
        return {"job": self.job, "status": self.status, "frames": self.frames, "seconds": f"{self.seconds:.2f}",
                "fps": fps, "error": self.error, "video": str(self.video), "audio": str(self.audio),
                "output": str(self.output), "attempts": self.attempts, "worker": self.worker}


@dataclass(frozen=True)
class BatchResult:
    """The outcome of a batch: one :class:`JobOutcome` per job, in the jobs' order. Shows a table in a notebook.

    Attributes:
        outcomes: One per job.
        summary_csv: The CSV written with the same table (None when writing it was turned off).
        wall_s: Wall-clock seconds of the whole batch (Ray start and model loads included).
        workers: One line per worker started (``host/pid device``); empty when nothing had to run.
        avatars: Avatars prepared (built now) and loaded from the cache, ``{"prepared": n, "loaded": m}``.
        phases: Where the wall time went, seconds from the start of :func:`run`: ``checks`` (jobs read, media
            probed, finished outputs found) and ``ray_start`` (Ray started or joined; the media are probed
            meanwhile, so the two overlap), ``workers_ready`` (every worker answered; its models go on loading
            in a thread while its first avatar is prepared), ``first_job`` (the first job started), ``jobs_done``
            (the last outcome), and ``prepare_s`` (worker seconds spent preparing or loading avatars, summed);
            empty when nothing ran.
        workers_note: How many workers share each GPU and how many jobs each runs at once, and why
            (:func:`choose_jobs_per_worker`, or "asked"); empty on the CPU or when nothing ran.
        timeline: Per worker (its ``host/pid device``), what it did when: ``(event, seconds from the start of
            run())`` for its start, its pipeline made, each model loaded, its warm-up done, each avatar prepared
            and each job (:meth:`BatchWorker.events`); the seconds come from the wall clock of the worker's
            machine, so on a cluster they are as good as its clocks' agreement. Empty when nothing ran.
        preparations: One per avatar preparation a worker finished (or failed), in the order they ended:
            ``{"video", "worker", "status" ("prepared", "loaded" from the cache, "failed"), "seconds",
            "ended_s" (from the start of run()), "timings"}``, ``timings`` being the stages of a preparation
            (:attr:`nbhelpers.avatar.Avatar.prepare_timings`; empty when loaded or failed).
    """

    outcomes: tuple[JobOutcome, ...]
    summary_csv: Path | None
    wall_s: float
    workers: tuple[str, ...] = ()
    avatars: Mapping[str, int] = field(default_factory=dict)
    phases: Mapping[str, float] = field(default_factory=dict)
    workers_note: str = ""
    timeline: Mapping[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    preparations: tuple[Mapping[str, Any], ...] = ()

    def count(self, status: str) -> int:
        """Jobs with ``status`` (done, skipped, failed)."""
        return sum(o.status == status for o in self.outcomes)

    @property
    def ok(self) -> bool:
        """True when no job failed."""
        return self.count("failed") == 0

    @property
    def failed(self) -> list[JobOutcome]:
        """The failed jobs."""
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def frames(self) -> int:
        """Frames made in this run (skipped jobs not counted)."""
        return sum(o.frames for o in self.outcomes if o.status == "done")

    @property
    def fps(self) -> float:
        """Frames made per wall-clock second of the batch."""
        return self.frames / self.wall_s if self.wall_s > 0 else float("nan")

    def summary(self) -> str:
        """One line: counts, frames and throughput, and the summary CSV (which holds the errors that
        :meth:`table` cuts)."""
        text = (f"{len(self.outcomes)} jobs: {self.count('done')} done, {self.count('skipped')} skipped, "
                f"{self.count('failed')} failed; {self.frames} frames in {self.wall_s:.1f} s "
                f"({self.fps:.1f} fps) on {len(self.workers)} {self._worker_kind()}worker(s)")
        if self.workers and self.workers_note:
            text += f" ({self.workers_note})"
        cut = any(len(_one_line(o.error)) > ERROR_WIDTH for o in self.outcomes)
        if self.summary_csv is not None:
            text += f"; {'full errors in the summary' if cut else 'summary'}: {self.summary_csv}"
        elif cut:
            text += "; full errors: BatchResult.failed (no summary CSV was written)"
        return text

    def _worker_kind(self) -> str:
        """``"CPU "`` or ``"GPU "`` when every worker is of that kind (a worker's line ends with its device)."""
        devices = {w.rsplit(" ", 1)[-1].split(":")[0] for w in self.workers}
        return {frozenset({"cpu"}): "CPU ", frozenset({"cuda"}): "GPU "}.get(frozenset(devices), "")

    def table(self) -> str:
        """The table as text: job, status, frames, seconds, fps, error. An error is shown on one line and, when
        longer than :data:`ERROR_WIDTH` characters, cut to that width ending in "..." (the whole message is in
        the summary CSV, named by :meth:`summary`)."""
        cols = SUMMARY_COLUMNS[:6]
        rows = [[str(o.row()[c]) for c in cols[:-1]] + [_cut_error(o.error)] for o in self.outcomes]
        widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]

        def line(cells: list[str]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

        return "\n".join([line(list(cols)), line(["-" * w for w in widths]), *map(line, rows)])

    def __str__(self) -> str:
        return f"{self.table()}\n{self.summary()}"

    def _repr_html_(self) -> str:
        cols = SUMMARY_COLUMNS[:6]
        head = "".join(f"<th>{c}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(o.row()[c]))}</td>" for c in cols) + "</tr>"
                       for o in self.outcomes)
        return f"<p>{html.escape(self.summary())}</p><table><tr>{head}</tr>{body}</table>"

    def write_csv(self, path: str | os.PathLike) -> Path:
        """Write the table (:data:`SUMMARY_COLUMNS`) to ``path`` (temporary name, then renamed). Returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=SUMMARY_COLUMNS)
            writer.writeheader()
            for o in self.outcomes:
                writer.writerow(o.row())
        os.replace(tmp, path)
        return path


def _one_line(error: str) -> str:
    return " ".join(error.split())  # a multi-line message (the weights' Fix: lines) on one table row


def _cut_error(error: str) -> str:
    text = _one_line(error)
    return text if len(text) <= ERROR_WIDTH else text[:ERROR_WIDTH - 3].rstrip() + "..."


# ------------------------------------------------------------------------------------------------------------------
# The worker (a Ray actor; plain class so that importing this module needs no Ray)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _JobGate:
    """A worker's render gate as one job holds it: its acquire and release also mark the job's timeline
    (``job <name> rendering`` and ``job <name> rendered``)."""

    def __init__(self, gate: threading.BoundedSemaphore, mark):
        self.gate, self.mark = gate, mark

    def acquire(self) -> None:
        """Wait for a render slot, then mark that the job renders."""
        self.gate.acquire()
        self.mark("rendering")

    def release(self) -> None:
        """Mark that the job's last batch is rendered, then give its slot back."""
        self.mark("rendered")
        self.gate.release()


class BatchWorker:
    """One loaded pipeline on one device (a GPU, or the CPU), run as a Ray actor by :func:`run`.

    Args:
        weights_dir: The weights folder (visible to every worker).
        config: Base settings as a dict (InferenceConfig fields); the device is this worker's.
        device: ``"cuda"`` (the GPU Ray assigned) or ``"cpu"``.
        threads: torch CPU threads (None: leave torch's choice).
        render_slots: Clips and preparations that use the device at once (None: no limit). More jobs than that
            may run on the worker: each reads its audio and starts its encoder, then waits for a slot, and gives
            it back once its last batch is rendered, while its encoder finishes the file (see
            :func:`nbhelpers.engine.run`'s ``render_gate``).
    """

    def __init__(self, weights_dir: str, config: dict[str, Any], device: str, threads: int | None = None,
                 render_slots: int | None = None):
        import socket

        from . import progress
        from .config import InferenceConfig
        from .pipeline import MuseTalkPipeline

        self._events: list[tuple[str, float]] = [("start", time.time())]  # wall clock: the driver aligns them
        # This process is ours and runs torch only: diffusers and transformers need not import their Flax and
        # TensorFlow classes where jax, flax or tensorflow are installed (Colab has all three). Their switches
        # (USE_FLAX, USE_TF: diffusers.utils.import_utils, transformers 4.x utils/import_utils) are read at
        # import.
        for switch in ("USE_FLAX", "USE_TF"):
            os.environ.setdefault(switch, "0")
        progress.configure(disable=True)  # the driver shows the bars
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        base = InferenceConfig(**{k: v for k, v in config.items() if k not in ("device", "fp16")})
        self.pipe = MuseTalkPipeline.from_pretrained(weights_dir, version=base.version, device=device,
                                                     config=base.replace(device=device))
        self.name = f"{socket.gethostname()}/{os.getpid()} {self.pipe.device}"
        self._mark("pipeline")
        self.avatars: OrderedDict[str, Any] = OrderedDict()
        self.keep_avatars = 2  # besides those in use: a job may run beside another one (run()'s jobs_per_worker)
        self._lock = threading.Lock()  # the avatars, their use counts and the jobs' progress
        self._in_use: dict[str, int] = {}
        self._ready: set[str] = set()  # avatars whose device state is made (the first job makes it, alone)
        self._key_locks: dict[str, threading.Lock] = {}
        self._progress: dict[str, int] = {}
        self._job_started = threading.Event()  # a clip has started: it warms the kernels, warm_up is not needed
        self._render_gate = threading.BoundedSemaphore(int(render_slots)) if render_slots else None
        # The models load in a thread from now on, face parser and VAE first: preparing the first avatar needs only
        # those (the face parser first: it is ours, torch only, and masks the frames while diffusers imports for
        # the VAE, see prepare_avatar), and the UNet, whisper and their first CUDA kernels (warm_up) load while it
        # runs instead of in the first clip; a worker that waits for a face another one prepares is warm when the
        # face is ready.
        self._preload = threading.Thread(target=self._load_and_warm, args=(base,), name="batch-preload", daemon=True)
        self._preload.start()

    def _load_and_warm(self, base: Any) -> None:
        """Load every model an avatar job uses, then, unless a clip has started meanwhile (it warms them itself, and
        a warm-up beside it would only slow it down), run the UNet, the VAE decoder and whisper once at the batch
        of a clip, so that the first clip finds its kernels loaded. A failure here is left to the job that needs
        the model: it loads it again and reports the error."""
        try:
            for model in ("face_parser", "vae", "unet", "whisper", "feature_extractor", "pe"):  # preload()'s models
                getattr(self.pipe, model)
                self._mark(f"loaded {model}")
            self.pipe.preload("avatar", restore=base.restore)
            if self._job_started.is_set():
                self._mark("warm-up skipped (a clip started)")
                return
            self.pipe.warm_up(self.pipe.plan("clip", self.pipe.job_config(base), None, None).batch_size)
            self._mark("warm")
        except Exception:  # noqa: BLE001 - see the docstring
            pass

    def _mark(self, event: str) -> None:
        self._events.append((event, time.time()))

    def events(self) -> list[tuple[str, float]]:
        """What this worker did when, ``(event, wall-clock time.time())``: its start, pipeline made, each model
        loaded, warm, each prepare and job started, ready to generate, rendering and ended (``prepare <key>``,
        ``job <name>``, ``job <name> ready`` (its models and avatar loaded), ``job <name> rendering`` and
        ``job <name> rendered`` (it holds a render slot in between, when the worker has them), ``... done``)."""
        return list(self._events)

    def describe(self) -> str:
        """``host/pid device``."""
        return self.name

    def close(self) -> int:
        """Close every avatar this worker holds (their frames on local disk go with them; see
        :class:`nbhelpers.framestore.FrameStore`); the driver calls it once the batch's jobs are done, before it
        stops the worker. Returns how many were closed."""
        with self._lock:
            avatars = list(self.avatars.values())
            self.avatars.clear()
            self._ready.clear()
        for avatar in avatars:
            with contextlib.suppress(Exception):  # closing is tidying: a failure must not fail the batch
                avatar.close()
        self._mark("closed")
        return len(avatars)

    def progress(self) -> dict[str, int]:
        """``{job name: frames finished so far}`` of the jobs running now."""
        with self._lock:
            return dict(self._progress)

    def _config(self, config: dict[str, Any]):
        from .config import InferenceConfig

        return InferenceConfig(**config).replace(device=None, fp16=None)

    def _keep(self, key: str, avatar: Any) -> None:
        """Keep ``avatar`` as the most recent; close the oldest ones beyond ``keep_avatars`` that no job uses."""
        closing = []
        with self._lock:
            previous = self.avatars.get(key)
            if previous is not None and previous is not avatar:  # prepared again: the new one serves new jobs
                self._ready.discard(key)
                if not self._in_use.get(key):
                    closing.append(previous)
            self.avatars[key] = avatar
            self.avatars.move_to_end(key)
            idle = [k for k in self.avatars if not self._in_use.get(k) and k != key]
            while len(self.avatars) > self.keep_avatars and idle:
                old = idle.pop(0)
                closing.append(self.avatars.pop(old))
                self._ready.discard(old)
        for old in closing:
            old.close()

    def prepare(self, key: str, video: str, directory: str, config: dict[str, Any],
                box: tuple[int, int, int, int] | None) -> dict[str, Any]:
        """Prepare (or load from the cache) the avatar of ``video`` in ``directory``.

        Returns:
            ``{"ok": True, "loaded_from_cache": bool, "seconds": s, "worker": name, "timings": {stage: s}}``
            (:attr:`~nbhelpers.avatar.Avatar.prepare_timings`, empty when loaded) or ``{"ok": False, "error":
            text, ...}`` (no face, unreadable video...): errors are returned, not raised.
        """
        t0 = time.perf_counter()
        self._mark(f"prepare {key[:8]}")
        try:
            with self._render_gate or contextlib.nullcontext():
                avatar = self.pipe.prepare_avatar(video, directory, config=self._config(config), boxes=box)
            self._keep(key, avatar)
            self._mark(f"prepare {key[:8]} done")
            return {"ok": True, "loaded_from_cache": bool(avatar.loaded_from_cache),
                    "seconds": time.perf_counter() - t0, "worker": self.name,
                    "timings": dict(avatar.prepare_timings)}
        except Exception as exc:  # noqa: BLE001 - recorded for the job, the batch goes on
            return {"ok": False, "error": _error_text(exc), "seconds": time.perf_counter() - t0, "worker": self.name}

    def generate(self, key: str, directory: str, config: dict[str, Any], name: str, audio: str, output: str,
                 exit_at_frame: int | None = None) -> dict[str, Any]:
        """Generate one job's clip from the avatar in ``directory`` (loaded once per worker) and write ``output``.

        Args:
            key: The avatar's group key.
            directory: The prepared avatar folder.
            config: The job's settings (InferenceConfig fields).
            name: The job's name (for progress).
            audio: Speech file.
            output: MP4 to write (temporary name, renamed when complete).
            exit_at_frame: For tests only: the worker process exits (``os._exit``) when it has made this frame,
                as a killed worker would.

        Returns:
            ``{"ok": True, "frames": n, "seconds": s, "worker": name}`` or ``{"ok": False, "error": text, ...}``.
        """
        t0 = time.perf_counter()
        with self._lock:
            self._progress[name] = 0
            self._in_use[key] = self._in_use.get(key, 0) + 1
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        self._mark(f"job {name}")
        self._job_started.set()

        def on_frame(t: int, frame: Any) -> None:
            with self._lock:
                self._progress[name] = t + 1
            if exit_at_frame is not None and t >= exit_at_frame:
                os._exit(3)

        try:
            with key_lock:  # one thread loads the avatar and makes its device state; a second job waits for it
                avatar = self.avatars.get(key)
                if avatar is None:
                    avatar = self.pipe.load_avatar(directory, config=self._config(config))
                self._keep(key, avatar)
                if key not in self._ready:
                    avatar.load_models()
                    self._ready.add(key)
            self._mark(f"job {name} ready")
            gate = (_JobGate(self._render_gate, lambda what: self._mark(f"job {name} {what}"))
                    if self._render_gate is not None else None)
            result = avatar.generate(audio, output=output, frame_callback=on_frame, render_gate=gate)
            self._mark(f"job {name} done")
            return {"ok": True, "frames": int(result.n_frames), "seconds": time.perf_counter() - t0,
                    "worker": self.name, "timings": {k: round(float(v), 4) for k, v in result.timings.items()
                                                     if not k.startswith("peak_gib")}}
        except Exception as exc:  # noqa: BLE001 - recorded for the job, the batch goes on
            return {"ok": False, "error": _error_text(exc), "seconds": time.perf_counter() - t0, "worker": self.name}
        finally:
            with self._lock:
                self._progress.pop(name, None)
                self._in_use[key] -= 1


def worker_gib(config: Any, jobs: int = 1) -> float:
    """GPU memory one batch worker may take at its peak, GiB, by the planner's memory model: every model of an
    avatar job resident (a worker loads them all, :meth:`BatchWorker.__init__`), then the larger of a clip's
    generate stage at the clip cap and an avatar's encode at the preparation cap, plus the CUDA context and the
    workspaces. Frames are taken at the model's default size (1920x1080), so smaller videos need less.

    Args:
        config: The batch's :class:`~nbhelpers.config.InferenceConfig` (``fp16=False`` doubles the figure).
        jobs: Jobs the worker runs at once (:func:`run`'s ``jobs_per_worker``): each adds its batch's share.

    Returns:
        GiB (a T4-sized figure for one job: about 13.8 at fp16).

    Source: :mod:`nbhelpers.gpu.model` (``stage_memory``, ``MemoryModel`` caps and their measurements).
    """
    from .gpu.model import MEMORY_MODEL as mm
    from .gpu.model import stage_memory

    fp16 = config.fp16 is not False
    clip_a, clip_b = stage_memory("clip", fp16=fp16)["generate"]
    enc_a, enc_b = stage_memory("avatar", fp16=fp16)["encode"]
    core = mm.core_fixed_gib * (1.0 if fp16 else mm.fp32_factor)  # the UNet, whisper and VAE stay loaded
    peak = max(clip_a + jobs * clip_b * mm.cap_clip, core + enc_a + jobs * enc_b * mm.cap_avatar)
    return peak + mm.context_gib + mm.workspace_gib


def choose_jobs_per_worker(config: Any, free_gib: Mapping[int, float] | None, workers_per_gpu: int, *,
                           joining: bool) -> tuple[int, str]:
    """How many jobs each worker runs at once when the caller did not say (``jobs_per_worker=None``).

    A clip's GPU work (UNet, decode, paste-back) and its CPU tail (libx264 finishing the file after the last
    frame, the audio mux, the rename) alternate in one job. A second job in the same worker, in a thread over the
    same loaded models, starts its GPU work while the first one's tail runs (an H200, 20 clips of 10 s: one worker
    with one job at a time 2.6-3.0 s a job in step with another worker, with two at once 1.6-1.8 s for each of
    the two, 0.9 s of wall a job; three at once gained nothing, 2.2-3.6 s each: bench/RESULTS.md). Two jobs are
    chosen where every GPU used has free memory for ``workers_per_gpu`` workers' peaks with two jobs each
    (:func:`worker_gib`) within the planner's safety margin; else one, also on the CPU (its cores are the torch
    threads'), when the memory cannot be read, or on a cluster's GPUs (not visible from here).

    Args:
        config: The batch's :class:`~nbhelpers.config.InferenceConfig`.
        free_gib: ``{GPU index: free GiB}`` of the GPUs Ray will use, or None when unknown.
        workers_per_gpu: Workers sharing each GPU.
        joining: True when the batch joins a running cluster.

    Returns:
        ``(jobs per worker, why)``.
    """
    from .gpu.model import MEMORY_MODEL as mm

    if config.device == "cpu":
        return 1, ""
    if joining or not free_gib:
        return 1, "1 job at once per worker (--jobs-per-worker 2 for two)"
    need, least = workers_per_gpu * worker_gib(config, jobs=2), min(free_gib.values())
    if need <= least * (1.0 - mm.safety_fraction):
        return 2, f"2 jobs at once per worker ({need:.1f} GiB of peaks fit)"
    return 1, f"1 job at once per worker: two each would need {need:.1f} GiB"


# ------------------------------------------------------------------------------------------------------------------
# Ray


def init_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None):
    """Connect to Ray: join the cluster at ``address``, or start Ray on this machine.

    A local start is kept small so that it is quick on a 2-core machine: ``num_cpus`` (default 2, at most the
    cores here) bounds the worker processes Ray starts ahead, no dashboard, workers' output not forwarded to this
    process, a 256 MiB object store (the batch passes only file names through it). Ray's notice that token
    authentication is on (its default since 2.59) is dropped by a logging filter during the start; its other
    warnings and errors are shown as before. Ray's startup can time out on a heavily loaded machine (its agents
    must start within seconds); that is tried once more. Does nothing when Ray is already initialised in this
    process.

    Args:
        address: ``"auto"``, ``"HOST:PORT"`` or ``"ray://HOST:PORT"`` of a running cluster; None joins the one in
            ``$RAY_ADDRESS`` when set, else starts one here.
        num_cpus: CPUs the local Ray offers (CPU workers take one each).
        num_gpus: GPUs the local Ray offers (default: all it finds).

    Returns:
        True when this call started or joined Ray (and the caller should shut it down), False when it was running.

    Raises:
        MissingDependencyError: Ray is not installed (the message gives the install line).
    """
    ray = _require_ray()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _ray_init(ray, address=address, log_to_driver=False, configure_logging=False)
        return True
    cores = os.cpu_count() or 1
    # address="local": always a new instance (a bare ray.init() would join a cluster someone `ray start`ed here)
    options = dict(address="local", num_cpus=max(1, min(int(num_cpus or 2), cores)), num_gpus=num_gpus,
                   include_dashboard=False,
                   log_to_driver=False, configure_logging=False, object_store_memory=256 * 2**20)
    try:
        _ray_init(ray, **options)
    except Exception as exc:  # noqa: BLE001 - Ray's own startup timeout on a loaded machine: try once more
        if "timed out during startup" not in str(exc):
            raise
        ray.shutdown()
        _ray_init(ray, **options)
    return True


# Ray (2.59 and later) turns token authentication on for a new local instance and, where the logging is left to
# the program (configure_logging=False), logs this notice of its default at every start; its warnings and errors
# otherwise reach the program as before (docs.ray.io ray-security/token-auth.html).
_AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster."


class _DropAuthNotice:
    """A logging filter that drops Ray's notice that token authentication is on (and nothing else)."""

    def filter(self, record: Any) -> bool:
        """False for the notice, True for every other record."""
        try:
            return not str(record.getMessage()).startswith(_AUTH_NOTICE)
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is passed on, as it was
            return True


def _ray_init(ray, **options) -> None:
    """``ray.init(**options)`` without Ray's token-authentication notice (see :data:`_AUTH_NOTICE`), the caller's
    SIGTERM handler kept."""
    import logging
    import signal

    notice_logger, quiet = logging.getLogger(_AUTH_NOTICE_LOGGER), _DropAuthNotice()
    notice_logger.addFilter(quiet)
    in_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        ray.init(**options)
    finally:
        notice_logger.removeFilter(quiet)
        # ray.init replaces the driver's SIGTERM handler with one that calls sys.exit(signum)
        # (ray/_private/worker.py, init: "terminate any signal before connecting driver"); the program's own is put
        # back, so that its clean-up on SIGTERM (the command line's: partial outputs removed, exit status 143) runs.
        if in_main and sigterm is not None:
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signal.SIGTERM, sigterm)


def _remove_stale_frames() -> None:
    """:func:`nbhelpers.framestore.remove_stale_frames` in this machine's temporary folder, never raising."""
    from .framestore import remove_stale_frames

    with contextlib.suppress(Exception):
        remove_stale_frames()


def shutdown_ray() -> None:
    """``ray.shutdown()``, a local instance's autoscaler monitor stopped first (what :func:`run` calls at its end).

    Ray stops its processes one kind after another, each given a second to exit after SIGTERM
    (``ray/_private/node.py`` ``_kill_process_impl``). Its autoscaler monitor answers SIGTERM by reporting to the
    GCS, which is stopped before it, and so takes the whole second (``ray/autoscaler/_private/monitor.py``
    ``_signal_handler``; measured here: 1.03 s of a 1.6 s shutdown). An instance started on this machine has no
    autoscaling to finish, so its monitor is killed at once. The process table this reads is Ray's own
    (``ray._private.worker._global_node.all_processes``); where it is not there (another Ray version, a joined
    cluster, whose processes are not ours), Ray stops everything as before.
    """
    ray = _require_ray()
    try:
        node = ray._private.worker._global_node
        monitors = node.all_processes.get("monitor", []) if node is not None and node.is_head() else []
        for info in monitors:
            if info.process.poll() is None:
                info.process.kill()
                info.process.wait(timeout=5)
    except Exception:  # noqa: BLE001 - Ray's internals differ: its own shutdown stops the monitor
        pass
    ray.shutdown()


def _is_worker_loss(ray, exc: BaseException) -> bool:
    """A Ray error that means the worker process went away (retry the job), not a failure of the job."""
    lost = tuple(getattr(ray.exceptions, n) for n in ("RayActorError", "WorkerCrashedError", "NodeDiedError",
                                                      "OutOfMemoryError", "ObjectLostError")
                 if hasattr(ray.exceptions, n))
    return isinstance(exc, lost)


# ------------------------------------------------------------------------------------------------------------------
# The run


@dataclass
class _Group:
    key: str
    video: Path
    directory: Path
    config: dict[str, Any]
    box: tuple[int, int, int, int] | None
    queue: deque = field(default_factory=deque)
    state: str = "pending"  # pending, preparing, ready, failed
    error: str = ""
    attempts: int = 0


def _group_key(video_fp: dict[str, Any], config: Any, box: Any) -> str:
    from .avatar import CACHED_FIELDS

    fields = {f: getattr(config, f) for f in CACHED_FIELDS}
    text = json.dumps({"video": video_fp["sha256"], "settings": fields, "box": box}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run(jobs: str | os.PathLike | Sequence[Job | Mapping[str, Any]], *, weights_dir: str | os.PathLike | None = None,
        config: Any = None, address: str | None = None, cache_dir: str | os.PathLike | None = None,
        summary: str | os.PathLike | bool | None = None, cpu_workers: int = 1, workers_per_gpu: int | None = None,
        jobs_per_worker: int | None = None, gpus: int | None = None, max_attempts: int = 3, rerun: bool = False,
        _exit_at: Mapping[str, int] | None = None) -> BatchResult:
    """Run a batch of lip-sync jobs on Ray; see the module docstring for what is guaranteed.

    Args:
        jobs: A jobs file (CSV or JSON lines, see :func:`read_jobs`), or a sequence of :class:`Job` or dicts with
            ``video``, ``audio``, ``output`` and optional settings.
        weights_dir: Weights folder, visible to every worker (default :func:`nbhelpers.weights.default_dir`).
        config: :class:`~nbhelpers.config.InferenceConfig` of every job (a job's settings override it); its
            ``device="cpu"`` keeps the workers on the CPU even where there are GPUs.
        address: Ray cluster to join (``"auto"``, ``"HOST:PORT"``); None starts Ray here (see :func:`init_ray`).
            On a cluster every path (jobs, weights, outputs, cache) must be on storage all nodes see.
        cache_dir: Folder of the avatar cache (default ``<outputs folder>/avatar-cache``; kept between runs).
        summary: CSV of the summary table; None = ``<outputs folder>/batch-summary.csv``; False writes none.
        cpu_workers: CPU workers when Ray offers no GPU (each holds its own models; torch threads are shared
            out between them). At most one per CPU Ray offers, each taking one: more are cut to that, with a
            :class:`~nbhelpers.errors.FallbackWarning`.
        workers_per_gpu: Worker processes sharing each GPU (None: 1). One is the fastest measured: its jobs, in
            threads, share one CUDA context and one set of models, while processes on one GPU time-share it (an
            H200, 20 clips of 10 s, each arm in a fresh process: one worker with two jobs at once 49.4 s, two
            workers with two each 56.1 s; their jobs 1.6-1.8 s against 2.4-6.9 s, bench/RESULTS.md); each
            worker also loads the models and imports torch and diffusers again (17-20 s there).
        jobs_per_worker: Clips (and avatar preparations) each worker renders at once, in threads sharing its
            loaded models. A GPU worker holds as many jobs again (:data:`WAITING_PER_SLOT`), which read their audio
            and start their encoders meanwhile and render as soon as a slot is free: a clip gives its slot back
            when its last batch is rendered, so its encoder finishes the file while the next clip renders. None: 2
            on a GPU where the free memory holds every worker's peak with two jobs (:func:`worker_gib`), else 1
            (always 1 on the CPU, whose cores the torch threads already use; a CPU worker holds only that job).
        gpus: GPUs to use (default all that Ray offers).
        max_attempts: Times a job is started before a worker dying during it counts as its failure.
        rerun: Make every output again, even finished ones.
        _exit_at: For tests: ``{job name: frame}``; the worker running that job exits at that frame on the
            job's first attempt, as a killed worker would.

    Returns:
        :class:`BatchResult` (also written to ``summary``).

    Raises:
        MissingDependencyError: Ray is not installed (the message gives the install line).
        InputError: The jobs file or a job is malformed, two jobs share an output, an option is invalid, an
            output, cache or summary folder cannot be written in (:func:`check_writable`), the summary would
            replace another file (:func:`check_summary_path`), or another batch holds the avatar cache's or the
            outputs folder's lock; raised before Ray starts. (A missing or unreadable media file fails only its
            job.)
        WeightsError: Weight files are missing.
        KeyboardInterrupt: Ctrl-C (or :class:`~nbhelpers.errors.Terminated`, SIGTERM on the command line): raised
            once the workers are down, their partial files removed and the summary written with the unfinished
            jobs as ``"interrupted"``.
    """
    from .config import InferenceConfig
    from .pipeline import check_weights_dir

    t0 = time.perf_counter()
    job_list = read_jobs(jobs) if isinstance(jobs, (str, os.PathLike)) else check_jobs(jobs)
    config = config or InferenceConfig()
    for name, value in (("cpu_workers", cpu_workers), ("workers_per_gpu", 1 if workers_per_gpu is None
                                                       else workers_per_gpu),
                        ("jobs_per_worker", 1 if jobs_per_worker is None else jobs_per_worker),
                        ("max_attempts", max_attempts)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{name} must be a positive whole number; got {value!r}.")
    if gpus is not None and (not isinstance(gpus, int) or gpus < 0):
        raise InputError(f"gpus must be a whole number >= 0 or None (all); got {gpus!r}.")
    weights_path = check_weights_dir(weights_dir, config.version)
    outputs_dir = outputs_folder(job_list)
    cache_path = Path(cache_dir).expanduser().resolve() if cache_dir is not None else outputs_dir / CACHE_NAME
    summary_path = None if summary is False else (Path(summary).expanduser().resolve() if summary not in (None, True)
                                                   else outputs_dir / SUMMARY_NAME)
    check_writable([j.output.parent for j in job_list] + [cache_path]
                   + ([summary_path.parent] if summary_path is not None else []))
    if summary_path is not None:
        check_summary_path(summary_path, job_list, jobs if isinstance(jobs, (str, os.PathLike)) else None)
    job_configs = {}
    for job in job_list:  # settings are validated before anything starts
        changes = {k: v for k, v in job.settings.items() if k != "box"}
        if "box" in job.settings:
            changes["landmark_backend"] = "boxes"
        try:
            job_configs[job.name] = config.replace(**changes)
        except InputError as exc:
            raise InputError(_setting_error(job, config, changes, exc)) from None
    _require_ray()
    with _BatchLock(cache_path), _BatchLock(outputs_dir, ".batch.lock", "the outputs folder"):
        return _run_locked(job_list, config, job_configs, weights_path, cache_path, summary_path, address,
                           cpu_workers, workers_per_gpu, jobs_per_worker, gpus, max_attempts, rerun, _exit_at, t0)


def _run_locked(job_list, config, job_configs, weights_path, cache_path, summary_path, address, cpu_workers,
                workers_per_gpu, jobs_per_worker, gpus, max_attempts, rerun, _exit_at, t0) -> BatchResult:
    """:func:`run` once its arguments are checked and the batch holds its avatar cache's lock."""
    from .pipeline import check_audio, check_video

    # 1. what is finished, what fails before any worker (missing or unreadable files), and the groups by face.
    # Ray starts in this thread meanwhile (its start is seconds of waiting for its own processes), unless every
    # job looks finished (its output is there with its record) or failed at these checks last time with the same
    # inputs (its hint): then a repeated batch with nothing left to run does not start Ray at all.
    fingerprints = _Fingerprints()
    weights_state = _weights_state(weights_path, config.version)
    for job in job_list:
        remove_partials(job.output)
    likely_work = _likely_work(job_list, cache_path, rerun)
    started = False
    phases: dict[str, float] = {}
    # A local Ray starts this many worker processes ahead, as soon as it is up: the workers' actors find them
    # started (a GPU worker takes no CPU of Ray's count, so this only sets how many are started ahead).
    # Jobs per worker, when not given: from the free memory of this machine's GPUs (NVML or nvidia-smi, no CUDA
    # here), which also says how many GPUs a local Ray will offer.
    joining = bool(address or os.environ.get("RAY_ADDRESS"))
    free = None
    if config.device != "cpu" and not joining:
        from .gpu.device import free_memory_by_index

        free = free_memory_by_index()
        if free and gpus is not None:
            free = dict(sorted(free.items())[:gpus])
    if workers_per_gpu is None:
        workers_per_gpu, workers_note = 1, "1 worker per GPU"
    else:
        workers_note = f"{workers_per_gpu} worker(s) per GPU, as asked"
    if jobs_per_worker is None:
        jobs_per_worker, jobs_note = choose_jobs_per_worker(config, free, workers_per_gpu, joining=joining)
    else:
        jobs_note = f"{jobs_per_worker} job(s) at once per worker, as asked"
    workers_note = "; ".join(n for n in (workers_note, jobs_note) if n)
    n_gpu_guess = gpus if gpus is not None else (len(free) if free else 1)
    ahead = max(cpu_workers, workers_per_gpu * max(1, n_gpu_guess))
    outcomes: dict[str, JobOutcome] = {}
    starting = False
    try:
        if likely_work:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(1, thread_name_prefix="batch-checks") as pool:
                probing = pool.submit(_probe_inputs, job_list, fingerprints, check_video, check_audio)
                try:
                    starting = True  # a stop during Ray's start still shuts down what it started
                    started = init_ray(address, num_cpus=ahead, num_gpus=gpus if address is None else None)
                    starting = False
                finally:
                    probed = probing.result()  # the probe's own errors (none expected) come after Ray's
            phases["ray_start"] = time.perf_counter() - t0
        else:
            probed = _probe_inputs(job_list, fingerprints, check_video, check_audio)
        video_errors, audio_infos, video_infos = probed
        inputs_of: dict[str, dict[str, Any]] = {}
        groups: dict[str, _Group] = {}
        group_of: dict[str, str] = {}
        expected_frames: dict[str, int] = {}
        for job in job_list:
            cfg = job_configs[job.name]
            error = (video_errors.get(job.video) or audio_infos[job.audio][1] or _box_error(job, video_infos)
                     or _short_audio_error(audio_infos[job.audio][0]))
            if error:
                outcomes[job.name] = JobOutcome(job.name, "failed", 0, 0.0, error, job.video, job.audio, job.output)
                _write_hint(cache_path, job, error)
                continue
            _drop_hint(cache_path, job)  # it passed the checks: finished, or to run (a worker's failure needs Ray)
            audio_info = audio_infos[job.audio][0]
            box = job.settings.get("box")
            inputs = {"video": fingerprints(job.video), "audio": fingerprints(job.audio),
                      "box": list(box) if box else None,
                      "settings": {k: v for k, v in cfg.to_dict().items() if k not in ("device", "fp16", "batch_size")},
                      "weights": weights_state}
            inputs_of[job.name] = inputs
            rec = None if rerun else _finished(job, inputs)
            if rec is not None:
                outcomes[job.name] = JobOutcome(job.name, "skipped", int(rec.get("frames", 0)), 0.0, "", job.video,
                                                job.audio, job.output, 0, str(rec.get("worker", "")))
                continue
            key = _group_key(inputs["video"], cfg, box)
            if key not in groups:
                groups[key] = _Group(key, job.video, cache_path / f"{job.video.stem}-{key}",
                                     {k: v for k, v in cfg.to_dict().items() if k not in ("device", "fp16")}, box)
            groups[key].queue.append(job)
            group_of[job.name] = key
            expected_frames[job.name] = int((audio_info.duration_s or 0) * 25)

        todo = sum(len(g.queue) for g in groups.values())
        worker_names: list[str] = []
        avatars = {"prepared": 0, "loaded": 0}
        timeline: dict[str, tuple[tuple[str, float], ...]] = {}
        preparations: list[dict[str, Any]] = []
        if todo:
            phases["checks"] = time.perf_counter() - t0
            if not likely_work:  # every output had a record, yet some input or setting changed
                starting = True
                started = init_ray(address, num_cpus=ahead, num_gpus=gpus if address is None else None)
                starting = False
                phases["ray_start"] = time.perf_counter() - t0
            worker_names = _dispatch(job_list, groups, group_of, job_configs, expected_frames, outcomes, inputs_of,
                                     weights_path, config, cpu_workers, workers_per_gpu, jobs_per_worker, gpus,
                                     max_attempts,
                                     dict(_exit_at or {}), avatars, len(job_list) - todo, phases, t0,
                                     timeline, preparations)
        else:
            phases.clear()
    except BaseException as exc:  # Ctrl-C, SIGTERM (the command line's), an error: nothing half-made is left
        try:
            if started or starting:
                started = starting = False
                shutdown_ray()  # the workers stop before their partial files are removed
        finally:  # a second Ctrl-C during the shutdown still leaves no partial file
            for job in job_list:
                remove_partials(job.output)
            if summary_path is not None:
                _write_stopped_summary(job_list, outcomes, summary_path, exc, t0)
        raise
    finally:
        if started:  # before returning: Ray must be down when the caller next uses it
            shutdown_ray()
        if address is None:  # the workers ran here: frames a stopped one could not remove go now
            _remove_stale_frames()
    for job in job_list:
        remove_partials(job.output)
    result = BatchResult(outcomes=tuple(outcomes[j.name] for j in job_list), summary_csv=summary_path,
                         wall_s=time.perf_counter() - t0, workers=tuple(worker_names), avatars=avatars,
                         workers_note=workers_note if any("cuda" in w for w in worker_names) else "",
                         phases={k: round(v, 3) for k, v in phases.items()}, timeline=timeline,
                         preparations=tuple(preparations))
    if summary_path is not None:
        result.write_csv(summary_path)
    return result


def _write_stopped_summary(job_list: Sequence[Job], outcomes: Mapping[str, JobOutcome], path: Path,
                           exc: BaseException, t0: float) -> None:
    """Write the summary of a batch stopped before its end (Ctrl-C, SIGTERM, an error): the jobs settled so far
    as they ended, every other one ``"interrupted"``. A summary that cannot be written is left out (the stop's
    own exception is what the caller sees)."""
    from .errors import Terminated

    if isinstance(exc, Terminated) or Terminated.pending:
        why = "terminated (SIGTERM)"
    else:
        why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else f"stopped by {type(exc).__name__}"
    rows = tuple(outcomes.get(j.name) or JobOutcome(j.name, "interrupted", 0, 0.0, f"the batch was {why} before this "
                                                    "job ended; run the batch again to make it", j.video, j.audio,
                                                    j.output) for j in job_list)
    with contextlib.suppress(OSError):
        BatchResult(outcomes=rows, summary_csv=path, wall_s=time.perf_counter() - t0).write_csv(path)


def _short_audio_error(info: Any) -> str:
    """The error of a job whose audio is shorter than one 25 fps frame by its container's duration ("" when it is
    long enough or the duration is unknown), so that it fails at the checks, not on a worker, which would refuse it
    there (:func:`nbhelpers.pipeline.speech_frames`)."""
    from .constants import FPS

    seconds = getattr(info, "duration_s", None)
    if seconds is None or seconds >= 1.0 / FPS:
        return ""
    return (f"InputError: audio {str(info.path)!r} lasts {seconds:.3f} s, shorter than one frame (1/{FPS} s); give "
            "at least 0.04 s of speech.")


def _box_error(job: Job, video_infos: Mapping[Path, Any]) -> str:
    """The error of a job whose crop box does not fit its video's frames ("" when it fits or there is none), as
    :func:`nbhelpers.pipeline.check_boxes` finds it, so that it fails at the checks, not on a worker."""
    from .pipeline import check_boxes

    box, info = job.settings.get("box"), video_infos.get(job.video)
    if box is None or info is None:
        return ""
    try:
        check_boxes(box, job.video, info)
    except NbHelpersError as exc:  # the message names the Python argument "boxes"; a job's setting is "box"
        text = _error_text(exc)
        return text.replace(": boxes = ", ": box = ", 1).replace(": boxes must", ": box must", 1)
    return ""


def _input_error_text(exc: BaseException) -> str:
    """A probe's error as a job's: a missing file's advice is about the jobs file (its paths are relative to its
    folder), not the upload cell of a notebook that the pipeline's own message names."""
    return _error_text(exc).replace("(upload the file first in notebook 02_media, or give the full path)",
                                    "(a relative path in a jobs file is relative to its folder)")


def _probe_inputs(job_list: Sequence[Job], fingerprints: _Fingerprints, check_video, check_audio):
    """Probe every distinct video and audio once, several at a time (each probe is an ffprobe run or a file
    read, waiting on another process or the disk), and fingerprint the readable ones.

    Returns:
        ``(video_errors, audio_infos, video_infos)``: ``{video: "<Type>: message"}`` for unreadable videos only,
        ``{audio: (info, "")}`` or ``{audio: (None, "<Type>: message")}`` for every audio, and ``{video: info}``
        (:class:`~nbhelpers.media.MediaInfo`) for the readable videos.
    """
    from concurrent.futures import ThreadPoolExecutor

    def video(path: Path) -> tuple[Path, str, Any]:
        try:
            info = check_video(path)[1]
            fingerprints(path)
            return path, "", info
        except (NbHelpersError, OSError) as exc:
            return path, _input_error_text(exc), None

    def audio(path: Path) -> tuple[Path, tuple[Any, str]]:
        try:
            info = check_audio(path)[1]
            fingerprints(path)
            return path, (info, "")
        except (NbHelpersError, OSError) as exc:
            return path, (None, _input_error_text(exc))

    videos = list(dict.fromkeys(j.video for j in job_list))
    audios = list(dict.fromkeys(j.audio for j in job_list))
    with ThreadPoolExecutor(min(8, max(2, os.cpu_count() or 1)), thread_name_prefix="batch-probe") as pool:
        video_results = list(pool.map(video, videos))
        audio_results = list(pool.map(audio, audios))
    return ({p: e for p, e, _ in video_results if e}, dict(audio_results),
            {p: info for p, e, info in video_results if not e})


def _cpu_worker_count(asked: int, offered: int, needed: int) -> int:
    """CPU workers to start: ``asked``, but no more than the ``offered`` CPUs of the Ray cluster, each worker taking
    one (``num_cpus=1``): Ray would leave the others waiting for a CPU that never frees, and the batch waiting for
    them (a local Ray offers this machine's cores, :func:`init_ray`). Warns (FallbackWarning) when it gives fewer
    than the ``needed`` workers (``asked``, or the jobs to run where there are fewer)."""
    import warnings

    count = max(1, min(needed, offered or 1))
    if count < needed:
        warnings.warn(f"cpu_workers={asked} is more than the {offered or 1} CPU(s) Ray offers, and each worker takes "
                      f"one: running {count} worker(s). (Each worker also holds its own models; more workers than "
                      "cores would only share the cores.)", FallbackWarning, stacklevel=4)
    return count


def _close_workers(ray, actors: list[Any], timeout_s: float = 10.0) -> None:
    """Ask each worker to close its avatars (:meth:`BatchWorker.close`), so that their frames on its machine's
    disk are removed before ``ray.kill`` stops it, waiting at most ``timeout_s``. A worker that does not answer is
    stopped all the same; what it leaves, the next frame store on its machine removes
    (:func:`nbhelpers.framestore.remove_stale_frames`)."""
    try:
        ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - tidying must not cost the batch its outcomes
        pass


def _collect_timeline(ray, actors: list[Any], names: list[str], t0: float, timeline: dict) -> None:
    """Each live worker's :meth:`BatchWorker.events`, as seconds since ``t0`` (this process's perf_counter) by the
    wall clock, into ``timeline`` under the worker's name; a worker that does not answer within 5 s is left out."""
    start_wall = time.time() - (time.perf_counter() - t0)
    try:
        refs = [a.events.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=5.0)
    except Exception:  # noqa: BLE001 - the timeline is a report: it must not cost the batch its outcomes
        return
    for i, ref in enumerate(refs):
        if ref not in ready:
            continue
        try:
            events = ray.get(ref)
        except Exception:  # noqa: BLE001 - a worker that died: no timeline, the outcomes are what count
            continue
        timeline[names[i]] = tuple((str(e), round(float(w) - start_wall, 3)) for e, w in events)


def _dispatch(job_list, groups, group_of, job_configs, expected_frames, outcomes, inputs_of, weights_path, config,
              cpu_workers, workers_per_gpu, slots, gpus, max_attempts, exit_at, avatars, already, phases, t0,
              timeline, preparations) -> list[str]:
    """Start the workers on the running Ray, hand out prepares and jobs until every job has an outcome, stop the
    workers (the times of its phases, seconds since ``t0``, go into ``phases``; each worker's events, seconds since
    ``t0`` by the wall clock, into ``timeline``; each preparation that ended, into ``preparations``)."""
    from . import progress

    ray = _require_ray()
    todo = sum(len(g.queue) for g in groups.values())
    phases["prepare_s"] = 0.0
    actors: list[Any] = []
    try:
        n_gpu = 0 if config.device == "cpu" else int(ray.cluster_resources().get("GPU", 0))
        if gpus is not None:
            n_gpu = min(n_gpu, gpus)
        cores = os.cpu_count() or 1
        if n_gpu:
            n_workers = n_gpu * workers_per_gpu
            options = {"num_gpus": 1 / workers_per_gpu, "num_cpus": 0}
            device = "cuda"
        else:
            n_workers = _cpu_worker_count(cpu_workers, int(ray.cluster_resources().get("CPU", 0)), min(todo, cpu_workers))
            options = {"num_cpus": 1}
            device = "cpu"
        n_workers = max(1, min(n_workers, todo))
        threads = max(1, cores // n_workers)
        # A GPU worker renders `slots` clips at once and holds as many more jobs, which read their audio and start
        # their encoders meanwhile and render as soon as a clip's last batch is done (its encoder then finishes the
        # file beside them): the GPU does not wait for the clips' starts and ends. The CPU's cores are the torch
        # threads' already: a CPU worker holds only the jobs it runs.
        depth = slots * (1 + WAITING_PER_SLOT) if device == "cuda" else slots
        # Threads per worker: its calls, and one more for the progress polls.
        remote = ray.remote(BatchWorker).options(max_restarts=-1, max_task_retries=0, max_concurrency=depth + 1,
                                                 **options)
        base = {k: v for k, v in config.to_dict().items()}
        actors = [remote.remote(str(weights_path), base, device, threads, slots) for _ in range(n_workers)]
        try:
            names = ray.get([a.describe.remote() for a in actors])
            phases["workers_ready"] = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - a worker that cannot load the pipeline stops the batch
            raise NbHelpersError(f"the batch workers could not start ({_error_text(exc)[:2000]}). Check that "
                                 "nbhelpers, its weights folder and the media are there on every Ray node.") from exc

        job_by_name = {j.name: j for j in job_list}
        holds: list[set[str]] = [set() for _ in actors]
        busy: dict[Any, tuple[int, str, Any, int]] = {}  # ref -> (actor index, kind, group or job, attempt)
        attempts: dict[str, int] = {}
        frames_done: dict[str, int] = {}
        running: dict[int, set[str]] = {}
        polls: dict[Any, int] = {}
        last_poll = 0.0
        with progress.bar(total=len(job_list), desc="batch jobs", unit="job", initial=already) as jobs_bar, \
                progress.bar(total=sum(expected_frames.values()), desc="batch frames", unit="frame") as frames_bar:

            def finish(job: Job, outcome: JobOutcome) -> None:
                outcomes[job.name] = dataclasses.replace(outcome, ended_s=round(time.perf_counter() - t0, 3))
                jobs_bar.update(1)
                shown = frames_done.pop(job.name, 0)
                frames_bar.update(max(outcome.frames - shown, 0) if outcome.status == "done" else 0)

            def fail_group(group: _Group) -> None:
                while group.queue:
                    job = group.queue.popleft()
                    finish(job, JobOutcome(job.name, "failed", 0, 0.0, group.error, job.video, job.audio, job.output,
                                           attempts.get(job.name, 0)))

            def next_work(i: int, jobs_only: bool):
                ready = [g for g in groups.values() if g.state == "ready" and g.queue]
                mine = [g for g in ready if g.key in holds[i]]
                if mine:
                    return "job", max(mine, key=lambda g: len(g.queue))
                pending = [g for g in groups.values() if g.state == "pending" and g.queue]
                if pending and not jobs_only:
                    return "prepare", pending[0]
                if ready:  # load a face another worker prepared: the one with most work left per holder
                    return "job", max(ready, key=lambda g: len(g.queue) / (1 + sum(g.key in h for h in holds)))
                return None

            def submit(i: int, held: int) -> bool:
                # a call beyond the worker's render slots (it holds `held` calls) waits for one: a job (its encoder
                # starts meanwhile), never a preparation that another worker could start at once
                work = next_work(i, jobs_only=held >= slots)
                if work is None:
                    return False
                kind, group = work
                if kind == "prepare":
                    group.state = "preparing"
                    group.attempts += 1
                    ref = actors[i].prepare.remote(group.key, str(group.video), str(group.directory), group.config,
                                                   group.box)
                    busy[ref] = (i, "prepare", group, group.attempts)
                else:
                    job = group.queue.popleft()
                    n = attempts[job.name] = attempts.get(job.name, 0) + 1
                    cfg = {k: v for k, v in job_configs[job.name].to_dict().items() if k not in ("device", "fp16")}
                    kill = exit_at.get(job.name) if n == 1 else None
                    ref = actors[i].generate.remote(group.key, str(group.directory), cfg, job.name, str(job.audio),
                                                    str(job.output), kill)
                    busy[ref] = (i, "job", job, n)
                    running.setdefault(i, set()).add(job.name)
                    phases.setdefault("first_job", time.perf_counter() - t0)
                return True

            # Each worker runs up to `slots` prepares and jobs at once (jobs_per_worker), and holds up to `depth`
            # calls in all (the jobs beyond `slots` wait for a render slot on the worker); one that died takes work
            # again once a ping finds it back (Ray restarts it), its calls that were lost counted out one by one.
            in_flight = [0] * len(actors)
            alive = [True] * len(actors)
            ping_at: dict[int, float] = {}  # restarting workers: when to ask again whether they are back
            pings_lost: dict[int, int] = {}

            def working() -> bool:
                return any(kind in ("prepare", "job") for _, kind, _, _ in busy.values())

            while any(g.queue for g in groups.values()) or working():
                for level in range(depth):  # breadth first: every worker gets work before any gets a second
                    for i in range(len(actors)):
                        if alive[i] and in_flight[i] <= level and submit(i, in_flight[i]):
                            in_flight[i] += 1
                now = time.perf_counter()
                for i, when in list(ping_at.items()):
                    if now >= when:
                        del ping_at[i]
                        busy[actors[i].describe.remote()] = (i, "ping", None, 0)
                if not busy and not ping_at:
                    break  # no worker left (every queued job has a group that is pending or ready)
                if not busy:
                    time.sleep(0.2)
                    continue
                done, _ = ray.wait(list(busy), num_returns=1, timeout=0.5)
                for ref in done:
                    i, kind, item, n = busy.pop(ref)
                    if kind == "job":
                        running.get(i, set()).discard(item.name)
                    if kind in ("prepare", "job"):
                        in_flight[i] -= 1
                    try:
                        reply = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - a dead worker, or an error Ray raised for the call
                        if not _is_worker_loss(ray, exc):
                            reply = {"ok": False, "error": _error_text(exc), "seconds": 0.0, "worker": names[i]}
                        else:
                            # Ray restarts the worker (max_restarts); it takes work again once it answers.
                            holds[i].clear()
                            alive[i] = False
                            ping_at[i] = time.perf_counter() + 1.0
                            reply = None
                            lost = (f"its worker died during each of its {n} attempt(s) (last {names[i]}: "
                                    f"{type(exc).__name__})")
                    if kind == "ping":
                        if reply is None:
                            pings_lost[i] = pings_lost.get(i, 0) + 1
                            if pings_lost[i] > 300:  # not back after about 5 minutes: given up
                                ping_at.pop(i, None)
                            continue
                        pings_lost.pop(i, None)
                        alive[i] = True
                        continue
                    if kind == "prepare":
                        group = item
                        phases["prepare_s"] += float((reply or {}).get("seconds", 0.0))
                        if reply is not None:
                            preparations.append({
                                "video": str(group.video), "worker": reply.get("worker", names[i]),
                                "status": ("failed" if not reply["ok"] else
                                           "loaded" if reply["loaded_from_cache"] else "prepared"),
                                "seconds": round(float(reply.get("seconds", 0.0)), 3),
                                "ended_s": round(time.perf_counter() - t0, 3),
                                "timings": dict(reply.get("timings") or {})})
                        if reply is None:
                            for tmp in group.directory.glob(".building-*") if group.directory.is_dir() else ():
                                shutil.rmtree(tmp, ignore_errors=True)
                            if n >= max_attempts:
                                group.state, group.error = "failed", f"preparing the avatar failed: {lost}"
                                fail_group(group)
                            else:
                                group.state = "pending"
                        elif reply["ok"]:
                            group.state = "ready"
                            holds[i].add(group.key)
                            avatars["loaded" if reply["loaded_from_cache"] else "prepared"] += 1
                        else:
                            group.state, group.error = "failed", reply["error"]
                            fail_group(group)
                        continue
                    job = item
                    group = groups[group_of[job.name]]
                    if reply is None:
                        remove_partials(job.output)
                        frames_bar.update(-frames_done.pop(job.name, 0))
                        if n >= max_attempts:
                            finish(job, JobOutcome(job.name, "failed", 0, 0.0, lost, job.video, job.audio,
                                                   job.output, n))
                        else:
                            group.queue.appendleft(job)
                        continue
                    if reply["ok"]:
                        holds[i].add(group.key)
                        rec = {"format": RECORD_FORMAT, "inputs": inputs_of[job.name], "frames": reply["frames"],
                               "output_size": job.output.stat().st_size, "worker": reply["worker"],
                               "seconds": round(reply["seconds"], 3),
                               "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                        _write_json(record_path(job.output), rec)
                        finish(job, JobOutcome(job.name, "done", reply["frames"], reply["seconds"], "", job.video,
                                               job.audio, job.output, n, reply["worker"],
                                               timings=dict(reply.get("timings") or {})))
                    else:
                        finish(job, JobOutcome(job.name, "failed", 0, reply["seconds"], reply["error"], job.video,
                                               job.audio, job.output, n, reply["worker"]))
                # frames of running jobs, asked of their workers about once a second
                now = time.perf_counter()
                ready_polls = ray.wait(list(polls), num_returns=len(polls), timeout=0)[0] if polls else []
                for ref in ready_polls:
                    polls.pop(ref)
                    try:
                        counts = ray.get(ref)
                    except Exception:  # noqa: BLE001 - a worker that died: its job is retried above
                        continue
                    for name, count in counts.items():
                        if name in job_by_name and outcomes.get(name) is None:
                            frames_bar.update(max(count - frames_done.get(name, 0), 0))
                            frames_done[name] = max(count, frames_done.get(name, 0))
                if now - last_poll > 1.0 and any(running.values()) and not polls:
                    last_poll = now
                    for i, names_running in running.items():
                        if names_running:
                            polls[actors[i].progress.remote()] = i
            phases["jobs_done"] = time.perf_counter() - t0
            _collect_timeline(ray, actors, names, t0, timeline)
            _close_workers(ray, actors)
            for group in groups.values():  # only when every worker is gone for good
                if group.queue:
                    group.error = group.error or "no batch worker was left to run it (every worker died)"
                    fail_group(group)
        return list(names)
    finally:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - stopping must not hide the batch's outcome
                pass


__all__ = ["BatchResult", "BatchWorker", "Job", "JobOutcome", "ROW_SETTINGS", "check_jobs", "check_summary_path",
           "check_writable", "init_ray", "outputs_folder", "read_jobs", "record_path", "remove_partials", "run",
           "shutdown_ray", "WAITING_PER_SLOT"]
