"""Batch dubbing on Ray: many (video, audio) jobs over every GPU of a machine or a cluster, with nothing lost.

:func:`run` groups the jobs by face, prepares each face's avatar once, renders every clip on Ray workers that each
hold one loaded pipeline, and returns a :class:`BatchResult` (also written as a CSV); guarantees: ``docs/batch.md``.
Modules in data-flow order: ``jobs``, ``records``, ``inputs``, ``cluster``, ``worker``, ``scheduler``, ``results``;
:class:`BatchConfig` is in :mod:`nbhelpers.config`. Importing the package imports neither Ray nor torch; Ray is
the ``[batch]`` extra.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..checks import check_weights_dir
from ..config import BatchConfig, InferenceConfig
from ..errors import InputError
from ..framestore import remove_stale_frames
from ..gpu.device import free_memory_by_index
from .cluster import INSTALL_RAY, RaySession, init_ray, ray_installed, require_ray, shutdown_ray
from .inputs import WorkPlan, probe_inputs, sort_jobs
from .jobs import ROW_SETTINGS, Job, check_jobs, job_configs, read_jobs
from .records import (
    batch_lock,
    check_writable,
    fingerprinter,
    likely_work,
    outputs_folder,
    record_path,
    remove_half_built,
    remove_partials,
    weights_state,
)
from .results import BatchResult, JobOutcome, check_summary_path, write_stopped_summary
from .scheduler import RunLog, Scheduler
from .worker import BatchWorker, choose_jobs_per_worker

__all__ = ["BatchConfig", "BatchResult", "BatchWorker", "INSTALL_RAY", "Job", "JobOutcome", "ROW_SETTINGS",
           "check_jobs", "init_ray", "outputs_folder", "ray_installed", "read_jobs", "record_path", "remove_partials",
           "run", "shutdown_ray"]


def run(jobs: str | os.PathLike | Sequence[Job | Mapping[str, Any]], config: BatchConfig | None = None, *,
        inference: InferenceConfig | None = None, weights_dir: str | os.PathLike | None = None) -> BatchResult:
    """Run a batch of lip-sync jobs on Ray and return a :class:`BatchResult` (also written to the summary CSV);
    what is guaranteed: ``docs/batch.md``.

    Args:
        jobs: A jobs file (:func:`read_jobs`), or :class:`Job` objects or dicts.
        config: How the batch runs; None: ``BatchConfig()``.
        inference: Every job's settings (a job's own override them; ``device="cpu"`` keeps the workers on the CPU).
        weights_dir: The weights folder, visible to every worker; None: the default folder.

    Raises:
        MissingDependencyError: Ray is not installed.
        WeightsError: Weight files are missing.
        InputError: Before Ray starts: a malformed jobs file or job, two jobs sharing an output, ``config`` not a
            BatchConfig, a folder that cannot be written in, a summary that would replace another file, or another
            batch holding the cache's or outputs folder's lock (a bad media file fails only its job).
        KeyboardInterrupt: Ctrl-C (:class:`~nbhelpers.errors.Terminated` on SIGTERM), raised once the workers are
            down, partial files removed and the summary written with the unfinished jobs ``"interrupted"``.
    """
    t0 = time.perf_counter()
    if config is not None and not isinstance(config, BatchConfig):
        raise InputError(f"config must be a BatchConfig (how the batch runs); got {type(config).__name__}. Give the "
                         "jobs' InferenceConfig as inference=.")
    config, inference = config or BatchConfig(), inference or InferenceConfig()
    jobs_file = jobs if isinstance(jobs, (str, os.PathLike)) else None
    job_list = read_jobs(jobs_file) if jobs_file is not None else check_jobs(jobs)
    outputs, weights_path = outputs_folder(job_list), check_weights_dir(weights_dir, inference.version)
    cache, summary = config.cache_path(outputs), config.summary_path(outputs)
    check_writable([j.output.parent for j in job_list] + [cache] + ([summary.parent] if summary is not None else []))
    if summary is not None:
        check_summary_path(summary, job_list, jobs_file)
    configs = job_configs(job_list, inference)  # settings are validated before anything starts
    require_ray()
    with batch_lock(cache), batch_lock(outputs, ".batch.lock", "the outputs folder"):
        return _run_locked(job_list, config, inference, configs, weights_path, cache, summary, t0)


def _workers(config: BatchConfig, inference: InferenceConfig, joining: bool) -> tuple[int, str, int]:
    """``(jobs per worker, note, processes a local Ray starts ahead)``; jobs per worker, when not given, come from the
    free memory of this machine's GPUs (nvidia-smi, no CUDA here)."""
    free = None
    if inference.device != "cpu" and not joining:
        free = free_memory_by_index()
        if free and config.gpus is not None:
            free = dict(sorted(free.items())[:config.gpus])
    per_gpu = config.workers_per_gpu or 1
    per_gpu_note = "1 worker per GPU" if config.workers_per_gpu is None else f"{per_gpu} worker(s) per GPU, as asked"
    if config.jobs_per_worker is None:
        slots, why = choose_jobs_per_worker(inference, free, per_gpu, joining=joining)
    else:
        slots, why = config.jobs_per_worker, f"{config.jobs_per_worker} job(s) at once per worker, as asked"
    n_gpu_guess = config.gpus if config.gpus is not None else (len(free) if free else 1)
    ahead = max(config.cpu_workers, per_gpu * max(1, n_gpu_guess))
    return slots, "; ".join(n for n in (per_gpu_note, why) if n), ahead


