"""Bench-only: a stack sampler started in every Ray batch worker and bench child process, for where their wall
time goes over time (start-up, first clips, steady state).

Put this folder first on ``PYTHONPATH`` and set ``BENCH_STACKS_OUT=DIR``: each matching process (a Ray
``default_worker.py`` or ``bench/batch.py --child``) samples every thread's stack every 5 ms from a daemon thread and
appends the finished bins to ``DIR/stacks-<pid>.jsonl`` once a second (a worker is killed at Ray's shutdown, so there is
no exit to wait for). Each line holds one 0.5 s bin of wall time (``time.time()``), per thread, the counts of its
innermost line and of its innermost nbhelpers frame; ``bench/prof/summarize.py`` prints them. Nothing happens without
the variable, and nothing in nbhelpers knows of this file.
"""
import os
import sys

_OUT = os.environ.get("BENCH_STACKS_OUT")
_ARGV = " ".join(getattr(sys, "orig_argv", None) or sys.argv or [])
if _OUT and ("default_worker.py" in _ARGV or "--child" in _ARGV):
    import collections
    import json
    import threading
    import time

    def _where(code, lineno):
        parts = code.co_filename.replace("\\", "/").split("/")
        return f"{'/'.join(parts[-3:])}:{lineno} {code.co_name}"

    def _sample():
        bins = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
        me, last_dump, bin_s = threading.get_ident(), time.time(), 0.5
        path = os.path.join(_OUT, f"stacks-{os.getpid()}.jsonl")
        while True:
            time.sleep(0.005)
            now = time.time()
            names = {t.ident: t.name for t in threading.enumerate()}
            b = bins[round(now - now % bin_s, 1)]
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, str(ident))
                b[name]["self " + _where(frame.f_code, frame.f_lineno)] += 1
                f = frame
                while f is not None and "nbhelpers" not in f.f_code.co_filename:
                    f = f.f_back
                b[name]["ours " + (_where(f.f_code, f.f_lineno) if f is not None else "-")] += 1
            if now - last_dump > 1.0:  # append the finished bins (one JSON line each) and forget them
                last_dump = now
                done = [t for t in bins if t < now - bin_s]
                with open(path, "a") as fh:
                    for t in sorted(done):
                        fh.write(json.dumps({"t": t, "threads": {n: dict(c) for n, c in bins.pop(t).items()}}) + "\n")

    os.makedirs(_OUT, exist_ok=True)
    threading.Thread(target=_sample, name="bench-sampler", daemon=True).start()
