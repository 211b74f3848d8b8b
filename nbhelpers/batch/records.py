"""What a batch keeps on disk between runs and where it may write: input fingerprints, output records,
input-failure hints, locks, writability checks.

An output is finished when it exists, its record ``.<name>.batch.json`` matches the fingerprints of what would make
it now (sizes and SHA-256 of video and audio, settings, weight files) and its size is the recorded one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import weights
from ..avatar.cache import CACHED_FIELDS
from ..config import InferenceConfig
from ..errors import InputError
from ..hashing import atomic_path, sha256_file
from ..media import write_problem
from .jobs import Job

RECORD_FORMAT = 1  # bump when the output record's fields change (older records then make their outputs again)
HINT_FORMAT = 1  # bump when the input-failure hint's fields change (older hints are then ignored)
HINTS_NAME = "failed"  # folder of the input-failure hints, in the avatar cache


def fingerprinter() -> Callable[[Path], dict[str, Any]]:
    """A function giving a path's ``{"size": bytes, "sha256": hex}``, each file hashed once; OSError when unreadable."""
    hashed = functools.cache(lambda key: {"size": key.stat().st_size, "sha256": sha256_file(key)})
    return lambda path: hashed(path.resolve())


def record_path(output: Path) -> Path:
    """Where the record of ``output`` lives: ``.<name>.batch.json`` beside it."""
    return output.with_name(f".{output.name}.batch.json")


def weights_state(weights_dir: Path, version: str) -> dict[str, list[int]]:
    """``{file: [bytes, mtime s]}`` of the weight files a job of ``version`` reads."""
    paths = {name: weights_dir / name for name in weights.required_files(version, parsing=True)}
    stats = {name: p.stat() for name, p in paths.items() if p.is_file()}
    return {name: [st.st_size, int(st.st_mtime)] for name, st in stats.items()}


def record_inputs(job: Job, config: InferenceConfig, fingerprints: Callable[[Path], dict[str, Any]],
                  weight_files: Mapping[str, Any]) -> dict[str, Any]:
    """What makes ``job``'s output, as its record holds it: video and audio fingerprints, box, the settings that
    change frames (:meth:`~nbhelpers.config.InferenceConfig.output_settings`) and ``weight_files``."""
    box = job.settings.get("box")
    return {"video": fingerprints(job.video), "audio": fingerprints(job.audio), "box": list(box) if box else None,
            "settings": config.output_settings(), "weights": dict(weight_files)}


