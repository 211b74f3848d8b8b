"""Batch dubbing on Ray: many (video, audio) jobs over every GPU of a machine or a cluster, with nothing lost.

A batch is a list of jobs (a CSV or JSON-lines file, or :class:`Job` objects): a face video, a speech file, an
output MP4 and optional settings per job. :func:`run` starts Ray on this machine (or joins a cluster with
``address=``), starts one worker per GPU (CPU workers when there is none; ``workers_per_gpu`` for more), each
holding one loaded :class:`~nbhelpers.pipeline.MuseTalkPipeline` and rendering one or two clips at once in threads
over it (``jobs_per_worker``: chosen from the free GPU memory when not given; a GPU worker holds as many jobs again,
whose audio and encoder are ready when a clip's last batch frees the GPU), and hands out the work. Those options
are the fields of a :class:`BatchConfig`; the settings of the jobs are an :class:`~nbhelpers.config.InferenceConfig`.

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

The modules, in the order the data flows: :mod:`.config` (:class:`BatchConfig`), :mod:`.jobs` (the jobs file),
:mod:`.records` (fingerprints, records, hints, locks), :mod:`.inputs` (the checks before any worker),
:mod:`.cluster` (Ray), :mod:`.worker` (the Ray actor), :mod:`.scheduler` (the dispatch loop) and :mod:`.results`
(the table and its CSV).

Ray is an optional extra: ``pip install "ray>=2.10"`` (or the package's ``[batch]`` extra). Importing this package
does not import Ray or torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import InferenceConfig
from ..errors import InputError
from ..framestore import remove_stale_frames
from ..gpu.device import free_memory_by_index
from ..pipeline import check_weights_dir
from .cluster import INSTALL_RAY, RaySession, init_ray, ray_installed, require_ray, shutdown_ray
from .config import BatchConfig
from .inputs import WorkPlan, probe_inputs, sort_jobs
from .jobs import ROW_SETTINGS, Job, check_jobs, job_configs, read_jobs
from .records import (
    BatchLock,
    Fingerprints,
    check_writable,
    likely_work,
    outputs_folder,
    record_path,
    remove_partials,
    weights_state,
)
from .results import BatchResult, JobOutcome, check_summary_path, write_stopped_summary
from .scheduler import RunLog, Scheduler, Workers
from .worker import BatchWorker, choose_jobs_per_worker

__all__ = ["BatchConfig", "BatchResult", "BatchWorker", "INSTALL_RAY", "Job", "JobOutcome", "ROW_SETTINGS",
           "check_jobs", "init_ray", "outputs_folder", "ray_installed", "read_jobs", "record_path", "remove_partials",
           "run", "shutdown_ray"]


@dataclass(frozen=True)
class _Paths:
    """Where a batch reads and writes, resolved before anything starts."""

    weights: Path
    outputs: Path
    cache: Path
    summary: Path | None


def run(jobs: str | os.PathLike | Sequence[Job | Mapping[str, Any]], config: BatchConfig | None = None, *,
        inference: InferenceConfig | None = None, weights_dir: str | os.PathLike | None = None) -> BatchResult:
    """Run a batch of lip-sync jobs on Ray; see the package docstring for what is guaranteed.

    Args:
        jobs: A jobs file (CSV or JSON lines, see :func:`read_jobs`), or a sequence of :class:`Job` or dicts with
            ``video``, ``audio``, ``output`` and optional settings.
        config: How the batch runs (:class:`BatchConfig`: Ray address, cache, summary, workers, attempts, rerun);
            None: the defaults.
        inference: The settings of every job (a job's own settings override them); its ``device="cpu"`` keeps
            the workers on the CPU even where there are GPUs. None: the defaults.
        weights_dir: Weights folder, visible to every worker (default :func:`nbhelpers.weights.default_dir`).

    Returns:
        :class:`BatchResult` (also written to the summary CSV).

    Raises:
        MissingDependencyError: Ray is not installed (the message gives the install line).
        InputError: The jobs file or a job is malformed, two jobs share an output, ``config`` is not a
            BatchConfig, an output, cache or summary folder cannot be written in
            (:func:`~nbhelpers.batch.records.check_writable`), the summary would replace another file
            (:func:`~nbhelpers.batch.results.check_summary_path`), or another batch holds the avatar cache's or the
            outputs folder's lock; raised before Ray starts. (A missing or unreadable media file fails only its
            job.)
        WeightsError: Weight files are missing.
        KeyboardInterrupt: Ctrl-C (or :class:`~nbhelpers.errors.Terminated`, SIGTERM on the command line): raised
            once the workers are down, their partial files removed and the summary written with the unfinished
            jobs as ``"interrupted"``.
    """
    t0 = time.perf_counter()
    if config is not None and not isinstance(config, BatchConfig):
        raise InputError(f"config must be a BatchConfig (how the batch runs); got {type(config).__name__}. Give the "
                         "jobs' InferenceConfig as inference=.")
    config, inference = config or BatchConfig(), inference or InferenceConfig()
    jobs_file = jobs if isinstance(jobs, (str, os.PathLike)) else None
    job_list = read_jobs(jobs_file) if jobs_file is not None else check_jobs(jobs)
    outputs = outputs_folder(job_list)
    paths = _Paths(weights=check_weights_dir(weights_dir, inference.version), outputs=outputs,
                   cache=config.cache_path(outputs), summary=config.summary_path(outputs))
    check_writable([j.output.parent for j in job_list] + [paths.cache]
                   + ([paths.summary.parent] if paths.summary is not None else []))
    if paths.summary is not None:
        check_summary_path(paths.summary, job_list, jobs_file)
    configs = job_configs(job_list, inference)  # settings are validated before anything starts
    require_ray()
    with BatchLock(paths.cache), BatchLock(paths.outputs, ".batch.lock", "the outputs folder"):
        return _run_locked(job_list, config, inference, configs, paths, t0)


def _workers(config: BatchConfig, inference: InferenceConfig, joining: bool) -> tuple[Workers, str, int]:
    """How many workers and jobs, and why: ``(Workers, note, processes a local Ray starts ahead)``.

    Jobs per worker, when not given, come from the free memory of this machine's GPUs (NVML or nvidia-smi, no
    CUDA here), which also says how many GPUs a local Ray will offer. A local Ray starts as many worker processes
    ahead as there will be workers: the actors find them started.
    """
    free = None
    if inference.device != "cpu" and not joining:
        free = free_memory_by_index()
        if free and config.gpus is not None:
            free = dict(sorted(free.items())[:config.gpus])
    per_gpu = config.workers_per_gpu or 1
    notes = ["1 worker per GPU" if config.workers_per_gpu is None else f"{per_gpu} worker(s) per GPU, as asked"]
    slots = config.jobs_per_worker
    if slots is None:
        slots, why = choose_jobs_per_worker(inference, free, per_gpu, joining=joining)
        notes.append(why)
    else:
        notes.append(f"{slots} job(s) at once per worker, as asked")
    n_gpu_guess = config.gpus if config.gpus is not None else (len(free) if free else 1)
    ahead = max(config.cpu_workers, per_gpu * max(1, n_gpu_guess))
    workers = Workers(config.cpu_workers, per_gpu, slots, config.gpus, config.max_attempts)
    return workers, "; ".join(n for n in notes if n), ahead


def _check_inputs(plan: WorkPlan, job_list: Sequence[Job], inference: InferenceConfig,
                  configs: Mapping[str, InferenceConfig], paths: _Paths, rerun: bool, ray: RaySession, log: RunLog,
                  t0: float) -> None:
    """Probe the inputs, find the finished outputs and group the rest by face. Ray starts in this thread meanwhile
    (its start is seconds of waiting for its own processes), unless every job looks finished (its output is there
    with its record) or failed at these checks last time with the same inputs (its hint): then a repeated batch
    with nothing left to run does not start Ray at all. The jobs settled here go into ``plan``."""
    fingerprints = Fingerprints()
    weight_files = weights_state(paths.weights, inference.version)
    if likely_work(job_list, paths.cache, rerun):
        with ThreadPoolExecutor(1, thread_name_prefix="batch-checks") as pool:
            probing = pool.submit(probe_inputs, job_list, fingerprints)
            try:
                ray.start()
            finally:
                probed = probing.result()  # the probe's own errors (none expected) come after Ray's
        log.phases["ray_start"] = time.perf_counter() - t0
    else:
        probed = probe_inputs(job_list, fingerprints)
    sort_jobs(plan, job_list, configs, probed, fingerprints, weight_files, paths.cache, rerun)


def _run_locked(job_list: list[Job], config: BatchConfig, inference: InferenceConfig,
                configs: Mapping[str, InferenceConfig], paths: _Paths, t0: float) -> BatchResult:
    """:func:`run` once its arguments are checked and the batch holds its locks."""
    for job in job_list:
        remove_partials(job.output)
    workers, workers_note, ahead = _workers(config, inference, bool(config.address or os.environ.get("RAY_ADDRESS")))
    ray = RaySession(config.address, num_cpus=ahead, num_gpus=config.gpus)
    log, plan = RunLog(), WorkPlan()
    try:
        _check_inputs(plan, job_list, inference, configs, paths, config.rerun, ray, log, t0)
        if plan.todo:
            log.phases["checks"] = time.perf_counter() - t0
            if not ray.started:  # every output had a record, yet some input or setting changed
                ray.start()
                log.phases["ray_start"] = time.perf_counter() - t0
            Scheduler(require_ray(), plan, job_list, configs, paths.weights, inference, workers, log, t0).run()
        else:
            log.phases.clear()
    except BaseException as exc:  # Ctrl-C, SIGTERM (the command line's), an error: nothing half-made is left
        try:
            ray.stop()  # the workers stop before their partial files are removed
        finally:  # a second Ctrl-C during the shutdown still leaves no partial file
            for job in job_list:
                remove_partials(job.output)
            if paths.summary is not None:
                write_stopped_summary(job_list, plan.outcomes, paths.summary, exc, t0)
        raise
    finally:
        ray.stop()  # before returning: Ray must be down when the caller next uses it
        if config.address is None:  # the workers ran here: frames a stopped one could not remove go now
            _remove_stale_frames()
    for job in job_list:
        remove_partials(job.output)
    result = BatchResult(outcomes=tuple(plan.outcomes[j.name] for j in job_list), summary_csv=paths.summary,
                         wall_s=time.perf_counter() - t0, workers=tuple(log.workers), avatars=log.avatars,
                         workers_note=workers_note if any("cuda" in w for w in log.workers) else "",
                         phases={k: round(v, 3) for k, v in log.phases.items()}, timeline=log.timeline,
                         preparations=tuple(log.preparations))
    if paths.summary is not None:
        result.write_csv(paths.summary)
    return result


def _remove_stale_frames() -> None:
    """:func:`nbhelpers.framestore.remove_stale_frames` in this machine's temporary folder, never raising."""
    try:
        remove_stale_frames()
    except Exception:  # noqa: BLE001 - tidying must not cost the batch its outcomes
        pass
