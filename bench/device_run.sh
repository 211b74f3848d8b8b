#!/usr/bin/env bash
# Every GPU measurement of a release in one device session, most important first, each bounded in time, so that
# one slow step cannot use up the session. Run from the repository root on the GPU machine, with the wheels the
# machine lacks in .whl/ (diffusers, imageio-ffmpeg, soundfile + cffi + pycparser, soxr, importlib-metadata,
# spandrel, spandrel-extra-arches) and the shared media in .benchdata/ (test use only; git ignores it: carry it with .whl). Logs and
# JSON go to $OUT (default ./out).
#
#   bash bench/device_run.sh [STEP ...]   # steps: weights lipsync realtime live lipsync4 tests restore batch
#                                         # (default: all, in order; one device call holds 10 min: split them)
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
# The packages: the .whl wheels, or (when .raywhl is carried instead, with Ray for the batch step) the xz tarballs
# of bench/pack_device_site.sh, unpacked by bench/device_batch.sh; a warm machine keeps them in /tmp.
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
else
  bash bench/device_batch.sh ray || exit 1
fi
export PYTHONPATH=/tmp/raysite:/tmp/site:$PWD NBHELPERS_PROGRESS=0 PYTHONUNBUFFERED=1 \
  NBHELPERS_SHARED_DATA=$PWD/.benchdata RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
steps=${*:-weights lipsync realtime live lipsync4 tests restore batch}
start=$(date +%s)
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  case " $steps " in *" $name "*) ;; *) return 0 ;; esac
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s (at $(( $(date +%s) - start )) s)" | tee -a "$OUT/steps.txt"
}
# Full-size random weights on all cores (reused by every later step).
step weights 90 python3 bench/lipsync.py --seconds 1 --boxes --warmup-seconds 0 --skip-official --work /tmp/ls
# Issue 16: the offline job with faces detected, 2 cores, beside the official offline loop.
step lipsync 200 taskset -c 0,1 python3 bench/lipsync.py --seconds 20 --cores 2 --work /tmp/ls \
  --out "$OUT/lipsync.json"
# Issue 16: the avatar path with libx264 medium and veryfast, beside the official realtime loop (avatar in /tmp/rt).
step realtime 150 taskset -c 0,1 python3 bench/realtime.py --seconds 20 --cores 2 --weights /tmp/ls/weights \
  --work /tmp/rt --encoders libx264,libx264-veryfast
# Issue 17: live session latency and fps (8 s of speech), on the avatar prepared above.
step live 70 taskset -c 0,1 python3 bench/live.py --seconds 8 --weights /tmp/ls/weights --work /tmp/rt
# Issue 16: memory of the offline job under a 4 GiB cap with the planner's settings (ours only).
step lipsync4 70 taskset -c 0,1 python3 bench/lipsync.py --seconds 20 --cores 2 --cap-gib 4 --skip-official \
  --work /tmp/ls --out "$OUT/lipsync4.json"
# The GPU code paths' tests (CUDA engine, streamed offline job, live, restoration).
step tests 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_engine.py tests/test_live.py \
  tests/test_restore.py tests/test_pipeline.py
# Issue 20: the restorers alone, then the offline job and the avatar path with and without each.
step restore 150 python3 bench/restore.py --weights /tmp/ls/weights --work /tmp/rt
# Issue 18: the Ray batch against a loop of nbh.lipsync() (Ray from .raywhl; 10 loop calls stand for 20).
step batch 250 env BENCH_LIMIT=240 bash bench/device_batch.sh bench -- --loop-jobs 10
exit 0