def group_key(video_fingerprint: Mapping[str, Any], config: InferenceConfig, box: Any) -> str:
    """16 hex digits naming a face group: the video's content, box and avatar settings (``CACHED_FIELDS``)."""
    fields = {f: getattr(config, f) for f in CACHED_FIELDS}
    text = json.dumps({"video": video_fingerprint["sha256"], "settings": fields, "box": box}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def finished_record(job: Job, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The record of ``job``'s output when the output is finished and was made from ``inputs``; else None."""
    try:
        rec = json.loads(record_path(job.output).read_text("utf-8"))
        size = job.output.stat().st_size
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict):  # valid JSON but not a record (a list, a number): make the output again
        return None
    if rec.get("format") != RECORD_FORMAT or rec.get("inputs") != inputs or rec.get("output_size") != size:
        return None
    return rec


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` (temporary name, then renamed)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), "utf-8")


def write_record(output: Path, inputs: Mapping[str, Any], frames: int, worker: str, seconds: float) -> None:
    """Write the record of an output just made: its inputs' fingerprints, frames, size and worker."""
    write_json(record_path(output), {
        "format": RECORD_FORMAT, "inputs": inputs, "frames": frames, "output_size": output.stat().st_size,
        "worker": worker, "seconds": round(seconds, 3), "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def _file_state(path: Path) -> dict[str, Any]:
    """A cheap fingerprint (one stat): path, size and mtime_ns, or ``missing``."""
    try:
        st = path.stat()
    except OSError:
        return {"path": str(path), "missing": True}
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _hint_path(cache_path: Path, output: Path) -> Path:
    """``<cache>/failed/<sha of the output path>.json``: the input-failure hint of ``output``'s job."""
    return cache_path / HINTS_NAME / f"{hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:24]}.json"


def write_hint(cache_path: Path, job: Job, error: str) -> None:
    """Note that ``job`` failed at the input checks, so that a rerun with the same inputs needs no Ray for it; a
    hint that cannot be written is left out (the probe still decides the outcome)."""
    hint = {"format": HINT_FORMAT, "output": str(job.output.resolve()), "stage": "inputs", "error": error,
            "inputs": {"video": _file_state(job.video), "audio": _file_state(job.audio)}}
    path = _hint_path(cache_path, job.output)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, hint)


def drop_hint(cache_path: Path, job: Job) -> None:
    """Remove ``job``'s input-failure hint (its inputs passed the checks now)."""
    with contextlib.suppress(OSError):
        _hint_path(cache_path, job.output).unlink(missing_ok=True)


def _failed_at_inputs(cache_path: Path, job: Job) -> bool:
    """True when ``job`` failed at the input checks last time and its inputs look unchanged since."""
    try:
        hint = json.loads(_hint_path(cache_path, job.output).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(hint, dict) and hint.get("format") == HINT_FORMAT and hint.get("stage") == "inputs"
            and hint.get("output") == str(job.output.resolve())
            and hint.get("inputs") == {"video": _file_state(job.video), "audio": _file_state(job.audio)})


def likely_work(job_list: Sequence[Job], cache_path: Path, rerun: bool) -> bool:
    """Whether the batch will probably need Ray: a rerun, or a job with neither output and record nor a matching
    input-failure hint (a wrong guess only delays Ray's start)."""
    return rerun or any(not (j.output.is_file() and record_path(j.output).is_file())
                        and not _failed_at_inputs(cache_path, j) for j in job_list)


def outputs_folder(job_list: Sequence[Job]) -> Path:
    """The deepest folder holding every output, or the first job's output folder when that is a filesystem
    root or not writable: where the summary and avatar cache go by default."""
    folders = [j.output.resolve().parent for j in job_list]
    common = existing = Path(os.path.commonpath([str(f) for f in folders]))
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    writable = existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)  # it can be made, or files made in it
    return common if common.parent != common and writable else folders[0]


def check_writable(folders: Iterable[Path]) -> None:
    """Check before Ray starts that the batch can write (or make) every one of ``folders``; InputError naming up to
    three that are inside a file, read-only or not this user's."""
    bad = [f"{str(f)!r} ({why})" for f in dict.fromkeys(Path(f) for f in folders) if (why := write_problem(f))]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise InputError(f"the batch cannot write in {', '.join(bad[:3])}{more}. Give the outputs (and any "
                         "cache_dir and summary) in folders you can write in.")


@contextlib.contextmanager
def batch_lock(folder: Path, name: str = "batch.lock", what: str = "the avatar cache") -> Iterator[None]:
    """An exclusive ``fcntl.flock`` lock on a batch's folder for the whole run, so a second batch over the same
    outputs is refused (InputError on entry). The file names its holder (pid, host, start time) and stays; without
    ``fcntl`` or on storage without locks there is no lock."""
    path = Path(folder) / name
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"the batch cannot make its lock {str(path)!r} ({exc.strerror or exc}); give the "
                         "outputs and cache_dir in folders you can write in.") from None
    with fh:  # closing the file gives the lock back
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held by another process
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise InputError(f"another batch is running over {what} {str(path.parent)!r} ({holder}): wait for "
                             "it to end, or give this batch its own outputs and cache_dir. Two batches over the "
                             "same outputs would each make every clip.") from None
        except OSError:  # storage without locks (some network file systems): the batch runs without one
            pass
        else:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            fh.flush()
        yield


def remove_half_built(cache: Path) -> None:
    """Remove the half-built avatars a stopped or dead worker left in the face folders of ``cache``
    (``<face>/.building-*``, :func:`nbhelpers.avatar.prepare`'s work folders); the caller holds the cache's lock, so
    no worker of another batch is building there."""
    for work in cache.glob("*/.building-*"):  # none when the cache folder is missing
        shutil.rmtree(work, ignore_errors=True)


def remove_partials(*outputs: Path) -> None:
    """Remove the half-written files a dead worker left for each output (``.<stem>.partial-*<suffix>``)."""
    for output in outputs:
        for p in output.parent.glob(f".{output.stem}.partial-*{output.suffix}"):  # none when the folder is missing
            with contextlib.suppress(OSError):
                p.unlink()
