#!/bin/sh
# run_python.sh SCRIPT ARGS...: runs a Python interop test with $ZCK_PYTHON, else
# /work/venv/bin/python, else python3; exit 77 (skipped) when there is none.
PY=${ZCK_PYTHON:-/work/venv/bin/python}
[ -x "$PY" ] || PY=$(command -v python3) || { echo "SKIP: no Python" >&2; exit 77; }
exec "$PY" "$@"
