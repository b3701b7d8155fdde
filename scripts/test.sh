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
# without the interop tests (the real clients are not built with sanitizers) and the `race`
# tests, whose proof needs two threads racing at an unsanitized build's speed
(cd build-asan && ctest --output-on-failure -j"$jobs" -LE "interop|race") || status=1

# The builds a packager runs, built only (the suites above ran this code): Release with the
# system compiler, and clang; warnings as errors in both.
build_only() { # DIR CMAKE-ARGS...: configure and build, the log shown only on failure
  local dir=$1; shift
  if ! { cmake -S . -B "$dir" -DZCK_WERROR=ON "$@" && cmake --build "$dir" -j"$jobs"; } >"$dir.log" 2>&1; then
    tail -n 30 "$dir.log"; echo "FAILED: the build in $dir (log: $dir.log)"; status=1
  fi
}
build_only build-release -DCMAKE_BUILD_TYPE=Release
CC=clang build_only build-clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZCK_CUDA=OFF
exit $status
