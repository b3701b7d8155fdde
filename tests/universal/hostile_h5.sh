#!/bin/sh
# hostile_h5.sh ZCKPT FILE [NEEDLE]: an HDF5 file whose metadata crashes libhdf5 (found by
# fuzzing) is refused with one line and exit 1 — the process survives, nothing is written.
# NEEDLE (default: the probe's "the HDF5 library crashed"): for a file that crashes the
# library only in some builds (ASan), any one line naming the file.
out="$(mktemp -d)/out"
"$1" reshard -q --to-stage 1 "$2" "$out" 2>"$out.err"; rc=$?
[ "$rc" = 1 ] || { echo "FAIL: exit $rc"; cat "$out.err"; exit 1; }
grep -q "${3:-corrupt HDF5 metadata: the HDF5 library crashed}" "$out.err" || { echo "FAIL: message"; cat "$out.err"; exit 1; }
[ "$(wc -l <"$out.err")" = 1 ] || { echo "FAIL: not one line"; exit 1; }
[ ! -e "$out" ] || { echo "FAIL: output left"; exit 1; }
echo "1 passed, 0 failed"
