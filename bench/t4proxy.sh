#!/usr/bin/env bash
# Run one command on a T4-class GPU made from the H200 with CUDA MPS: the command's CUDA clients get the floor share
# of the GPU's multiprocessors (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=3: about 57.5 TFLOP/s fp16 matmul and 645 GB/s, a
# T4 at its very best; docs/benchmarks.md). The MPS daemon is started before and stopped after, whatever the exit.
#
#   bash bench/t4proxy.sh python3 bench/realtime.py ...     # or T4_PROXY=0 to run on the whole GPU
set -u
if [ "${T4_PROXY:-1}" = 0 ]; then exec "$@"; fi
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "t4proxy: could not start the MPS daemon" >&2; exit 3; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT INT TERM
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${T4_PROXY_PERCENT:-3} "$@"
