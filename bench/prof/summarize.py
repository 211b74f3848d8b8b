"""Print what bench/prof/sitecustomize.py sampled: per process, per window of wall time, the busiest threads' top
lines (innermost) and top nbhelpers frames, in seconds (samples x 5 ms).

    python bench/prof/summarize.py DIR [--window 2] [--top 4] [--since T0]

Times are seconds from the earliest sample of all processes (or from ``--since``, a ``time.time()`` value).
Threads whose samples are all in waits (a lock, a queue, a select) are left out.
"""
from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

WAITS = ("threading.py", "queue.py", "selectors.py", "concurrent/futures", "asyncio/", "socket.py",
         "multiprocessing/connection.py", "subprocess.py:2", "ray/_private/worker.py", "ray/_private/state.py",
         "_private/services.py", "ray/_raylet", "default_worker.py", "time.sleep", "ffmpeg.py:134 _drain")
SPACING = 0.005


def load(folder: Path) -> dict[str, list[dict]]:
    runs = {}
    for path in sorted(folder.glob("stacks-*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if rows:
            runs[path.stem] = rows
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--since", type=float, default=None)
    args = parser.parse_args()
    runs = load(Path(args.folder))
    t0 = args.since or min(r[0]["t"] for r in runs.values())
    for name, rows in runs.items():
        print(f"\n# {name}: {rows[0]['t'] - t0:.1f} to {rows[-1]['t'] - t0 + 0.5:.1f} s")
        windows = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
        for row in rows:
            w = int((row["t"] - t0) // args.window)
            for thread, counts in row["threads"].items():
                windows[w][thread].update(counts)
        for w in sorted(windows):
            lines = []
            for thread, counts in sorted(windows[w].items()):
                selfs = collections.Counter({k[5:]: v for k, v in counts.items() if k.startswith("self ")})
                busy = sum(v for k, v in selfs.items() if not any(s in k for s in WAITS))
                if busy * SPACING < 0.1 * args.window:
                    continue
                ours = collections.Counter({k[5:]: v for k, v in counts.items() if k.startswith("ours ")})
                top_self = ", ".join(f"{k} {v * SPACING:.2f}" for k, v in selfs.most_common(args.top))
                top_ours = ", ".join(f"{k} {v * SPACING:.2f}" for k, v in ours.most_common(args.top))
                lines.append(f"  {thread} (busy {busy * SPACING:.2f} s)\n    self: {top_self}\n    ours: {top_ours}")
            if lines:
                print(f"[{w * args.window:5.1f}-{(w + 1) * args.window:5.1f} s]")
                print("\n".join(lines))


if __name__ == "__main__":
    main()
