#!/usr/bin/env bash
# bench_ds_engine.sh: what DeepSpeed's save_checkpoint costs the training loop with its
# TorchCheckpointEngine, its DecoupledCheckpointEngine and zckpt.ds_engine, measured in one
# launch (bench_ds_engine.py: W ranks on the CPU, gloo), and appended to
# results-ds-engine.txt with the machine and its load.
#
# Usage: tests/bench/bench_ds_engine.sh [BUILD_DIR] [W] [WIDTH] [LAYERS]   (not run by ctest;
# needs the interop Python: scripts/interop_env.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
export ZCKPT_LIBRARY=$build/libzckpt.so DS_ACCELERATOR=cpu
results=$here/tests/bench/results-ds-engine.txt
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
{
  echo "# $(date -u +%F) $(nproc) cores ($cpu), load $(cut -d' ' -f1-3 /proc/loadavg) before the run"
  bash "$here/tests/interop/find_python.sh" torch deepspeed -- "$here/tests/bench/bench_ds_engine.py" "${2:-2}" \
    "${3:-1024}" "${4:-8}" 2>/dev/null
  echo
} | tee -a "$results"
