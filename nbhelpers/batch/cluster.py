"""Ray for a batch: start it here or join a cluster, stop it, and the driver's calls every worker answers."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import time
from typing import Any

from ..errors import MissingDependencyError

INSTALL_RAY = 'pip install "ray>=2.10"'


def ray_installed() -> bool:
    """True when Ray can be imported (checked without importing it)."""
    return importlib.util.find_spec("ray") is not None


def require_ray():
    """Import Ray, or raise :class:`MissingDependencyError` with the install line."""
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError(
            f"batch runs need Ray, which is not installed ({exc}). Install it with `{INSTALL_RAY}` (or install this "
            "package with its batch extra: `pip install -e \".[batch]\"` in a checkout), then run the batch "
            "again.") from exc
    return ray


def init_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None):
    """Join the Ray cluster at ``address`` (``"auto"``, ``"HOST:PORT"``, ``"ray://HOST:PORT"``; None = ``$RAY_ADDRESS``
    when set), or start a small Ray here offering ``num_cpus`` (default 2, at most the cores) CPUs and ``num_gpus``
    GPUs (None = all), trying once more after a startup timeout. True when this call started or joined it (the caller
    shuts it down), False when it was running; MissingDependencyError when Ray is not installed."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _ray_init(ray, address=address)
        return True
    # address="local": always a new instance (a bare ray.init() would join a cluster someone `ray start`ed here)
    options = dict(address="local", num_cpus=max(1, min(int(num_cpus or 2), os.cpu_count() or 1)),
                   num_gpus=num_gpus, include_dashboard=False, object_store_memory=256 * 2**20)
    try:
        _ray_init(ray, **options)
    except Exception as exc:  # noqa: BLE001 - Ray's own startup timeout on a loaded machine: try once more
        if "timed out during startup" not in str(exc):
            raise
        ray.shutdown()
        _ray_init(ray, **options)
    return True


# Ray >= 2.59 logs this notice at every local start with configure_logging=False (its token-auth default).
_AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
_AUTH_NOTICE = "Token authentication is enabled for this Ray cluster."


def _drop_auth_notice(record: Any) -> bool:
    """A logging filter: False for Ray's notice that token authentication is on, True for every other record."""
    try:
        return not str(record.getMessage()).startswith(_AUTH_NOTICE)
    except Exception:  # noqa: BLE001 - a record that cannot be formatted is passed on, as it was
        return True


def _ray_init(ray, **options) -> None:
    """``ray.init(**options)`` quietly (no driver logs, no token-authentication notice), the SIGTERM handler kept."""
    notice_logger = logging.getLogger(_AUTH_NOTICE_LOGGER)
    notice_logger.addFilter(_drop_auth_notice)
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(log_to_driver=False, configure_logging=False, **options)
    finally:
        notice_logger.removeFilter(_drop_auth_notice)
        # ray.init replaces the driver's SIGTERM handler (ray/_private/worker.py); the program's own clean-up goes back
        if sigterm is not None:
            with contextlib.suppress(ValueError, OSError, TypeError):  # ValueError: not the main thread
                signal.signal(signal.SIGTERM, sigterm)


def shutdown_ray() -> None:
    """``ray.shutdown()``, a local instance's autoscaler monitor killed first.

    The monitor answers SIGTERM by reporting to the GCS, already stopped, and so waits out Ray's one-second grace
    (``ray/autoscaler/_private/monitor.py``); a local instance has no autoscaling to finish."""
    ray = require_ray()
    with contextlib.suppress(Exception):  # Ray's internals differ: its own shutdown stops the monitor
        node = ray._private.worker._global_node
        monitors = node.all_processes.get("monitor", []) if node is not None and node.is_head() else []
        for info in monitors:
            if info.process.poll() is None:
                info.process.kill()
                info.process.wait(timeout=5)
    ray.shutdown()


class RaySession:
    """Ray for one batch at ``address`` (None = here or ``$RAY_ADDRESS``), offering ``num_cpus`` and ``num_gpus``
    locally: started or joined when needed, shut down at the end only when this batch started it."""

    def __init__(self, address: str | None, num_cpus: int, num_gpus: int | None):
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self.started = False  # this batch started or joined Ray (or is starting it): it shuts it down

    def start(self) -> None:
        """Start or join Ray (:func:`init_ray`); nothing when Ray is running in this process already."""
        started_before = self.started
        self.started = True  # a stop during Ray's start still shuts down what it started
        self.started = init_ray(self.address, num_cpus=self.num_cpus,
                                num_gpus=self.num_gpus if self.address is None else None) or started_before

    def stop(self) -> None:
        """Shut Ray down (:func:`shutdown_ray`) when this batch started it or was starting it."""
        if self.started:
            self.started = False
            shutdown_ray()


def is_worker_loss(ray, exc: BaseException) -> bool:
    """A Ray error that means the worker process went away (retry the job), not a failure of the job."""
    lost = tuple(getattr(ray.exceptions, n) for n in ("RayActorError", "WorkerCrashedError", "NodeDiedError",
                                                      "OutOfMemoryError", "ObjectLostError")
                 if hasattr(ray.exceptions, n))
    return isinstance(exc, lost)


def close_workers(ray, actors: list[Any]) -> None:
    """Ask each worker to close its avatars (their frames on disk go) before ``ray.kill``, waiting at most 10 s; what
    a silent worker leaves, the next frame store on its machine removes."""
    with contextlib.suppress(Exception):  # tidying must not cost the batch its outcomes
        ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=10.0)


def collect_timeline(ray, actors: list[Any], names: list[str], t0: float, timeline: dict) -> None:
    """Each live worker's :meth:`~nbhelpers.batch.worker.BatchWorker.events` into ``timeline`` under its name,
    as seconds since ``t0`` (this process's perf_counter) by the wall clock; workers silent for 5 s are left out."""
    start_wall = time.time() - (time.perf_counter() - t0)
    try:
        refs = [a.events.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=5.0)
    except Exception:  # noqa: BLE001 - the timeline is a report: it must not cost the batch its outcomes
        return
    for name, ref in zip(names, refs, strict=True):
        with contextlib.suppress(Exception):  # a worker that died: no timeline, the outcomes are what count
            if ref in ready:
                timeline[name] = tuple((str(e), round(float(w) - start_wall, 3)) for e, w in ray.get(ref))
