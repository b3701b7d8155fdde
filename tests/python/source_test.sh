#!/usr/bin/env bash
# source_test.sh LIBZCKPT: test_api.py on the package in python/ over a built library.
here="$(cd "$(dirname "$0")" && pwd)"
py="${ZCK_PYTHON3:-python3}"
command -v "$py" >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }
export ZCKPT_LIBRARY="$1" PYTHONPATH="$here/../../python"
exec "$py" "$here/test_api.py"
