#!/usr/bin/env bash
# Installs what is missing, builds zckpt (with CUDA when nvcc is present) and runs the
# whole test suite, the interop tests against the real torch / DeepSpeed / transformers
# included; then the suite again under AddressSanitizer + UBSan. Both halves always run;
# the exit status is non-zero when either failed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
jobs=$(nproc)

# The interop tests run with $ZCK_PYTHON, else the pinned venv in the user's cache, made
# here when missing (the first time takes minutes). Here a missing package fails them
# instead of skipping them.
[ -n "${ZCK_PYTHON:-}" ] || ./scripts/interop_env.sh >/dev/null
export ZCK_INTEROP_REQUIRED=1

status=0
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZCK_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs") || status=1

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DZCK_CUDA=OFF -DZCK_SANITIZE=address,undefined \
  -DZCK_WERROR=ON >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ctest --output-on-failure -j"$jobs" -LE "bench|interop") || status=1
exit $status
