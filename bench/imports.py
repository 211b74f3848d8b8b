"""What a fresh process pays to import the packages a batch worker loads, with and without diffusers' Flax probe.

Runs, each in a fresh interpreter (``-X importtime``), ``import torch`` then the model classes nbhelpers uses
(diffusers ``AutoencoderKL`` and ``UNet2DConditionModel``, transformers ``WhisperModel``), once as is and once with
``USE_FLAX=0`` (diffusers' switch that stops it importing its Flax classes where jax and flax are installed, as on
Colab), and prints the wall seconds, the slowest top-level imports of each and the self time summed per top-level
package (which packages a worker's imports pull in, and what each costs).

    python bench/imports.py [--out DIR] [--runs 2] [--modes as-is,use-flax-0] [--worker]

``--worker`` adds what a batch worker imports of nbhelpers itself (its pipeline, avatar and models modules).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

CODE = ("import torch; from diffusers import AutoencoderKL, UNet2DConditionModel; "
        "from transformers import WhisperModel; AutoencoderKL, UNet2DConditionModel, WhisperModel")


WORKER_CODE = "import nbhelpers.pipeline, nbhelpers.avatar, nbhelpers.models; " + CODE
MODES = {"as-is": {}, "use-flax-0": {"USE_FLAX": "0", "USE_TF": "0"}}


def run(env_extra: dict[str, str], out: Path | None, tag: str, code: str = CODE) -> float:
    env = dict(os.environ, **env_extra)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        print(proc.stderr[-2000:])
        raise SystemExit(f"{tag}: the import failed")
    rows, packages = [], {}  # (cumulative s, nesting, module); {top-level package: summed self s}
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            rows.append((int(m.group(2)) / 1e6, len(m.group(3)), m.group(4)))
            top_name = m.group(4).split(".")[0]
            packages[top_name] = packages.get(top_name, 0.0) + int(m.group(1)) / 1e6
    if out is not None:
        (out / f"importtime-{tag}.txt").write_text(proc.stderr)
    top = sorted((r for r in rows if r[1] <= 3), reverse=True)[:12]
    print(f"{tag}: {wall:.2f} s wall; " + ", ".join(f"{name} {cum:.2f}" for cum, _, name in top))
    print("  self time by package: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                                 sorted(packages.items(), key=lambda kv: -kv[1])[:20]))
    flax = [name for _, _, name in rows if name.split(".")[0] in ("jax", "flax", "tensorflow")]
    print(f"  jax/flax/tensorflow modules imported: {len(flax)}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--runs", type=int, default=2, help="rounds of every mode")
    parser.add_argument("--modes", default="as-is,use-flax-0", help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--worker", action="store_true", help="add nbhelpers' own worker imports")
    args = parser.parse_args()
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for k in range(args.runs):
        for mode in args.modes.split(","):
            run(MODES[mode], out, f"{mode}-{k}", WORKER_CODE if args.worker else CODE)


if __name__ == "__main__":
    main()
