#!/usr/bin/env bash
# Issue 35's measurements on the GPU machine, each step bounded in time, logs and JSON to $OUT. Steps named t4-*
# run on the T4-class MPS share of the H200 (bench/t4proxy.sh's recipe), h200-* on the whole GPU; all at 2 cores
# (taskset) except weights, gputests and the steps that compile from cold (prime, warm, warm20, warm32,
# warmlive, core20, tune's cold phase, kernels, upsample).
#
#   bash bench/t4_run.sh weights oracle t4-warm t4-realtime t4-live   # GPU tests, then the avatar path and live
#   (t4-warm20: the avatar path's batch 20 only; t4-warm32: the offline job's batch 32; t4-warmlive: the decoders a
#   live session asks for, batch 2 and any batch; t4e-lipsync: the offline job with compile off; t4-lipsync-ours:
#   without the official loop;
#   t4-realtime-pool: the warm compile with inductor's worker pool, as before compile.py's _no_worker_pool)
#   bash bench/t4_run.sh weights t4-warm t4-lipsync t4-core           # the offline job, the official core
#   bash bench/t4_run.sh weights h200-lipsync h200-realtime h200-live  # whole-GPU no-regression rows (h200e-*: eager)
#   (base-*: the same rows from the tree in .base/, e.g. `git archive REV nbhelpers bench | tar -x -C .base`)
# t4-live waits for the sessions' own compiles (the decoder at batch 2 and with a dynamic batch, at 2 cores: 2 min
# and more) unless t4-warmlive filled the cache in the same call, hence its limit.
# A machine is released 30 s after a call and each call starts bare, so every call compiles from cold: t4-warm
# fills the inductor cache at 16 cores on the share for the batch shapes the benches use (avatar 20, offline 32),
# so the 2-core steps after it start warm, as a second Colab session with Drive does. The compile cache of one
# call (about 37 MB compressed, save-cache) does not fit beside the wheels within a call's 64 MiB.
# (t4-core: the official core; t4-core20: ours through the package at batch 20, cold; t4-warm20-2c: its cache; t4-prime also times dynamic-batch VAE halves beside the engine's static ones;
# t4-upsample: the decoder with its upsampling in phase form, bench/upsample_probe.py; t4-tune: inductor's tuning
# options, cold compile and warm load, bench/decoder_tuning.py, variants TAG:MODEL:OPTIONS[:FORM[:GN]] from $TUNE
# (OPTIONS as KEY=VALUE,...; GN: group or channels); t4-kernels: kernel
# profiles of the compiled decoder and the face models, bench/kernel_probe.py, parts from $KERNEL_PARTS.)
# Needs the wheels the machine lacks in .whl/ and the shared media in .benchdata/ (both git-ignored: carry them).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
if [ ! -d /tmp/site/diffusers ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD NBHELPERS_PROGRESS=0 PYTHONUNBUFFERED=1 NBHELPERS_SHARED_DATA=$PWD/.benchdata \
  NBHELPERS_COMPILE_CACHE=/tmp/compile-cache NBHELPERS_FULL_WEIGHTS=/tmp/ls/weights
W=/tmp/ls/weights
if [ -f .benchcache/compile-cache.tgz ] && [ ! -d /tmp/compile-cache ]; then
  tar xzf .benchcache/compile-cache.tgz -C /tmp
fi
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mps_up() { pgrep -x nvidia-cuda-mps >/dev/null; }  # the daemon and its server (names cut to 15)
mps_on() { mkdir -p /tmp/mps /tmp/mpslog; mps_up || nvidia-cuda-mps-control -d; }
mps_off() {  # quit returns before the daemon exits: wait for it, or the next step's clients miss the server
  echo quit | nvidia-cuda-mps-control 2>/dev/null
  for _ in $(seq 50); do mps_up || return 0; sleep 0.2; done
  pkill -x nvidia-cuda-mps; sleep 1
}
trap mps_off EXIT
# The files that ran, as one digest: the machine's git history can be older than the working tree it was sent, so
# compare this with the same line run in the checkout here.
find nbhelpers bench tests -name '*.py' | LC_ALL=C sort | xargs sha1sum | sha1sum | tee "$OUT/tree.txt"
start=$(date +%s)
step() {  # step NAME SECONDS COMMAND...: log to $OUT/NAME.log; t4-* steps on the MPS share, others on the whole GPU
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  if [ "${name#t4}" != "$name" ]; then
    mps_off; mps_on  # a fresh server each step: one whose client was killed answers "device is busy"
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=3 timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  else
    mps_off
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  fi
  echo "$name: exit $? in $(( $(date +%s) - t0 )) s (at $(( $(date +%s) - start )) s)" | tee -a "$OUT/steps.txt"
}
two="taskset -c 0,1"
# CPUTIME=1: the lipsync steps run under bench/cputime.py, its per-thread and per-process CPU report in $OUT/cpu-STEP.txt
py() { if [ -n "${CPUTIME:-}" ]; then echo "python3 $PWD/bench/cputime.py --out $OUT/cpu-$1.txt --"; else echo python3; fi; }
eager() { case $1 in h200e-*|t4e-*) echo "--compile off" ;; esac; }  # h200e-*, t4e-*: compile off
for s in "$@"; do
  case $s in
    weights) step weights 90 python3 -c "import sys; sys.path[:0] = ['bench']
