#!/usr/bin/env bash
# find_python.sh MODULE... -- PROGRAM ARGS...: runs an interop test with the interop Python:
# $ZCK_PYTHON when set, else the venv that scripts/interop_env.sh makes in the user's cache.
# A PROGRAM ending in .py runs under that Python; any other PROGRAM runs as it is, with
# ZCK_PYTHON set to it. When that Python lacks a MODULE the test is skipped (77), or fails
# when ZCK_INTEROP_REQUIRED=1 (scripts/test.sh sets it, so a broken environment cannot
# pass as a skipped comparison).
mods=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do mods+=("$1"); shift; done
shift
py=${ZCK_PYTHON:-${XDG_CACHE_HOME:-$HOME/.cache}/zckpt/interop-venv/bin/python}
imports=$(IFS=,; echo "${mods[*]:-sys}")
if ! why=$("$py" -c "import $imports" 2>&1); then
  echo "no interop Python with ${mods[*]}: $py: ${why##*$'\n'}"
  echo "(run scripts/interop_env.sh to make it, or set ZCK_PYTHON)"
  [ "${ZCK_INTEROP_REQUIRED:-0}" = 1 ] && exit 1
  echo "SKIP"
  exit 77
fi
export ZCK_PYTHON=$py
case "$1" in
  *.py) exec "$py" "$@" ;;
  *) exec "$@" ;;
esac
