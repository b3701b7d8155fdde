#!/usr/bin/env bash
# source_test.sh LIBZCKPT [TEST.py]: test_api.py (or TEST.py) on the package in python/ over a built library.
here="$(cd "$(dirname "$0")" && pwd)"
py="${ZCK_PYTHON3:-python3}"
command -v "$py" >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }
export ZCKPT_LIBRARY="$1" PYTHONPATH="$here/../../python"
exec "$py" "$here/${2:-test_api.py}"