def _run_locked(job_list: list[Job], config: BatchConfig, inference: InferenceConfig,
                configs: Mapping[str, InferenceConfig], weights_path: Path, cache: Path, summary: Path | None,
                t0: float) -> BatchResult:
    """:func:`run` once its arguments are checked and the batch holds its locks."""
    remove_partials(*(j.output for j in job_list))
    remove_half_built(cache)  # a batch stopped before it could tidy (killed, or the machine went down)
    slots, workers_note, ahead = _workers(config, inference, bool(config.address or os.environ.get("RAY_ADDRESS")))
    ray = RaySession(config.address, num_cpus=ahead, num_gpus=config.gpus)
    log, plan = RunLog(), WorkPlan()
    try:
        # Probe the inputs, find the finished outputs and group the rest by face into the plan, starting Ray here
        # meanwhile unless every job looks finished or failed at these checks last time with the same inputs.
        fingerprints = fingerprinter()
        if likely_work(job_list, cache, config.rerun):
            with ThreadPoolExecutor(1, thread_name_prefix="batch-checks") as pool:
                probing = pool.submit(probe_inputs, job_list, fingerprints)
                try:
                    ray.start()
                finally:
                    probed = probing.result()  # the probe's own errors (none expected) come after Ray's
            log.phases["ray_start"] = time.perf_counter() - t0
        else:
            probed = probe_inputs(job_list, fingerprints)
        sort_jobs(plan, job_list, configs, probed, fingerprints, weights_state(weights_path, inference.version),
                  cache, config.rerun)
        if plan.todo:
            log.phases["checks"] = time.perf_counter() - t0
            if not ray.started:  # every output had a record, yet some input or setting changed
                ray.start()
                log.phases["ray_start"] = time.perf_counter() - t0
            Scheduler(require_ray(), plan, configs, weights_path, inference, config, slots, log, t0).run()
        else:
            log.phases.clear()
    except BaseException as exc:  # Ctrl-C, SIGTERM (the command line's), an error: nothing half-made is left
        try:
            ray.stop()  # the workers stop before their partial files are removed
        finally:  # a second Ctrl-C during the shutdown still leaves no partial file
            remove_partials(*(j.output for j in job_list))
            remove_half_built(cache)
            if summary is not None:
                write_stopped_summary(job_list, plan.outcomes, summary, exc, t0)
        raise
    finally:
        ray.stop()  # before returning: Ray must be down when the caller next uses it
        if config.address is None:  # the workers ran here: frames a stopped one could not remove go now
            with contextlib.suppress(Exception):  # tidying must not cost the batch its outcomes
                remove_stale_frames()
    remove_partials(*(j.output for j in job_list))
    result = BatchResult(outcomes=tuple(plan.outcomes[j.name] for j in job_list), summary_csv=summary,
                         wall_s=time.perf_counter() - t0, workers=tuple(log.workers), avatars=log.avatars,
                         workers_note=workers_note if any("cuda" in w for w in log.workers) else "",
                         phases={k: round(v, 3) for k, v in log.phases.items()}, timeline=log.timeline,
                         preparations=tuple(log.preparations))
    if summary is not None:
        result.write_csv(summary)
    return result
