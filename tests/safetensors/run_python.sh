#!/bin/sh
# run_python.sh SCRIPT ARGS...: runs SCRIPT with $ZCK_PYTHON, /work/venv/bin/python or
# python3, whichever exists first; exit 77 (skipped) when there is none.
for p in "$ZCK_PYTHON" /work/venv/bin/python "$(command -v python3 2>/dev/null)"; do
  if [ -n "$p" ] && [ -x "$p" ]; then exec "$p" "$@"; fi
done
echo "SKIP: no Python found" >&2
exit 77
