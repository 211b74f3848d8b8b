"""The jobs of a batch: :class:`Job`, reading a jobs file (CSV or JSON lines), and checking jobs and settings."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import InferenceConfig, parse_box, parse_face
from ..errors import InputError

# Per-job settings: InferenceConfig fields a row may set (version, device and precision belong to the workers'
# pipelines) and "box", one crop box (x1, y1, x2, y2) in source pixels for the clip, skipping face detection.
ROW_SETTINGS = ("batch_size", "extra_margin", "bbox_shift", "parsing_mode", "left_cheek_width", "right_cheek_width",
                "landmark_backend", "smooth_boxes", "seed", "latent_mode", "blur_ratio", "face", "box")


@dataclass(frozen=True)
class Job:
    """One clip of a batch: ``name`` (unique; default the output's stem), ``video``, ``audio``, ``output`` (MP4),
    ``settings`` (:data:`ROW_SETTINGS`) and ``source``, where it was read (``"jobs.csv line 4"``), for messages."""

    name: str
    video: Path
    audio: Path
    output: Path
    settings: Mapping[str, Any] = field(default_factory=dict)
    source: str = field(default="", compare=False)


def _setting(key: str, value: Any, where: str) -> Any:
    """A per-job setting checked for its kind and converted from CSV text (None for an empty cell): whole numbers
    (``12``, ``"12"``, ``12.0``), finite numbers, text, or a box; InputError otherwise (JSON's ``true`` is no number).
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if key == "box":
        return parse_box(value, f"{where}: box")
    if key == "face":  # a track number, "largest", or "x,y[@frame]" / "x1,y1,x2,y2[@frame]" (quoted in a CSV)
        try:
            parse_face(value.strip() if isinstance(value, str) else value)
        except InputError as exc:
            raise InputError(f"{where}, setting face: {str(exc)[len('face '):]}") from None
        return value.strip() if isinstance(value, str) else value
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


def _setting_error(job: Job, config: InferenceConfig, changes: Mapping[str, Any], exc: InputError) -> str:
    """Why ``config`` refuses ``job``'s settings, naming where it was read and the first of its own settings refused
    alone (``jobs.csv line 4 (job 'o10'), setting extra_margin: ...``)."""
    label = f"{job.source} (job {job.name!r})" if job.source else f"job {job.name!r}"
    for key in [k for k in changes if k in job.settings]:  # the job's own, not landmark_backend="boxes" of its box
        try:
            config.replace(**{key: changes[key]})
        except InputError as alone:
            text = str(alone)
            return f"{label}, setting {key}: {text[len(key) + 1:] if text.startswith(key + ' ') else text}"
    return f"{label}: {exc}"


def job_configs(job_list: Sequence[Job], config: InferenceConfig) -> dict[str, InferenceConfig]:
    """``{job name: InferenceConfig}``: ``config`` with each job's settings (a ``box`` sets
    ``landmark_backend="boxes"``); InputError naming the job and setting when one is out of range."""
    out = {}
    for job in job_list:
        changes = {k: v for k, v in job.settings.items() if k != "box"}
        if "box" in job.settings:
            changes["landmark_backend"] = "boxes"
        try:
            out[job.name] = config.replace(**changes)
        except InputError as exc:
            raise InputError(_setting_error(job, config, changes, exc)) from None
    return out


def _clean_path(path: str | os.PathLike, base: Path | None = None) -> Path:
    """``path`` (``~`` expanded) made absolute from ``base`` (None: the working folder), only its folder resolved."""
    path = (base or Path.cwd()) / Path(path).expanduser()
    return path.resolve() if path.name in ("", "..") else path.parent.resolve() / path.name


def _job_from_row(row: Mapping[str, Any], base: Path, where: str) -> Job:
    row = {str(k).strip().lower(): v for k, v in row.items() if k is not None}  # "Video " is the video column
    settings_in = row.pop("settings", None) or {}
    if not isinstance(settings_in, Mapping):
        raise InputError(f"{where}: settings must be an object of setting names and values (\"settings\": "
                         f"{{\"bbox_shift\": 5}}); got {settings_in!r}.")
    missing = [k for k in ("video", "audio") if not str(row.get(k) or "").strip()]
    if missing:
        raise InputError(f"{where}: {' and '.join(missing)} missing; every job needs a video and an audio file "
                         "(columns video, audio, output).")
    fixed = {k: row.pop(k) for k in ("name", "video", "audio", "output") if k in row}
    for key, value in fixed.items():  # a CSV cell is always text; a JSON value may be anything
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise InputError(f"{where}: {key} must be a path as text; got {value!r}.")
    settings_in = {**settings_in, **row}  # the "settings" object and the other columns
    unknown = sorted(k for k in settings_in if k not in ROW_SETTINGS)
    if unknown:
        raise InputError(f"{where}: unknown column(s) {', '.join(unknown)}. A job has name, video, audio, output and "
                         f"optional settings: {', '.join(ROW_SETTINGS)}.")
    settings = {k: v for k, v in ((k, _setting(k, v, where)) for k, v in settings_in.items()) if v is not None}
    video, audio = _clean_path(str(fixed["video"]).strip(), base), _clean_path(str(fixed["audio"]).strip(), base)
    out_text = str(fixed.get("output") or "").strip()
    default = f"{video.stem}_{audio.stem}.mp4"
    output = _clean_path(out_text or f"results/{default}", base)
    output = output / default if output.is_dir() else output  # a folder: the default name in it, as -o DIR
    if output.suffix.lower() != ".mp4":
        raise InputError(f"{where}: output must end in .mp4 or be an existing folder; got {str(output)!r}.")
    name = str(fixed.get("name") or "").strip() or output.stem
    return Job(name=name, video=video, audio=audio, output=output, settings=settings, source=where)


def _kept_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of the lines that are neither empty nor comments (``#``)."""
    return [(k, ln) for k, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.lstrip().startswith("#")]


def _jsonl_job(line: str, k: int, name: str, base: Path) -> Job:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise InputError(f"{name} line {k} is not JSON ({exc}); write one job object per line.") from None
    if not isinstance(row, dict):
        raise InputError(f"{name} line {k}: a job is a JSON object; got {type(row).__name__}.")
    return _job_from_row(row, base, f"{name} line {k}")


def _jobs_from_jsonl(text: str, name: str, base: Path) -> list[Job]:
    jobs, rows = [], _RowErrors()
    for k, line in _kept_lines(text):
        if job := rows.read(_jsonl_job, line, k, name, base):
            jobs.append(job)
    rows.raise_any()
    return jobs


def _jobs_from_csv(text: str, name: str, base: Path) -> list[Job]:
    # line_numbers maps the reader's lines (comments and empty lines left out) back to the file's, for messages
    kept = _kept_lines(text)
    line_numbers = [k for k, _ in kept]
    # skipinitialspace: a quoted cell after ", " (`a.mp4, b.wav, o.mp4, "1,2,3,4"`) is still one cell
    reader = csv.DictReader(io.StringIO("\n".join(ln for _, ln in kept)), skipinitialspace=True)
    _check_header(reader.fieldnames or [], name)
    jobs, rows = [], _RowErrors()
    for row in reader:
        where = f"{name} line {line_numbers[reader.line_num - 1]}"
        if None in row:
            rows.add(InputError(f"{where} has more cells than the header has columns (a box's commas need quotes: "
                                '"190,160,360,330").'))
        elif job := rows.read(_job_from_row, row, base, where):
            jobs.append(job)
    rows.raise_any()
    return jobs


class _RowErrors:
    """The errors of a jobs file's rows, raised together once every row is read (a fix for each at once)."""

    SHOWN = 10  # rows listed in the message; the rest are counted

    def __init__(self) -> None:
        self.errors: list[InputError] = []

    def add(self, exc: InputError) -> None:
        self.errors.append(exc)

    def read(self, make: Any, *args: Any) -> Job | None:
        """``make(*args)``, or None with its InputError kept."""
        try:
            return make(*args)
        except InputError as exc:
            self.add(exc)
            return None

    def raise_any(self) -> None:
        """Raise one InputError naming every failed row (a single one's error as it is); nothing when none failed."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            lines = [f"- {e}" for e in self.errors[:self.SHOWN]]
            if len(self.errors) > self.SHOWN:
                lines.append(f"- and {len(self.errors) - self.SHOWN} more.")
            raise InputError(f"{len(self.errors)} rows of the jobs file are not valid jobs:\n" + "\n".join(lines))


def read_jobs(path: str | os.PathLike) -> list[Job]:
    """The jobs of a jobs file, in order: CSV with a header row, or JSON lines (``.jsonl``, ``.json``), with the
    columns of ``docs/batch.md`` ("The jobs file"; in JSON settings may also sit under ``"settings"``). Paths come
    back absolute; empty lines and ``#`` lines are skipped.

    Raises InputError when the file is missing or empty, a row lacks video or audio, has an unknown column or a bad
    value (every such row named in one message), or two jobs share an output."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"jobs file {str(path)!r} does not exist; give a CSV (columns video,audio,output) or a "
                         "JSON-lines file.")
    try:
        text = path.read_text("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"jobs file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as "
                         "UTF-8 (in a spreadsheet: CSV UTF-8).") from None
    json_lines = path.suffix.lower() in (".jsonl", ".json", ".ndjson")
    jobs = (_jobs_from_jsonl if json_lines else _jobs_from_csv)(text, path.name, path.resolve().parent)
    if not jobs:
        raise InputError(f"jobs file {str(path)!r} holds no job; write a header (video,audio,output) and one row per "
                         "clip.")
    return check_jobs(jobs)


def _check_header(columns: Sequence[str], file_name: str) -> None:
    """Refuse a CSV header with an empty or repeated column name, another separator than commas, or without the
    video and audio columns (a file whose first line is a job, not a header, is refused here too)."""
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
    if not names:  # an empty file (or only comments): "holds no job" says so
        return
    if not set(lowered) & {"name", "video", "audio", "output", "settings", *ROW_SETTINGS}:
        raise InputError(f"{file_name}: the first line {','.join(names)!r} names none of a job's columns, so it is "
                         "not a header; a jobs CSV starts with a header line, as in video,audio,output (add one, or "
                         "rename the columns).")
    absent = [k for k in ("video", "audio") if k not in lowered]
    if absent:
        raise InputError(f"{file_name}: the header {','.join(names)!r} has no {' and no '.join(absent)} column; the "
                         "first line of a jobs CSV names its columns, as in video,audio,output.")


def _check_outputs(jobs: Sequence[Job]) -> None:
    """Refuse two jobs writing one output, and an output that is a job's input (InputError naming both)."""
    def label(k: int) -> str:  # where it was read ("jobs.csv line 4"), else its place in the list
        return jobs[k].source or f"job {k + 1} ({jobs[k].name!r})"

    outputs: dict[Path, int] = {}
    for k, job in enumerate(jobs):
        key = job.output.resolve()
        if key in outputs:
            raise InputError(f"{label(outputs[key])} and {label(k)} both write {str(job.output)!r}; give each job "
                             "its own output.")
        outputs[key] = k
    for k, job in enumerate(jobs):  # an output that is a job's input would replace it (and the rerun, again)
        for kind, source in (("video", job.video), ("audio", job.audio)):
            writer = outputs.get(source.resolve())
            if writer is not None:
                whose = "its own" if writer == k else f"{label(k)}'s"
                raise InputError(f"{label(writer)} writes {str(source)!r}, which is {whose} {kind}: writing it would "
                                 "replace the input. Give another output path.")


def check_jobs(jobs: Iterable[Job | Mapping[str, Any]]) -> list[Job]:
    """Jobs as :class:`Job` objects with clean absolute paths (dicts converted, relative to the working folder), a
    number added to repeated names (``clip``, ``clip-2``): names label the summary rows. InputError when a job is
    malformed, two jobs share an output, or an output is a job's video or audio."""
    out: list[Job] = []
    names: set[str] = set()
    for k, job in enumerate(jobs):
        if isinstance(job, Mapping):
            job = _job_from_row(job, Path.cwd(), f"job {k + 1}")  # counted from 1, as the output checks count
        elif not isinstance(job, Job):
            raise InputError(f"job {k + 1} must be a Job or a dict with video, audio and output; got "
                             f"{type(job).__name__}.")
        paths = [_clean_path(p) for p in (job.video, job.audio, job.output)]
        name, n = job.name, 1
        while name in names:
            n += 1
            name = f"{job.name}-{n}"
        names.add(name)
        out.append(Job(name, *paths, job.settings, job.source))
    _check_outputs(out)
    if not out:
        raise InputError("the batch holds no job.")
    return out