from pathlib import Path; from _common import make_full_weights, make_face_weights
print(make_face_weights(make_full_weights(Path('$W'))))" ;;
    t4-prime) step t4-prime 270 python3 bench/compile.py --weights $W --batch 20 --compare-dynamic decoder,encoder \
      --out "$OUT/t4-compile.json" ;;
    t4-warm) step t4-warm 240 bash -c "python3 bench/compile.py --weights $W --batch 20 --parts unet,decoder \
      --no-timing && python3 bench/compile.py --weights $W --batch 32 --parts decoder,encoder,parser --no-timing" ;;
    t4-warm20) step t4-warm20 200 python3 bench/compile.py --weights $W --batch 20 --parts unet,decoder --no-timing ;;
    t4-kernels) step t4-kernels 420 python3 bench/kernel_probe.py --weights $W --out "$OUT/t4-kernels.json" \
      --parts ${KERNEL_PARTS:-decoder,decoder-cdt,faces,faces-compiled} ;;
    t4-tune) for v in ${TUNE:-dd:decoder:\{\} dm:decoder:max_autotune_pointwise=true}; do
        IFS=: read -r tag model opts form gn <<< "$v"; form=${form:-phase}  # FORM: phase, split4, nearest; -cl suffix
        step t4-tune-$tag-cold 240 python3 bench/decoder_tuning.py --phase cold --model $model --options "$opts" \
          --artifacts /tmp/tune-$tag.bin --out "$OUT/t4-tune.jsonl" --form ${form%-cl} --gn ${gn:-group} \
          $([ "${form%-cl}" != "$form" ] && echo --channels-last) $([ -n "${TUNE_DUMP:-}" ] && echo --dump $OUT/code) \
          $([ -n "${TUNE_REBUNDLE:-}" ] && echo --rebundle)
        [ "${TUNE_WARM:-1}" = 1 ] && step t4-tune-$tag-warm 90 $two python3 bench/decoder_tuning.py --phase warm \
          --model $model --options "$opts" --artifacts /tmp/tune-$tag.bin --out "$OUT/t4-tune.jsonl" \
          $([ -n "${TUNE_REBUNDLE:-}" ] && echo --rebundle)
      done ;;
    t4-upsample) step t4-upsample 240 python3 bench/upsample_probe.py --out "$OUT/t4-upsample.json" ;;
    t4-warmlive) step t4-warmlive 240 bash -c "python3 bench/compile.py --weights $W --batch 2 --parts decoder \
      --no-timing && python3 bench/compile.py --weights $W --parts decoder --dynamic --no-timing" ;;
    t4-warm32) step t4-warm32 420 python3 bench/compile.py --weights $W --batch 32 --parts unet,decoder,encoder,parser \
      --faces 768x576 --no-timing ;;
    t4-core20) step t4-core20 420 python3 bench/compile.py --weights $W --batch 20 --parts unet,decoder \
      --out "$OUT/t4-core20.json" ;;  # the package's compiled core (its tuned decoder included) and eager, cold
    t4-warm20-2c) step t4-warm20-2c 150 $two python3 bench/compile.py --weights $W --batch 20 --parts unet,decoder \
      --no-timing --out "$OUT/t4-warm20-2c.json" ;;  # after t4-core20 on a warm machine: its cache at 2 cores
    gputests) step gputests ${GPUTESTS_S:-240} python3 -m pytest -q -rs -p no:cacheprovider -m gpu ${GPUTESTS:-tests} ;;
    t4-core) step t4-core 60 $two python3 bench/t4probe.py --only E0 --out "$OUT/t4-core.jsonl" ;;
    t4-realtime) step t4-realtime 200 $two python3 bench/realtime.py --seconds 8 --cores 2 --weights $W --work /tmp/rt \
      --out "$OUT/t4-realtime.json" ;;
    t4-realtime-pool) step t4-realtime-pool 120 env TORCHINDUCTOR_COMPILE_THREADS=2 $two python3 bench/realtime.py \
      --seconds 8 --cores 2 --weights $W --work /tmp/rt --skip-reference --encoders "" --out "$OUT/t4-rt-pool.json" ;;
    t4-live) step t4-live 330 $two python3 bench/live.py --seconds 8 --weights $W --work /tmp/rt ;;
    t4-lipsync|t4e-lipsync|t4-lipsync-ours) step $s 260 $two python3 bench/lipsync.py --seconds 6 --cores 2 \
      --cap-gib 15 --work /tmp/ls --encoder libx264-veryfast --weights $W --out "$OUT/$s.json" $(eager $s) \
      $([ $s = t4-lipsync-ours ] && echo --skip-official) ${LIPSYNC_EXTRA:-} ;;
    h200-warm) step h200-warm 200 bash -c "python3 bench/compile.py --weights $W --batch 20 --parts unet,decoder \
      --no-timing && python3 bench/compile.py --weights $W --batch 32 --parts decoder,encoder,parser --no-timing" ;;
    h200-lipsync|h200e-lipsync) step $s 150 $two $(py $s) bench/lipsync.py --seconds 20 --cores 2 --skip-official \
      --encoder libx264 --work /tmp/ls --weights $W --out "$OUT/$s.json" $(eager $s) ${LIPSYNC_EXTRA:-} ;;
    h200-realtime|h200e-realtime) step $s 150 $two python3 bench/realtime.py --seconds 20 --cores 2 --weights $W \
      --work /tmp/rt2 --skip-reference --encoders libx264,libx264-veryfast --out "$OUT/$s.json" $(eager $s) ;;
    h200-live|h200e-live) step $s 100 $two python3 bench/live.py --seconds 8 --weights $W --work /tmp/rt2 \
      $(eager $s) ;;
    base-lipsync) step base-lipsync 60 env PYTHONPATH=/tmp/site:$PWD/.base bash -c "cd .base && $two $(py base-lipsync) \
      bench/lipsync.py --seconds 20 --cores 2 --skip-official --encoder libx264 --work /tmp/lsb --weights $W \
      --out $OUT/base-lipsync.json" ;;
    base-realtime) step base-realtime 60 env PYTHONPATH=/tmp/site:$PWD/.base bash -c "cd .base && $two python3 \
      bench/realtime.py --seconds 20 --cores 2 --weights $W --work /tmp/rtb --skip-reference \
      --encoders libx264,libx264-veryfast" ;;
    base-live) step base-live 100 env PYTHONPATH=/tmp/site:$PWD/.base bash -c "cd .base && $two python3 \
      bench/live.py --seconds 8 --weights $W --work /tmp/rtb" ;;
    tests) step tests 230 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_audio.py tests/test_blending.py \
      tests/test_compile.py tests/test_dwpose_torch.py tests/test_engine.py tests/test_latents.py tests/test_live.py \
      tests/test_parsing.py tests/test_parsing_torch.py tests/test_pipeline.py tests/test_reference.py tests/test_s3fd.py ;;
    oracle-only) step oracle-only 150 python3 -m pytest -q -rP -p no:cacheprovider -m gpu tests/test_reference.py ;;
    oracle) step oracle 200 python3 -m pytest -q -rP -p no:cacheprovider -m gpu tests/test_reference.py tests/test_compile.py \
      -k "on_cuda or as_close_to_eager" ;;  # issue 38's oracle, then a compile that warms the cache
    save-cache) tar czf "$OUT/compile-cache.tgz" -C /tmp compile-cache && ls -l "$OUT/compile-cache.tgz" ;;
    *) echo "unknown step $s" ;;
  esac
done
exit 0
