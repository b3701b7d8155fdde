#!/usr/bin/env bash
# Installs the Debian packages zckpt builds with, only those that are missing.
set -euo pipefail
# libopenmpi-dev + openmpi-bin: the MPI comm backend (process ranks) and mpirun for its tests
# python3-venv: the interop tests' venv (scripts/interop_env.sh); libaio-dev: DeepSpeed's
# async_io op, which the NVMe-offload interop case builds; clang: the second compiler
# scripts/test.sh builds with; libopenblas-dev: the matmuls of zckpt-train's CPU engine (optional
# at build time: without it the engine uses its own, slower loops)
pkgs=(build-essential cmake pkg-config libhdf5-dev libzstd-dev libcjson-dev libxxhash-dev zlib1g-dev libisal-dev
      libopenmpi-dev openmpi-bin python3-venv libaio-dev clang libopenblas-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
