"""The batch's own settings: one frozen dataclass the CLI's batch flags and :func:`nbhelpers.batch.run` share.

The jobs' settings are an :class:`~nbhelpers.config.InferenceConfig`. Each field's ``metadata["help"]`` is its
command-line help (flag ``--`` and the name with dashes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError


@dataclass(frozen=True)
class BatchConfig:
    """How a batch runs; validated at construction.

    Attributes:
        address: Ray cluster to join (``"auto"``, ``"HOST:PORT"``, ``"ray://HOST:PORT"``); None starts Ray here or
            joins ``$RAY_ADDRESS``. On a cluster every path must be on storage all nodes see.
        cache_dir: Avatar cache folder; None = ``<outputs folder>/avatar-cache``.
        summary: Summary CSV path; None = ``<outputs folder>/batch-summary.csv``; False writes none.
        cpu_workers: CPU workers when Ray offers no GPU, each with its own models; at most one per CPU Ray offers
            (more are cut, with a FallbackWarning).
        workers_per_gpu: Worker processes sharing each GPU; None = 1 (measured in bench/RESULTS.md, Issue 18).
        jobs_per_worker: Clips and preparations each worker renders at once over its loaded models (a GPU worker
            holds as many waiting jobs again); None = :func:`~nbhelpers.batch.worker.choose_jobs_per_worker`.
        gpus: GPUs to use; None = every GPU Ray offers.
        max_attempts: Starts of a job before its worker dying during it counts as its failure.
        rerun: Make every output again, even finished ones.
    """

    address: str | None = field(default=None, metadata={
        "help": "Ray cluster to join (auto, HOST:PORT); default: start Ray here"})
    cache_dir: str | os.PathLike | None = field(default=None, metadata={
        "help": "avatar cache (default: <outputs folder>/avatar-cache)"})
    summary: str | os.PathLike | bool | None = field(default=None, metadata={
        "help": "summary CSV (default: <outputs folder>/batch-summary.csv)"})
    cpu_workers: int = field(default=1, metadata={
        "help": "CPU workers when there is no GPU (default 1; at most one per CPU Ray offers; each holds its own "
                "models and the cores are shared out between them)"})
    workers_per_gpu: int | None = field(default=None, metadata={
        "help": "worker processes sharing each GPU (default 1: its jobs share one CUDA context and one set of "
                "models, the fastest measured)"})
    jobs_per_worker: int | None = field(default=None, metadata={
        "help": "clips each worker renders at once over its loaded models; a GPU worker holds as many jobs again, "
                "ready to render (default: 2 on a GPU where the free memory holds every worker's peak with two, "
                "else 1; 1 on the CPU)"})
    gpus: int | None = field(default=None, metadata={"help": "GPUs to use (default: all)"})
    max_attempts: int = field(default=3, metadata={
        "help": "starts of a job whose worker keeps dying (default 3)"})
    rerun: bool = field(default=False, metadata={"help": "make every output again, even finished ones"})

    def __post_init__(self) -> None:
        for name in ("cpu_workers", "workers_per_gpu", "jobs_per_worker", "max_attempts"):
            value = getattr(self, name)
            if value is not None or name in ("cpu_workers", "max_attempts"):
                _check_count(name, value, minimum=1, rule="a positive whole number")
        if self.gpus is not None:
            _check_count("gpus", self.gpus, minimum=0, rule="a whole number >= 0 or None (all)")
        if not isinstance(self.rerun, bool):
            raise InputError(f"rerun must be True or False; got {self.rerun!r}.")

    def cache_path(self, outputs_folder: Path) -> Path:
        """The avatar cache's folder, absolute: ``cache_dir``, or ``<outputs_folder>/avatar-cache``."""
        if self.cache_dir is None:
            return outputs_folder / CACHE_NAME
        return Path(self.cache_dir).expanduser().resolve()

    def summary_path(self, outputs_folder: Path) -> Path | None:
        """The summary CSV's path, absolute (None when ``summary=False``)."""
        if self.summary is False:
            return None
        if self.summary is None or self.summary is True:
            return outputs_folder / SUMMARY_NAME
        return Path(self.summary).expanduser().resolve()


CACHE_NAME = "avatar-cache"  # the avatar cache's folder in the outputs folder, when cache_dir is None
SUMMARY_NAME = "batch-summary.csv"  # the summary's name in the outputs folder, when summary is None


def _check_count(name: str, value: object, minimum: int, rule: str) -> None:
    """Raise InputError unless ``value`` is a whole number (not a bool) of at least ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InputError(f"{name} must be {rule}; got {value!r}.")
