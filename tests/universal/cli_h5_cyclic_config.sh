#!/bin/sh
# cli_h5_cyclic_config.sh ZCKPT FIXTURES: a model file whose ds_config holds a dict that
# contains itself, and a chain of dicts each referencing the next twice (a few hundred
# bytes of pickle, 2^64 values once expanded: deepspeed-malformed/ds_config_cyclic).
# to-universal --format hdf5 stores ds_config as JSON: it ran until memory was gone (6 GB
# in 15 s). It now stops within a bounded count of values: one line naming the model file
# and ds_config, exit 1, nothing at OUT. The jobs that carry the pickle as it is still take
# the checkpoint (the DeepSpeed universal folder, consolidate).
set -u
BIN=$1
CK=$2/deepspeed-malformed/ds_config_cyclic
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

timeout 120 "$BIN" to-universal -q --inject-missing-state --format hdf5 "$CK" "$T/u.h5" 2>"$T/err"
rc=$?
[ "$rc" = 1 ] || fail "to-universal --format hdf5: exit $rc, wanted 1: $(cat "$T/err")"
[ "$(wc -l <"$T/err")" = 1 ] || fail "not one line: $(cat "$T/err")"
grep -q "mp_rank_00_model_states.pt: ds_config: " "$T/err" || fail "the file and ds_config not named: $(cat "$T/err")"
[ -z "$(ls -A "$T" | grep -v '^err$')" ] || fail "left behind: $(ls -A "$T")"

"$BIN" to-universal -q --inject-missing-state --format ds "$CK" "$T/u" 2>"$T/err" || fail "to-universal --format ds: $(cat "$T/err")"
"$BIN" consolidate -q "$CK" "$T/m.safetensors" 2>"$T/err" || fail "consolidate: $(cat "$T/err")"
echo "ok"
