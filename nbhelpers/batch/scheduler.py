"""The dispatch loop: start the workers on a running Ray, hand out avatar preparations and jobs until every job has
an outcome, retry the work of a worker that died, and stop the workers. The jobs of a face go to a worker that
holds its avatar when one is free."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import progress
from ..config import BatchConfig, InferenceConfig
from ..errors import FallbackWarning, NbHelpersError
from .cluster import close_workers, collect_timeline, is_worker_loss
from .inputs import FaceGroup, WorkPlan
from .jobs import Job
from .records import remove_partials, write_record
from .results import error_text, job_outcome
from .worker import BatchWorker

# Jobs a GPU worker holds per render slot beyond the one rendering: one is enough for the next clip to be ready to
# render when a clip's last batch is done.
WAITING_PER_SLOT = 1
PING_AFTER_S = 1.0  # a worker that died is asked whether it is back this long after, and again after each miss
PINGS_BEFORE_GIVING_UP = 300  # misses (about 5 minutes) before a restarting worker is given up
PROGRESS_EVERY_S = 1.0  # how often the running jobs' frames are asked of their workers
# For tests: {job name: frame}; the worker running that job exits (os._exit) when it has made that frame, on the
# job's first attempt, as a killed worker would. Empty otherwise.
EXIT_AT: Mapping[str, int] = {}


def cpu_worker_count(asked: int, offered: int, needed: int) -> int:
    """CPU workers to start: ``asked``, at most the ``offered`` CPUs (each worker takes one, and Ray would leave
    the others waiting), warning (FallbackWarning) when fewer than ``needed``."""
    count = max(1, min(needed, offered or 1))
    if count < needed:
        warnings.warn(f"cpu_workers={asked} is more than the {offered or 1} CPU(s) Ray offers, and each worker takes "
                      f"one: running {count} worker(s). (Each worker also holds its own models; more workers than "
                      "cores would only share the cores.)", FallbackWarning, stacklevel=5)
    return count


@dataclass
class RunLog:
    """What a run reports besides the outcomes (:class:`~nbhelpers.batch.results.BatchResult`'s fields)."""

    workers: list[str] = field(default_factory=list)
    avatars: dict[str, int] = field(default_factory=lambda: {"prepared": 0, "loaded": 0})
    phases: dict[str, float] = field(default_factory=dict)
    timeline: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    preparations: list[dict[str, Any]] = field(default_factory=list)


class Scheduler:
    """Hands out the face groups of ``plan`` to workers on a running ``ray`` (as many as ``config`` asks, each running
    ``slots`` jobs at once), recording every job's outcome in ``plan.outcomes`` and the workers, avatars, phases
    (seconds since ``t0``), timeline and preparations in ``log``."""

    def __init__(self, ray, plan: WorkPlan, job_configs: Mapping[str, InferenceConfig], weights_path: Path,
                 inference: InferenceConfig, config: BatchConfig, slots: int, log: RunLog, t0: float):
        self.ray, self.plan, self.job_configs = ray, plan, job_configs
        self.weights_path, self.inference, self.config, self.log, self.t0 = weights_path, inference, config, log, t0
        self.actors: list[Any] = []
        self.names: list[str] = []
        self.slots = self.depth = slots
        self.busy: dict[Any, tuple[int, str, Any, int]] = {}  # ref -> (actor index, kind, group or job, attempt)
        self.attempts: dict[str, int] = {}
        self.frames_done: dict[str, int] = {}
        self.polls: set[Any] = set()  # the progress calls not answered yet
        self.last_poll = 0.0
        self.holds: list[set[str]] = []  # the group keys each worker holds an avatar of
        self.alive: list[bool] = []
        self.ping_at: dict[int, float] = {}  # restarting workers: when to ask again whether they are back
        self.pings_lost: dict[int, int] = {}
        self.jobs_bar = self.frames_bar = None

    def _worker_options(self) -> tuple[int, dict[str, Any], str]:
        """``(workers, Ray actor options, device)``: per GPU when Ray offers GPUs (and the batch may use them),
        else CPU workers, one Ray CPU each; never more workers than jobs."""
        c, todo, per_gpu = self.config, self.plan.todo, self.config.workers_per_gpu or 1
        resources = self.ray.cluster_resources()
        n_gpu = 0 if self.inference.device == "cpu" else int(resources.get("GPU", 0))
        if c.gpus is not None:
            n_gpu = min(n_gpu, c.gpus)
        if n_gpu:
            n, options, device = n_gpu * per_gpu, {"num_gpus": 1 / per_gpu, "num_cpus": 0}, "cuda"
        else:
            n = cpu_worker_count(c.cpu_workers, int(resources.get("CPU", 0)), min(todo, c.cpu_workers))
            options, device = {"num_cpus": 1}, "cpu"
        return max(1, min(n, todo)), options, device

    def _start_workers(self) -> None:
        n, options, device = self._worker_options()
        threads = max(1, (os.cpu_count() or 1) // n)
        # A GPU worker also holds waiting jobs that read their audio and start their encoders, so the GPU never
        # waits for a clip's start or end; a CPU worker (its cores are torch's) holds only the jobs it runs.
        self.depth = self.slots * (1 + WAITING_PER_SLOT) if device == "cuda" else self.slots
        # Threads per worker: its calls, and one more for the progress polls.
        remote = self.ray.remote(BatchWorker).options(max_restarts=-1, max_task_retries=0,
                                                      max_concurrency=self.depth + 1, **options)
        base = self.inference.to_dict()
        self.actors = [remote.remote(str(self.weights_path), base, device, threads, self.slots) for _ in range(n)]
        try:
            self.names = self.ray.get([a.describe.remote() for a in self.actors])
            self.log.phases["workers_ready"] = time.perf_counter() - self.t0
        except Exception as exc:  # noqa: BLE001 - a worker that cannot load the pipeline stops the batch
            raise NbHelpersError(f"the batch workers could not start ({error_text(exc)[:2000]}). Check that "
                                 "nbhelpers, its weights folder and the media are there on every Ray node.") from exc
        self.holds = [set() for _ in self.actors]
        self.alive = [True] * len(self.actors)

    def _finish(self, job: Job, status: str, error: str, attempts: int, reply: dict[str, Any] | None = None) -> None:
        """Record ``job``'s outcome; ``reply`` is its worker's (frames, seconds, worker, timings), None if none ran."""
        reply = reply or {}
        frames, ended_s = reply.get("frames", 0), round(time.perf_counter() - self.t0, 3)
        self.plan.outcomes[job.name] = job_outcome(job, status, error, frames=frames, seconds=reply.get("seconds", 0.0),
                                                   attempts=attempts, worker=reply.get("worker", ""), ended_s=ended_s,
                                                   timings=reply.get("timings"))
        self.jobs_bar.update(1)
        self.frames_bar.update(max(frames - self.frames_done.pop(job.name, 0), 0))

    def _fail_group(self, group: FaceGroup, error: str) -> None:
        group.state, group.error = "failed", error
        while group.queue:
            job = group.queue.popleft()
            self._finish(job, "failed", group.error, self.attempts.get(job.name, 0))

    def _next_work(self, i: int, jobs_only: bool) -> tuple[str, FaceGroup] | None:
        """Worker ``i``'s next call: a job of a face it holds (the one with most jobs left), else a preparation
        (unless ``jobs_only``), else a job of a face another worker prepared (most work left per holder)."""
        groups = self.plan.groups.values()
        ready = [g for g in groups if g.state == "ready" and g.queue]
        mine = [g for g in ready if g.key in self.holds[i]]
        if mine:
            return "job", max(mine, key=lambda g: len(g.queue))
        pending = [g for g in groups if g.state == "pending" and g.queue]
        if pending and not jobs_only:
            return "prepare", pending[0]
        if ready:
            return "job", max(ready, key=lambda g: len(g.queue) / (1 + sum(g.key in h for h in self.holds)))
        return None

    def _submit(self, i: int, held: int) -> None:
        # a call beyond the worker's render slots (it holds `held` calls) waits for one: a job (its encoder starts
        # meanwhile), never a preparation that another worker could start at once
        work = self._next_work(i, jobs_only=held >= self.slots)
        if work is None:
            return
        kind, group = work
        if kind == "prepare":
            group.state = "preparing"
            group.attempts += 1
            ref = self.actors[i].prepare.remote(group.key, str(group.video), str(group.directory), group.config,
                                                group.box)
            self.busy[ref] = (i, "prepare", group, group.attempts)
            return
        job = group.queue.popleft()
        n = self.attempts[job.name] = self.attempts.get(job.name, 0) + 1
        kill = EXIT_AT.get(job.name) if n == 1 else None
        ref = self.actors[i].generate.remote(group.key, str(group.directory), self.job_configs[job.name].to_dict(),
                                             job.name, str(job.audio), str(job.output), kill)
        self.busy[ref] = (i, "job", job, n)
        self.log.phases.setdefault("first_job", time.perf_counter() - self.t0)

    def _fill(self) -> None:
        """Give each live worker calls up to its depth, breadth first: every worker gets work before any gets a
        second call."""
        for level in range(self.depth):
            for i in range(len(self.actors)):
                held = sum(j == i and kind != "ping" for j, kind, _, _ in self.busy.values())
                if self.alive[i] and held <= level:
                    self._submit(i, held)

    def _ping_restarting(self) -> None:
        """Ask each worker Ray is restarting whether it is back (it takes work again once it answers)."""
        now = time.perf_counter()
        for i, when in list(self.ping_at.items()):
            if now >= when:
                del self.ping_at[i]
                self.busy[self.actors[i].describe.remote()] = (i, "ping", None, 0)

    def _reply(self, ref: Any, i: int, n: int) -> tuple[dict[str, Any] | None, str]:
        """``(reply, "")`` of a finished call, or ``(None, why)`` when its worker died (Ray restarts it; it takes
        work again once a ping finds it back). An error Ray raised for the call itself is the call's failure."""
        try:
            return self.ray.get(ref), ""
        except Exception as exc:  # noqa: BLE001 - a dead worker, or an error Ray raised for the call
            if not is_worker_loss(self.ray, exc):
                return {"ok": False, "error": error_text(exc), "seconds": 0.0, "worker": self.names[i]}, ""
            self.holds[i].clear()
            self.alive[i] = False
            self.ping_at[i] = time.perf_counter() + PING_AFTER_S
            return None, (f"its worker died during each of its {n} attempt(s) (last {self.names[i]}: "
                          f"{type(exc).__name__})")

    def _on_prepare(self, i: int, group: FaceGroup, n: int, reply: dict[str, Any] | None, lost: str) -> None:
        self.log.phases["prepare_s"] += float((reply or {}).get("seconds", 0.0))
        if reply is None:  # its worker died: the half-built avatar goes, the face is prepared again
            for tmp in group.directory.glob(".building-*") if group.directory.is_dir() else ():
                shutil.rmtree(tmp, ignore_errors=True)
            if n >= self.config.max_attempts:
                self._fail_group(group, f"preparing the avatar failed: {lost}")
            else:
                group.state = "pending"
            return
        self.log.preparations.append({
            "video": str(group.video), "worker": reply.get("worker", self.names[i]),
            "status": "failed" if not reply["ok"] else "loaded" if reply["loaded_from_cache"] else "prepared",
            "seconds": round(float(reply.get("seconds", 0.0)), 3), "ended_s": round(time.perf_counter() - self.t0, 3),
            "timings": dict(reply.get("timings") or {})})
        if reply["ok"]:
            group.state = "ready"
            self.holds[i].add(group.key)
            self.log.avatars["loaded" if reply["loaded_from_cache"] else "prepared"] += 1
        else:
            self._fail_group(group, reply["error"])

    def _on_job(self, i: int, job: Job, n: int, reply: dict[str, Any] | None, lost: str) -> None:
        group = self.plan.groups[self.plan.group_of[job.name]]
        if reply is None:  # its worker died: its half-written file goes, the job runs again (or has failed)
            remove_partials(job.output)
            self.frames_bar.update(-self.frames_done.pop(job.name, 0))
            if n >= self.config.max_attempts:
                self._finish(job, "failed", lost, n)
            else:
                group.queue.appendleft(job)
            return
        if not reply["ok"]:
            self._finish(job, "failed", reply["error"], n, reply)
            return
        self.holds[i].add(group.key)
        write_record(job.output, self.plan.inputs_of[job.name], reply["frames"], reply["worker"], reply["seconds"])
        self._finish(job, "done", "", n, reply)

    def _on_done(self, ref: Any) -> None:
        i, kind, item, n = self.busy.pop(ref)
        reply, lost = self._reply(ref, i, n)
        if kind == "ping" and reply is None:
            self.pings_lost[i] = self.pings_lost.get(i, 0) + 1
            if self.pings_lost[i] > PINGS_BEFORE_GIVING_UP:
                self.ping_at.pop(i, None)
        elif kind == "ping":  # the worker is back
            self.pings_lost.pop(i, None)
            self.alive[i] = True
        elif kind == "prepare":
            self._on_prepare(i, item, n, reply, lost)
        else:
            self._on_job(i, item, n, reply, lost)

    def _poll_progress(self) -> None:
        """Frames of the running jobs into the frames bar, asked of their workers about once a second."""
        ready = self.ray.wait(list(self.polls), num_returns=len(self.polls), timeout=0)[0] if self.polls else []
        for ref in ready:
            self.polls.remove(ref)
            try:
                counts = self.ray.get(ref)
            except Exception:  # noqa: BLE001 - a worker that died: its job is retried
                continue
            for name, count in counts.items():
                if self.plan.outcomes.get(name) is None and name in self.plan.group_of:
                    self.frames_bar.update(max(count - self.frames_done.get(name, 0), 0))
                    self.frames_done[name] = max(count, self.frames_done.get(name, 0))
        now = time.perf_counter()
        running = {i for i, kind, _, _ in self.busy.values() if kind == "job"}  # workers running a job
        if now - self.last_poll > PROGRESS_EVERY_S and running and not self.polls:
            self.last_poll = now
            self.polls = {self.actors[i].progress.remote() for i in running}

    def _loop(self) -> None:
        while any(g.queue for g in self.plan.groups.values()) or any(k != "ping" for _, k, _, _ in self.busy.values()):
            self._fill()
            self._ping_restarting()
            if not self.busy and not self.ping_at:
                break  # no worker left (every queued job has a group that is pending or ready)
            if not self.busy:
                time.sleep(0.2)
                continue
            done, _ = self.ray.wait(list(self.busy), num_returns=1, timeout=0.5)
            for ref in done:
                self._on_done(ref)
            self._poll_progress()

    def run(self) -> None:
        """Start the workers, run every job to an outcome and stop the workers; NbHelpersError when they could not
        start (the pipeline or the weights are missing on a node)."""
        self.log.phases["prepare_s"] = 0.0
        try:
            self._start_workers()
            settled = len(self.plan.outcomes)  # failed or skipped at the checks; every other job is queued
            with progress.bar(total=settled + self.plan.todo, desc="batch jobs", unit="job",
                              initial=settled) as jobs_bar, \
                    progress.bar(total=sum(self.plan.expected_frames.values()), desc="batch frames",
                                 unit="frame") as frames_bar:
                self.jobs_bar, self.frames_bar = jobs_bar, frames_bar
                self._loop()
                self.log.phases["jobs_done"] = time.perf_counter() - self.t0
                collect_timeline(self.ray, self.actors, self.names, self.t0, self.log.timeline)
                close_workers(self.ray, self.actors)
                for group in self.plan.groups.values():  # only when every worker is gone for good
                    if group.queue:
                        self._fail_group(group, group.error or "no batch worker was left to run it (every worker died)")
            self.log.workers = list(self.names)
        finally:
            for a in self.actors:
                with contextlib.suppress(Exception):  # stopping must not hide the batch's outcome
                    self.ray.kill(a)
