"""The batch's own settings (:func:`nbhelpers.batch.run`); the jobs' settings are an
:class:`~nbhelpers.config.InferenceConfig`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .fields import check, documented, setting

__all__ = ["CACHE_NAME", "SUMMARY_NAME", "BatchConfig"]

CACHE_NAME = "avatar-cache"  # the avatar cache's folder in the outputs folder, when cache_dir is None
SUMMARY_NAME = "batch-summary.csv"  # the summary's name in the outputs folder, when summary is None


@documented
@dataclass(frozen=True)
class BatchConfig:
    """How a batch runs; each setting is checked when the config is made.

    On a cluster every path (jobs, weights, outputs, cache) must be on storage all nodes see."""

    address: str | None = setting(None, none="start Ray here, or join $RAY_ADDRESS when set", help=(
        "Ray cluster to join: auto, HOST:PORT or ray://HOST:PORT"))
    cache_dir: str | os.PathLike | None = setting(None, none=f"<outputs folder>/{CACHE_NAME}", help=(
        "folder of the avatar cache, kept between runs"))
    summary: str | os.PathLike | bool | None = setting(
        None, rule="a path, True or False (no summary)", none=f"<outputs folder>/{SUMMARY_NAME}",
        help="path of the summary CSV")
    cpu_workers: int = setting(1, ge=1, help=(
        "CPU workers when Ray offers no GPU, at most one per CPU Ray offers (more are cut to that, with a warning); "
        "each holds its own models and the cores are shared out between them"))
    workers_per_gpu: int | None = setting(None, ge=1, none="1, the fastest measured", help=(
        "worker processes sharing each GPU (one worker's jobs share one CUDA context and one set of models, where "
        "processes time-share the GPU and load everything again)"))
    jobs_per_worker: int | None = setting(None, ge=1, none="2 on a GPU whose free memory holds every worker's peak "
                                                           "with two, else 1; 1 on the CPU", help=(
        "clips each worker renders at once over its loaded models; a GPU worker holds as many jobs again, which "
        "read their audio and start their encoder while they wait"))
    gpus: int | None = setting(None, ge=0, none="every GPU Ray offers", help="GPUs to use")
    max_attempts: int = setting(3, ge=1, help="starts of a job whose worker keeps dying before it counts as failed")
    rerun: bool = setting(False, help="make every output again, even finished ones")

    def __post_init__(self) -> None:
        check(self)

    def cache_path(self, outputs_folder: Path) -> Path:
        """The avatar cache's folder, absolute: ``cache_dir``, or ``<outputs_folder>/avatar-cache``."""
        return outputs_folder / CACHE_NAME if self.cache_dir is None else Path(self.cache_dir).expanduser().resolve()

    def summary_path(self, outputs_folder: Path) -> Path | None:
        """The summary CSV's path, absolute (None when ``summary=False``)."""
        if self.summary is False:
            return None
        if self.summary is None or self.summary is True:
            return outputs_folder / SUMMARY_NAME
        return Path(self.summary).expanduser().resolve()
