#!/usr/bin/env bash
# Issue 18's measurement on the GPU machine: bench/batch.py (Ray batch against a plain loop of nbh.lipsync()), with
# Ray and the other packages the machine lacks brought as the xz tarballs of bench/pack_device_site.sh in .raywhl/
# (ray-site.tar.xz ~24 MB, deps-site.tar.xz ~23 MB, SHA256SUMS), or the device_run.sh wheels in .whl/ for the
# non-Ray part. Run from the repository root there; logs and JSON go to $OUT (default ./out).
#
#   bash bench/device_batch.sh [STEP ...] [-- BENCH ARGS]   # steps: ray bench (default: both, in order)
#
#   ray   : unpack .raywhl/ray-site.tar.xz into /tmp/raysite and the packages (.whl/*.whl by pip as device_run.sh
#           does, else .raywhl/deps-site.tar.xz) into /tmp/site; each skipped when a marker of the same tarball is
#           there already (a warm machine keeps /tmp), so a call that carries only .benchdata can follow one that
#           carried .raywhl.
#   bench : python3 bench/batch.py --weights /tmp/ls/weights --out $OUT/batch.json BENCH ARGS, held to
#           $BENCH_LIMIT s (default 540); the weights written by device_run.sh's 'weights' step are reused.
#
# The GPU machine's image sets PYTHONDONTWRITEBYTECODE=1 and its site-packages hold no __pycache__: every new
# Python process there compiles torch, transformers, diffusers and Ray from source (about 8 s of an 18 s import of
# what a batch worker loads), as a user's pip install (which writes .pyc) never does. PYCACHE=1 compiles them all
# once into /tmp/pyc first and points PYTHONPYCACHEPREFIX there, for every process of both arms alike (the
# condition of a machine whose packages pip installed with their .pyc); the installed packages are not touched.
# STACKS=1 puts bench/prof first on PYTHONPATH: its sitecustomize samples every thread of the batch workers and
# of the bench's arm processes into $OUT/stacks (bench/prof/summarize.py prints them).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
steps=() bench_args=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then shift; bench_args=("$@"); break; fi
  steps+=("$1"); shift
done
[ ${#steps[@]} -gt 0 ] || steps=(ray bench)
export PYTHONPATH=/tmp/raysite:/tmp/site:$PWD NBHELPERS_PROGRESS=0 PYTHONUNBUFFERED=1 \
  NBHELPERS_SHARED_DATA=$PWD/.benchdata RAY_USAGE_STATS_ENABLED=0
start=$(date +%s)
note() { echo "$*" | tee -a "$OUT/steps.txt"; }

pycache() {  # PYCACHE=1: every installed package's bytecode compiled once into /tmp/pyc, used through the prefix
  local site
  site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  if [ ! -f /tmp/pyc/.compiled ]; then
    local t0=$SECONDS
    PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m compileall -q -j "$(nproc)" "$site" /tmp/site /tmp/raysite \
      "$PWD/nbhelpers" "$PWD/bench" > /tmp/pyc-compile.log 2>&1
    local rc=$?  # a file that does not compile (a package's test data) is skipped, the rest is there
    touch /tmp/pyc/.compiled
    note "compiled $site, /tmp/site, /tmp/raysite, nbhelpers and bench into /tmp/pyc in $(( SECONDS - t0 )) s" \
      "(compileall exit $rc, its log /tmp/pyc-compile.log)"
  fi
  export PYTHONPYCACHEPREFIX=/tmp/pyc
}
note "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset} PYCACHE=${PYCACHE:-0} STACKS=${STACKS:-0}"
if [ "${STACKS:-0}" = 1 ]; then export PYTHONPATH=$PWD/bench/prof:$PYTHONPATH BENCH_STACKS_OUT=$OUT/stacks; fi

unpack() {  # unpack TARBALL DEST: extract (Python's tarfile: no xz program needed) unless DEST has its marker
  local tarball=$1 dest=$2 sum
  sum=$(sha256sum "$tarball" | cut -c1-16)
  if [ -f "$dest/.unpacked-$sum" ]; then note "$dest: already unpacked from $tarball"; return 0; fi
  if [ -f .raywhl/SHA256SUMS ]; then
    (cd "$(dirname "$tarball")" && grep " $(basename "$tarball")\$" SHA256SUMS | sha256sum -c --quiet -) \
      || { note "$tarball: checksum mismatch"; return 1; }
  fi
  mkdir -p "$dest"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="tar")' \
    "$tarball" "$dest" || { note "$tarball: unpack failed"; return 1; }
  touch "$dest/.unpacked-$sum"
  note "$dest: unpacked from $tarball ($(du -sm "$dest" | cut -f1) MB)"
}

stage_ray() {
  if [ -f .raywhl/ray-site.tar.xz ]; then unpack .raywhl/ray-site.tar.xz /tmp/raysite || return 1
  elif ! ls /tmp/raysite/.unpacked-* > /dev/null 2>&1; then note "no .raywhl/ray-site.tar.xz carried, none unpacked"; return 1
  fi
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || return 1
    touch /tmp/site/.from-whl
    note "/tmp/site: installed from .whl"
  elif [ -f .raywhl/deps-site.tar.xz ]; then unpack .raywhl/deps-site.tar.xz /tmp/site || return 1
  elif ! ls /tmp/site/.unpacked-* /tmp/site/.from-whl > /dev/null 2>&1; then
    note "neither .whl nor .raywhl/deps-site.tar.xz carried, and /tmp/site is empty"; return 1
  fi
  python3 -c 'import ray, diffusers, imageio_ffmpeg, jsonschema; print("ray", ray.__version__, ray.__file__)' \
    2>&1 | tee -a "$OUT/steps.txt"
  return "${PIPESTATUS[0]}"
}

for s in "${steps[@]}"; do
  t0=$(date +%s)
  case $s in
    ray) stage_ray; rc=$? ;;
    bench)
      [ "${PYCACHE:-0}" = 1 ] && pycache
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
      set -o pipefail
      timeout "${BENCH_LIMIT:-540}" python3 bench/batch.py --weights /tmp/ls/weights --work /tmp/bench-batch \
        --out "$OUT/batch.json" "${bench_args[@]}" 2>&1 | tee "$OUT/batch.log"
      rc=$?; set +o pipefail ;;
    *) note "unknown step $s (steps: ray bench)"; exit 2 ;;
  esac
  note "$s: exit $rc in $(( $(date +%s) - t0 )) s (at $(( $(date +%s) - start )) s)"
  [ "$rc" = 0 ] || exit "$rc"
done
exit 0
