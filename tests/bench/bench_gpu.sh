#!/bin/sh
# bench_gpu.sh: GPU throughput of zckpt's device path, measured in one run on one device:
#   - the on-save 16-bit gather (fp32 ZeRO-3 partitions -> bf16 consolidated bytes on the
#     host) against the plain cudaMemcpy device -> pinned-host bandwidth it is bounded by;
#   - the device GPT-2's forward + backward tokens/s.
# Exits 77 (skipped) without a GPU or in a build without CUDA.
# Usage: tests/bench/bench_gpu.sh [BUILD_DIR] [bench_gpu options, e.g. --elems 1073741824]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${ZCK_BUILD:-$here/../../build}}
[ $# -gt 0 ] && shift
bin=$build/tests/gpu/bench_gpu
if [ ! -x "$bin" ]; then
  echo "bench_gpu.sh: $bin not found; build it: cmake --build $build --target bench_gpu" >&2
  exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader || true
fi
set +e
"$bin" "$@"
rc=$?
set -e
if [ $rc -eq 77 ]; then
  echo "bench_gpu.sh: skipped (no CUDA device)" >&2
fi
exit $rc
