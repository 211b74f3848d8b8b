"""Where the CPU time of a benchmark goes: CPU seconds per thread of this process and per child process.

Runs a script (any tree's ``bench/*.py``) in this process with a daemon thread that reads, every ``--interval``
seconds, ``/proc/self/task/*/stat`` (utime + stime of each thread, proc(5)) and ``/proc/PID/stat`` of every
descendant process (ffmpeg). Python threads are named by ``threading`` (matched on ``native_id``), other threads by
their kernel name (``comm``). A thread's figure is its last sample, so up to one interval of a thread that exits
between samples is lost; a process's figure includes its exited threads (the kernel adds them to the process).

    taskset -c 0,1 python3 bench/cputime.py --out cpu.txt -- bench/lipsync.py --seconds 20 --cores 2 ...

The report lists each thread and process with the window it was seen in (seconds from the start) and its CPU
seconds, so the timed job's threads and encoder can be told from the warm-up job's by their window.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")


def _stat(path: str) -> tuple[str, float, int] | None:
    """(comm, CPU seconds, parent pid) from a proc(5) stat file, or None when it is gone."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    lp, rp = text.index("("), text.rindex(")")
    fields = text[rp + 2:].split()  # fields from 3 (state) on
    return text[lp + 1:rp], (int(fields[11]) + int(fields[12])) / TICK, int(fields[1])


class CpuSampler:
    """Sample per-thread and per-descendant-process CPU seconds until :meth:`stop`."""

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.threads: dict[int, list] = {}  # tid -> [name, cpu, first, last]
        self.procs: dict[int, list] = {}  # pid -> [comm, cpu, first, last, args]
        self._stop = threading.Event()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        now = time.perf_counter() - self._t0
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid in os.listdir("/proc/self/task"):
            got = _stat(f"/proc/self/task/{tid}/stat")
            if got is None:
                continue
            tid = int(tid)
            name = names.get(tid) or f"[{got[0]}]"
            rec = self.threads.get(tid)
            if rec is None:
                rec = self.threads[tid] = [name, 0.0, now, now]
            elif not name.startswith("["):
                rec[0] = name
            rec[1], rec[3] = got[1], now
        parents = {os.getpid()}
        table = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                got = _stat(f"/proc/{entry}/stat")
                if got is not None:
                    table.append((int(entry), got))
        grew = True
        while grew:  # descendants at any depth (bash -c, then ffmpeg)
            grew = False
            for pid, (_comm, _cpu, ppid) in table:
                if ppid in parents and pid not in parents:
                    parents.add(pid)
                    grew = True
        for pid, (comm, cpu, _ppid) in table:
            if pid in parents and pid != os.getpid():
                rec = self.procs.get(pid)
                if rec is None:
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as f:
                            args = f.read().replace(b"\0", b" ").decode(errors="replace")
                    except OSError:
                        args = ""
                    rec = self.procs[pid] = [comm, 0.0, now, now, args]
                rec[1], rec[3] = cpu, now

    def report(self, wall: float, own: float) -> str:
        lines = [f"wall {wall:.2f} s; this process {own:.2f} CPU s (all threads, exited ones included)",
                 "", "| thread | seen (s) | CPU s | CPU % of its window |", "|---|---|---|---|"]
        for tid, (name, cpu, first, last) in sorted(self.threads.items(), key=lambda kv: -kv[1][1]):
            if cpu >= 0.05:
                span = max(last - first, self.interval)
                lines.append(f"| {name} ({tid}) | {first:.1f}-{last:.1f} | {cpu:.2f} | {100 * cpu / span:.0f} |")
        lines += ["", "| process | seen (s) | CPU s | CPU % of its window | command |", "|---|---|---|---|---|"]
        for pid, (comm, cpu, first, last, args) in sorted(self.procs.items(), key=lambda kv: kv[1][2]):
            if cpu >= 0.05:
                span = max(last - first, self.interval)
                lines.append(f"| {comm} ({pid}) | {first:.1f}-{last:.1f} | {cpu:.2f} | {100 * cpu / span:.0f} | "
                             f"{args[:160]} |")
        return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="write the report (markdown tables) here")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("script", help="the script to run in this process, then its arguments")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    a = parser.parse_args()
    sampler = CpuSampler(a.interval)
    sys.argv = [a.script, *a.args]
    sys.path[0] = os.path.dirname(os.path.abspath(a.script))  # as `python3 SCRIPT` would
    t0 = time.perf_counter()
    sampler.start()
    try:
        runpy.run_path(a.script, run_name="__main__")
    finally:
        sampler.stop()
        own = sum(os.times()[:2])
        with open(a.out, "w") as f:
            f.write(sampler.report(time.perf_counter() - t0, own))


if __name__ == "__main__":
    main()
