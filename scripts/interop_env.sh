#!/usr/bin/env bash
# Makes the Python environment the interop tests run zckpt against (torch, DeepSpeed,
# transformers, accelerate, peft, safetensors, h5py at the versions pinned in
# tests/interop/requirements.txt) and prints its interpreter on stdout.
#
# The venv lives in the user's cache, outside the checkout, so every clone shares it:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/zckpt/interop-venv
# It is (re)installed only when it is missing or when requirements.txt changed since the
# last install (the file's hash is kept in the venv); otherwise this takes a second.
# Then DeepSpeed's CPU ops are built once into torch's extension cache, so the first
# interop test does not spend its time limit compiling them.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
req="$root/tests/interop/requirements.txt"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/zckpt/interop-venv"
stamp="$venv/zckpt-requirements.sha256"
py="$venv/bin/python"
want=$(sha256sum "$req" | cut -d' ' -f1)

if ! "$py" -c '' 2>/dev/null || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "interop environment: installing tests/interop/requirements.txt into $venv (the first time takes minutes)" >&2
  mkdir -p "$(dirname "$venv")"
  if ! "$py" -c '' 2>/dev/null; then "${PYTHON:-python3}" -m venv --clear "$venv"; fi
  pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
  # DeepSpeed's setup.py imports torch, so torch (and numpy) go in before the rest.
  mapfile -t first < <(grep -E '^(torch|numpy)==' "$req")
  "${pip[@]}" "${first[@]}" >&2
  "${pip[@]}" -r "$req" >&2
  echo "$want" >"$stamp"
fi

DS_ACCELERATOR=cpu "$py" "$root/tests/interop/build_ds_ops.py" >&2
echo "$py"
