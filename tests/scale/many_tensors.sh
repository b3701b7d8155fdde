#!/bin/sh
# many_tensors.sh ZCKPT MAKE_BIG_CKPT [COUNT]: every job on a checkpoint of COUNT (default
# 2000: seconds on a quiet machine) small tensors, as MoE models have them. Each must complete, and the outputs must
# agree: reshard ZeRO-3 W=2 -> ZeRO-3 W=3 -> ZeRO-2 W=2 -> back to ZeRO-3 W=2 (reshard reads
# what it wrote, at stage 2 and 3) consolidates to the same bytes as the source; verify
# passes every output; the universal folder reshards back to the same bytes too, and it and
# the HDF5 container consolidate to the source's bytes.
# Not timed: tests/bench/bench_tensors.sh measures the cost at 10k and 100k tensors.
set -u
BIN=$1
GEN=$2
N=${3:-2000}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
run() { "$BIN" "$@" >"$T/log" 2>&1 || fail "zckpt $*: $(tail -3 "$T/log")"; }

"$GEN" "$T/src" --tensors "$N" --stage 3 --world 2 --threads 2 2>"$T/log" || fail "make_big_ckpt: $(cat "$T/log")"
run inspect "$T/src"
grep -q "ZeRO-3 checkpoint, tag global_step10, world size 2" "$T/log" || fail "inspect: $(head -3 "$T/log")"
[ "$(grep -c "model.layers.*bfloat16" "$T/log")" -ge "$N" ] || fail "inspect lists fewer than $N params"
run verify -q "$T/src"
run consolidate -q "$T/src" "$T/src.safetensors"
run inspect "$T/src.safetensors"
[ "$(grep -c "float32" "$T/log")" = "$N" ] || fail "consolidate: not $N fp32 tensors"

run reshard -q "$T/src" "$T/w3" --to-stage 3 --to-world-size 3
run verify -q "$T/w3"
run reshard -q "$T/w3" "$T/s2" --to-stage 2 --to-world-size 2
run verify -q "$T/s2"
run reshard -q "$T/s2" "$T/back" --to-stage 3 --to-world-size 2
run consolidate -q "$T/back" "$T/back.safetensors"
cmp -s "$T/src.safetensors" "$T/back.safetensors" || fail "reshard round trip: consolidated weights differ"

run to-universal -q --format ds "$T/src" "$T/u/uc"
run verify -q "$T/u/uc"
run reshard -q "$T/u" "$T/from_u" --to-stage 1 --to-world-size 2
run consolidate -q "$T/from_u" "$T/from_u.safetensors"
cmp -s "$T/src.safetensors" "$T/from_u.safetensors" || fail "universal round trip: consolidated weights differ"
run consolidate -q "$T/u" "$T/of_u.safetensors"
cmp -s "$T/src.safetensors" "$T/of_u.safetensors" || fail "consolidate of the universal folder differs"
run to-universal -q --format hdf5 "$T/src" "$T/u.h5"
run verify -q "$T/u.h5"
run inspect "$T/u.h5"
run consolidate -q "$T/u.h5" "$T/of_h5.safetensors"
cmp -s "$T/src.safetensors" "$T/of_h5.safetensors" || fail "consolidate of the HDF5 container differs"
echo "many_tensors: ok ($N tensors)"
