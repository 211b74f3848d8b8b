"""The outcome of a batch: :class:`JobOutcome` per job, the :class:`BatchResult` table and its summary CSV."""

from __future__ import annotations

import contextlib
import csv
import html
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..display import table_html
from ..errors import InputError, Terminated, plural
from ..hashing import atomic_path
from ..weights.manifest import text_table
from .jobs import Job

ERROR_WIDTH = 80  # characters of a job's error in the text table; the summary CSV has the whole message
SUMMARY_COLUMNS = ("job", "status", "frames", "seconds", "fps", "error", "video", "audio", "output", "attempts",
                   "worker")
TABLE_COLUMNS = SUMMARY_COLUMNS[:6]  # the table a notebook or terminal shows: job to error


@dataclass(frozen=True)
class JobOutcome:
    """What happened to job ``job``: ``status`` ``"done"``, ``"skipped"`` (finished from the same inputs) or
    ``"failed"`` (``"interrupted"`` in the summary of a stopped batch); output ``frames`` at 25 fps (the recorded
    count when skipped); wall-clock ``seconds`` on its worker; ``error`` ``"<ExceptionType>: <message>"`` or "";
    ``attempts`` (more than 1 when a worker died during it); ``worker`` ``host/pid device``. Not in the CSV:
    ``ended_s``, seconds from the start of :func:`nbhelpers.batch.run`, and ``timings``, seconds per stage."""

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
        """The summary row (:data:`SUMMARY_COLUMNS`), seconds and fps with two decimals (fps "" when NaN)."""
        fps = "" if self.fps != self.fps else f"{self.fps:.2f}"
        return {**{c: getattr(self, c) for c in SUMMARY_COLUMNS}, "seconds": f"{self.seconds:.2f}", "fps": fps}


@dataclass(frozen=True)
class BatchResult:
    """The outcome of a batch, one :class:`JobOutcome` per job in order; shows a table in a notebook.

    ``summary_csv`` holds the same table (None when turned off); ``workers`` one ``host/pid device`` line per worker;
    ``avatars`` ``{"prepared": n, "loaded": m}``; ``phases`` seconds from the start of run() (``checks``,
    ``ray_start``, ``workers_ready``, ``first_job``, ``jobs_done``; ``prepare_s`` summed worker seconds);
    ``workers_note`` why that many workers and jobs each; ``timeline`` per worker ``(event, seconds from the start)``
    (:meth:`nbhelpers.batch.worker.BatchWorker.events`); ``preparations`` per avatar preparation
    ``{"video", "worker", "status", "seconds", "ended_s", "timings"}``."""

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
        """One line: counts, frames, throughput, and the summary CSV (which holds the whole errors)."""
        devices = {w.rsplit(" ", 1)[-1].split(":")[0] for w in self.workers}  # a worker's line ends with its device
        kind = {frozenset({"cpu"}): "CPU ", frozenset({"cuda"}): "GPU "}.get(frozenset(devices), "")
        text = (f"{plural(len(self.outcomes), 'job')}: {self.count('done')} done, {self.count('skipped')} skipped, "
                f"{self.count('failed')} failed; {self.frames} frames in {self.wall_s:.1f} s "
                f"({self.fps:.1f} fps) on {plural(len(self.workers), kind + 'worker')}")
        if self.workers and self.workers_note:
            text += f" ({self.workers_note})"
        cut = any(len(_one_line(o.error)) > ERROR_WIDTH for o in self.outcomes)
        if self.summary_csv is not None:
            text += f"; {'full errors in the summary' if cut else 'summary'}: {self.summary_csv}"
        elif cut:
            text += "; full errors: BatchResult.failed (no summary CSV was written)"
        return text

    def table(self) -> str:
        """:data:`TABLE_COLUMNS` as text, each error on one line cut to :data:`ERROR_WIDTH`."""
        rows = [[str(o.row()[c]) for c in TABLE_COLUMNS[:-1]] + [_cut_error(o.error)] for o in self.outcomes]
        return text_table(TABLE_COLUMNS, rows)

    def __str__(self) -> str:
        return f"{self.table()}\n{self.summary()}"

    def _repr_html_(self) -> str:
        rows = [[o.row()[c] for c in TABLE_COLUMNS] for o in self.outcomes]
        return f"<p>{html.escape(self.summary())}</p>{table_html(rows, TABLE_COLUMNS)}"

    def write_csv(self, path: str | os.PathLike) -> Path:
        """Write the table (:data:`SUMMARY_COLUMNS`) to ``path`` through a temporary name; returns the path."""
        with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=SUMMARY_COLUMNS)
            writer.writeheader()
            writer.writerows(o.row() for o in self.outcomes)
        return Path(path)


def job_outcome(job: Job, status: str, error: str = "", *, frames: int = 0, seconds: float = 0.0, attempts: int = 0,
                worker: str = "", ended_s: float = 0.0, timings: Mapping[str, float] | None = None) -> JobOutcome:
    """``job``'s :class:`JobOutcome`, its name and paths taken from the job."""
    return JobOutcome(job.name, status, frames, seconds, error, job.video, job.audio, job.output, attempts, worker,
                      ended_s, dict(timings or {}))


def error_text(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"``: a failed job's error (:attr:`JobOutcome.error`)."""
    return f"{type(exc).__name__}: {exc}"


def _one_line(error: str) -> str:
    return " ".join(error.split())  # a multi-line message (the weights' Fix: lines) on one table row


def _cut_error(error: str) -> str:
    text = _one_line(error)
    return text if len(text) <= ERROR_WIDTH else text[:ERROR_WIDTH - 3].rstrip() + "..."


def check_summary_path(path: Path, job_list: Sequence[Job], jobs_file: Path | None = None) -> None:
    """Check before Ray starts that writing the summary at ``path`` replaces nothing but an earlier summary: InputError
    when ``path`` is a folder, the jobs file, a job's video, audio or output, or another existing file."""
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


def write_stopped_summary(job_list: Sequence[Job], outcomes: Mapping[str, JobOutcome], path: Path,
                          exc: BaseException, t0: float) -> None:
    """Write the summary of a batch stopped early: settled jobs as they ended, the others ``"interrupted"``
    (left out when it cannot be written)."""
    if isinstance(exc, Terminated) or Terminated.pending:
        why = "terminated (SIGTERM)"
    else:
        why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else f"stopped by {type(exc).__name__}"
    error = f"the batch was {why} before this job ended; run the batch again to make it"
    rows = tuple(outcomes.get(j.name) or job_outcome(j, "interrupted", error) for j in job_list)
    with contextlib.suppress(OSError):
        BatchResult(outcomes=rows, summary_csv=path, wall_s=time.perf_counter() - t0).write_csv(path)
