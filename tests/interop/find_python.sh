#!/usr/bin/env bash
# find_python.sh MODULE... -- SCRIPT ARGS...: runs SCRIPT with the first Python that
# imports every MODULE ($ZCK_PYTHON, then /work/venv, ../venv, python3); exits 77 (skip)
# when none does. Interop tests never make the default suite need Python packages.
mods=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do mods+=("$1"); shift; done
shift
here="$(cd "$(dirname "$0")" && pwd)"
for py in "${ZCK_PYTHON:-}" /work/venv/bin/python "$here/../../../venv/bin/python" python3; do
  [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
  if "$py" -c "import $(IFS=,; echo "${mods[*]}")" >/dev/null 2>&1; then
    exec "$py" "$@"
  fi
done
echo "SKIP: no Python with ${mods[*]} (set ZCK_PYTHON; see tests/interop/requirements.txt)"
exit 77
