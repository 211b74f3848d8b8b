"""Where the wall time of a benchmark goes, per thread: a sampling profiler over ``sys._current_frames``.

cProfile sees only the thread that starts it and slows every call; this samples every Python thread's stack at a
fixed interval from a daemon thread and counts, per thread, the innermost frame (the line that is running, or the
line that called into C: a torch op, a numpy kernel, a lock wait) and every function on the stack. A thread waiting
for the GIL is counted where it waits, so the counts are wall time, which is what a 2-core benchmark is short of.

    with StackSampler() as sampler:
        ...
    print(sampler.report())
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time


class StackSampler:
    """Sample all threads' Python stacks every ``interval`` seconds until :meth:`stop`.

    Args:
        interval: Seconds between samples (0.005 = 200 Hz; the sampler's own cost is about 1 % of one core).
        roots: Path fragments a frame's file must contain to be listed in the inclusive table (the project's code).
    """

    def __init__(self, interval: float = 0.005, roots: tuple[str, ...] = ("nbhelpers", "bench")):
        self.interval, self.roots = float(interval), roots
        self.self_counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.incl_counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.samples: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.seconds = 0.0
        self.ticks = 0

    def __enter__(self) -> StackSampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.seconds = time.perf_counter() - self._t0

    @staticmethod
    def _where(code, lineno: int) -> str:
        path = code.co_filename
        parts = path.replace("\\", "/").split("/")
        short = "/".join(parts[-2:])
        return f"{short}:{lineno} {code.co_name}"

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            self.ticks += 1
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, str(ident))
                self.samples[name] += 1
                self.self_counts[name][self._where(frame.f_code, frame.f_lineno)] += 1
                seen = set()
                f = frame
                while f is not None:
                    code = f.f_code
                    if any(r in code.co_filename for r in self.roots):
                        key = f"{'/'.join(code.co_filename.split(os.sep)[-2:])}:{code.co_firstlineno} {code.co_name}"
                        if key not in seen:
                            seen.add(key)
                            self.incl_counts[name][key] += 1
                    f = f.f_back

    def report(self, top: int = 25, min_share: float = 0.02) -> str:
        """Per thread with at least ``min_share`` of the samples of the busiest: the top self lines and the top
        project functions (inclusive), in seconds (samples x interval)."""
        if not self.samples:
            return "stack sampler: no samples"
        busiest = max(self.samples.values())
        per = self.seconds / max(self.ticks, 1)  # the real spacing of the samples (the wait plus the walk)
        lines = [f"stack sampler: {self.seconds:.2f} s, {self.ticks} samples every {per * 1e3:.1f} ms; seconds = "
                 "samples x spacing (wall time, GIL waits included)"]
        for name, n in self.samples.most_common():
            if n < min_share * busiest:
                continue
            lines.append(f"\n## thread {name}: {n * per:.2f} s sampled")
            lines.append("  self (innermost line):")
            for where, c in self.self_counts[name].most_common(top):
                lines.append(f"    {c * per:7.2f} s  {where}")
            lines.append("  inclusive (project functions on the stack):")
            for where, c in self.incl_counts[name].most_common(top):
                lines.append(f"    {c * per:7.2f} s  {where}")
        return "\n".join(lines)
