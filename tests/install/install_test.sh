#!/usr/bin/env bash
# install_test.sh BUILD_DIR: installs zckpt into a scratch prefix and builds a consumer
# with find_package(zckpt) and with pkg-config, then runs both.
set -euo pipefail
build="$1"; here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# both programs; a package and library that need no CUDA or NCCL (the device code is the
# engine's own library), whatever the build had
test -x "$tmp/prefix/bin/zckpt" && test -x "$tmp/prefix/bin/zckpt-train"
! grep -rlE "CUDAToolkit|NCCL|cudart" "$tmp"/prefix/lib*/cmake/zckpt/ || { echo "FAIL: the CMake package needs CUDA"; exit 1; }
! ldd "$(ls "$tmp"/prefix/lib*/libzckpt.so | head -1)" | grep -E "cudart|nccl|cublas" || { echo "FAIL: libzckpt.so links CUDA"; exit 1; }
cmake -S "$here/consumer" -B "$tmp/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/b" >/dev/null
"$tmp/b/consumer" "$ZCK_FIXTURES/torch/dtypes.pt" "$tmp/out.safetensors"
test -s "$tmp/out.safetensors"
libdir=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -1)
PKG_CONFIG_PATH="$libdir" pkg-config --exists zckpt
cc -o "$tmp/pc" "$here/consumer/main.c" $(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs --static zckpt)
LD_LIBRARY_PATH="$(dirname "$libdir")" "$tmp/pc"
# the man pages, made from --help at build time where help2man is installed
if grep -q '^ZCK_HELP2MAN:FILEPATH=/' "$build/CMakeCache.txt"; then
  for page in zckpt zckpt-consolidate zckpt-reshard zckpt-to-universal zckpt-verify zckpt-inspect zckpt-convert; do
    f=$(ls "$tmp"/prefix/share/man/man1/$page.1 2>/dev/null) || { echo "FAIL: no man page $page.1"; exit 1; }
    grep -q "usage: zckpt" "$f" || { echo "FAIL: $page.1 does not hold its --help"; exit 1; }
  done
  if command -v man >/dev/null; then
    MANPATH="$tmp/prefix/share/man" man -P cat zckpt-consolidate 2>/dev/null | grep -q "zero_to_fp32" ||
      { echo "FAIL: man zckpt-consolidate"; exit 1; }
  fi
fi
echo "1 passed, 0 failed"
