#!/usr/bin/env bash
# Every GPU measurement of a release in one device session, most important first, each bounded in time, so that
# one slow step cannot use up the session. Run from the repository root on the GPU machine, with the wheels the
# machine lacks in .whl/ (diffusers, imageio-ffmpeg, soundfile + cffi + pycparser, soxr, importlib-metadata,
# spandrel, spandrel-extra-arches) and the shared media in .benchdata/ (test use only; git ignores it: carry it with .whl). Logs and
# JSON go to $OUT (default ./out).
#
#   bash bench/device_run.sh [STEP ...]   # steps: weights lipsync realtime tests live restore (default: all, in order)
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD NBHELPERS_PROGRESS=0 PYTHONUNBUFFERED=1 NBHELPERS_SHARED_DATA=$PWD/.benchdata
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
steps=${*:-weights lipsync realtime tests live restore}
start=$(date +%s)
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  case " $steps " in *" $name "*) ;; *) return 0 ;; esac
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s (at $(( $(date +%s) - start )) s)" | tee -a "$OUT/steps.txt"
}
# Full-size random weights on all cores (reused by every later step).
step weights 70 python3 bench/lipsync.py --seconds 1 --boxes --warmup-seconds 0 --skip-official --work /tmp/ls
# Issue 16: the offline job with faces detected, 2 cores, beside the official offline loop; memory under a 4 GiB cap.
step lipsync 170 taskset -c 0,1 python3 bench/lipsync.py --seconds 20 --cores 2 --cap-gib 4 --work /tmp/ls \
  --out "$OUT/lipsync.json"
# Issue 16: the avatar path with libx264 medium and veryfast, beside the official realtime loop.
step realtime 100 taskset -c 0,1 python3 bench/realtime.py --seconds 20 --cores 2 --weights /tmp/ls/weights \
  --encoders libx264,libx264-veryfast
# The GPU code paths' tests (CUDA engine: overlapped loop, deferred copies, OOM retry; live; restoration).
step tests 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engine.py tests/test_live.py \
  tests/test_restore.py
# Issue 17: live session latency and fps (8 s of speech to keep the session short).
step live 50 taskset -c 0,1 python3 bench/live.py --seconds 8 --weights /tmp/ls/weights
# Issue 20: the restorers alone on the GPU (faces/s and memory at batch 16).
step restore 45 python3 bench/restore.py --core-only --weights /tmp/ls/restore-weights
exit 0
