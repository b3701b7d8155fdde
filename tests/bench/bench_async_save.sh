#!/usr/bin/env bash
# bench_async_save.sh: what a checkpoint save costs zckpt-train's step loop, synchronous
# against --async-save, measured in one process (bench_async_save.c) so the ratios hold
# under the same load: stall per save (sync, async, and the async one's snapshot copy)
# against the snapshot's memcpy floor, and the step loop with async saves against no saves
# (the save interval is longer than a write). Appends one block per configuration to
# results-async-save.txt with the machine and its load.
#
# Usage: tests/bench/bench_async_save.sh [BUILD_DIR]   (not run by ctest)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
bench=$build/bin/bench_async_save
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
results=$here/tests/bench/results-async-save.txt
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
# ZeRO-3 and ZeRO-2, 1.65M parameters (a ~19 MB snapshot), a save every 4 steps
for stage in 3 2; do
  {
    echo "# $(date -u +%F) $(nproc) cores ($cpu), load $(cut -d' ' -f1-3 /proc/loadavg) before the run"
    "$bench" "$out" 2 256 2 "$stage" 24 4
    echo
  } | tee -a "$results"
  rm -rf "${out:?}"/*
done
