"""The batch's checks before any worker: each distinct video and audio probed once, and each job failed at its
inputs, skipped as finished, or put in its face group for the scheduler."""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import media
from ..checks import check_audio, check_boxes, check_face, check_speech_seconds, check_video, warn_if_silent
from ..config import InferenceConfig
from ..constants import FPS
from ..errors import InputError, NbHelpersError
from .jobs import Job
from .records import drop_hint, finished_record, group_key, record_inputs, write_hint
from .results import JobOutcome, error_text, job_outcome


def _short_audio_error(info: Any) -> str:
    """The error of a job whose audio is shorter than one 25 fps frame ("" otherwise or when unknown)."""
    try:
        check_speech_seconds(info.duration_s, f"audio {str(info.path)!r}")
    except InputError as exc:
        return error_text(exc)
    return ""


def _fit_error(job: Job, face: Any, video_info: Any) -> str:
    """The error of a job whose crop box does not fit its video, or whose ``face`` (its config's) misses it
    (:func:`~nbhelpers.checks.check_face`, naming where the job was read); "" when both fit or there is no video."""
    if video_info is None:
        return ""
    where = job.source or f"job {job.name!r}"
    box = job.settings.get("box")
    try:
        check_boxes(box, job.video, video_info)
    except NbHelpersError as exc:  # the message names the Python argument "boxes = (x1, ...)"; a job's setting is "box"
        if not isinstance(exc, InputError):
            return error_text(exc)
        text = re.sub(r"^boxes = \([^)]*\)", "box " + ",".join(str(v) for v in box), str(exc))
        return error_text(InputError(f"{where}: {text.replace('boxes must', 'box must', 1)}"))
    try:
        check_face(face, video_info)
    except InputError as exc:
        return error_text(InputError(f"{where}: {exc}"))
    return ""


@dataclass(frozen=True)
class Probed:
    """``{path: (MediaInfo or None, "<Type>: message" or "")}`` per distinct video and audio."""

    videos: Mapping[Path, tuple[Any, str]]
    audios: Mapping[Path, tuple[Any, str]]

    def error(self, job: Job, face: Any) -> str:
        """Why ``job`` cannot run ("" when it can): its video's, audio's, box's, ``face``'s or audio length's error."""
        video_info, video_error = self.videos[job.video]
        audio_info, audio_error = self.audios[job.audio]
        return video_error or audio_error or _fit_error(job, face, video_info) or _short_audio_error(audio_info)


def probe_inputs(job_list: Sequence[Job], fingerprints: Callable[[Path], Any]) -> Probed:
    """Probe every distinct video and audio once, in threads, and fingerprint the readable ones; a silent audio is
    warned about (:class:`~nbhelpers.errors.SilentAudioWarning`) and its jobs go on."""

    def probe(check: Callable[[Any], tuple[Path, Any]], path: Path) -> tuple[Path, tuple[Any, str]]:
        try:
            info = check(path)[1]
            fingerprints(path)
            return path, (info, "")
        except (NbHelpersError, OSError) as exc:  # a missing file's advice names the jobs file, not a notebook
            return path, (None, error_text(exc).replace(
                "(upload the file first in notebook 02_media, or give the full path)",
                "(a relative path in a jobs file is relative to its folder)"))

    def check_speech(path: Path) -> tuple[Path, Any]:
        """check_audio, then a warning here for a silent file (a worker's own warning reaches no console)."""
        checked = check_audio(path)
        warn_if_silent(media.load_audio(path), f"audio {str(path)!r}")
        return checked

    with ThreadPoolExecutor(min(8, max(2, os.cpu_count() or 1)), thread_name_prefix="batch-probe") as pool:
        videos = pool.map(lambda p: probe(check_video, p), dict.fromkeys(j.video for j in job_list))
        audios = pool.map(lambda p: probe(check_speech, p), dict.fromkeys(j.audio for j in job_list))
        return Probed(dict(videos), dict(audios))


@dataclass
class FaceGroup:
    """The jobs of one face (same video content, box and avatar settings), sharing one avatar in ``directory``
    (``<cache>/<video stem>-<key>``); ``queue`` holds the jobs not yet handed out, ``state`` is ``"pending"``,
    ``"preparing"``, ``"ready"`` or ``"failed"`` (with ``error``), ``attempts`` counts preparations."""

    key: str
    video: Path
    directory: Path
    config: dict[str, Any]
    box: tuple[int, int, int, int] | None
    queue: deque = field(default_factory=deque)
    state: str = "pending"
    error: str = ""
    attempts: int = 0


@dataclass
class WorkPlan:
    """The batch after the checks: ``outcomes`` of the jobs settled (the scheduler adds the rest), ``groups`` by face
    key, and per job name its ``group_of`` key, ``inputs_of`` fingerprints (for its record) and ``expected_frames``."""

    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    groups: dict[str, FaceGroup] = field(default_factory=dict)
    group_of: dict[str, str] = field(default_factory=dict)
    inputs_of: dict[str, dict[str, Any]] = field(default_factory=dict)
    expected_frames: dict[str, int] = field(default_factory=dict)

    @property
    def todo(self) -> int:
        """Jobs left to run."""
        return sum(len(g.queue) for g in self.groups.values())

    def add_to_group(self, job: Job, config: InferenceConfig, cache_path: Path, audio_info: Any) -> None:
        """Queue ``job`` in the group of its face (made when it is the first)."""
        box = job.settings.get("box")
        key = group_key(self.inputs_of[job.name]["video"], config, box)
        if key not in self.groups:
            self.groups[key] = FaceGroup(key, job.video, cache_path / f"{job.video.stem}-{key}", config.to_dict(), box)
        self.groups[key].queue.append(job)
        self.group_of[job.name] = key
        self.expected_frames[job.name] = int((audio_info.duration_s or 0) * FPS)


def sort_jobs(plan: WorkPlan, job_list: Sequence[Job], job_configs: Mapping[str, InferenceConfig], probed: Probed,
              fingerprints: Callable[[Path], Any], weight_files: Mapping[str, Any], cache_path: Path,
              rerun: bool) -> None:
    """Into ``plan``: fail the jobs whose inputs fail (leaving a hint in ``cache_path``), skip those finished from the
    same inputs and weights unless ``rerun``, and queue the others in their face groups."""
    for job in job_list:
        error = probed.error(job, job_configs[job.name].face)
        if error:
            plan.outcomes[job.name] = job_outcome(job, "failed", error)
            write_hint(cache_path, job, error)
            continue
        drop_hint(cache_path, job)  # it passed the checks: finished, or to run (a worker's failure needs Ray)
        config = job_configs[job.name]
        inputs = plan.inputs_of[job.name] = record_inputs(job, config, fingerprints, weight_files)
        rec = None if rerun else finished_record(job, inputs)
        if rec is not None:
            plan.outcomes[job.name] = job_outcome(job, "skipped", frames=int(rec.get("frames", 0)),
                                                  worker=str(rec.get("worker", "")))
        else:
            plan.add_to_group(job, config, cache_path, probed.audios[job.audio][0])
