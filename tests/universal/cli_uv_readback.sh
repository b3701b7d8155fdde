#!/bin/sh
# cli_uv_readback.sh ZCKPT FIXTURES: the universal folders zckpt to-universal makes (ds_to_universal.py's files) of a
# legacy deepspeed.moe checkpoint (ep_size 1, made by DeepSpeed 0.19.8: the experts in their expert files, not in
# `module`) and of a PipelineModule (module None, one mp_rank_<stage> file per stage) read back: consolidate equals the
# source's byte for byte (fp32 and --dtype bf16), verify passes; reshard from the deepspeed.moe folder is refused by
# name (as from a pipeline, and from the deepspeed.moe HDF5 container), nothing written; a missing expert state or stage file: one line naming it.
set -u
BIN=$1
FX=$2/deepspeed-moe
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for f in moe_ep1_s1 moe_ep1_s2_bf16 pipe_pp2_s1 pipe_pp2_dp2_bf16; do
  "$BIN" to-universal -q --inject-missing-state "$FX/$f/ckpt" "$T/$f" 2>"$T/err" || fail "$f: to-universal: $(cat "$T/err")"
  for d in fp32 bf16; do
    rm -f "$T/src.safetensors" "$T/uv.safetensors"
    "$BIN" consolidate -q --dtype $d "$FX/$f/ckpt" "$T/src.safetensors" 2>"$T/err" || fail "$f: $(cat "$T/err")"
    "$BIN" consolidate -q --dtype $d "$T/$f" "$T/uv.safetensors" 2>"$T/err" || fail "$f: read back: $(cat "$T/err")"
    cmp -s "$T/src.safetensors" "$T/uv.safetensors" || fail "$f: $d consolidate of the universal folder differs"
  done
  "$BIN" verify "$T/$f" >"$T/out" 2>&1 || fail "$f: verify: $(cat "$T/out")"
done
"$BIN" reshard -q --to-world-size 1 "$T/moe_ep1_s1" "$T/rs" 2>"$T/err" && fail "reshard wrote deepspeed.moe without expert files"
[ "$(wc -l <"$T/err")" = 1 ] && grep -q "deepspeed.moe" "$T/err" && [ ! -e "$T/rs" ] || fail "reshard: $(cat "$T/err")"
"$BIN" reshard -q --to-world-size 1 "$T/pipe_pp2_s1" "$T/rs" 2>"$T/err" && fail "reshard wrote a pipeline from its universal folder"
[ "$(wc -l <"$T/err")" = 1 ] && grep -q "PipelineModule" "$T/err" && [ ! -e "$T/rs" ] || fail "reshard: $(cat "$T/err")"

# the HDF5 container of deepspeed.moe reads back too, and reshard from it is refused by name: it holds no expert files
"$BIN" to-universal -q --format hdf5 "$FX/moe_ep1_s1/ckpt" "$T/moe.h5" 2>"$T/err" || fail "hdf5: $(cat "$T/err")"
rm -f "$T/src.safetensors" "$T/uv.safetensors"
"$BIN" consolidate -q "$FX/moe_ep1_s1/ckpt" "$T/src.safetensors" 2>"$T/err" || fail "$(cat "$T/err")"
"$BIN" consolidate -q "$T/moe.h5" "$T/uv.safetensors" 2>"$T/err" || fail "hdf5 read back: $(cat "$T/err")"
cmp -s "$T/src.safetensors" "$T/uv.safetensors" || fail "consolidate of the deepspeed.moe container differs"
for to in deepspeed dcp; do
  "$BIN" reshard -q --to-world-size 1 --to-format $to "$T/moe.h5" "$T/rs" 2>"$T/err" && fail "reshard --to-format $to wrote deepspeed.moe from its container"
  [ "$(wc -l <"$T/err")" = 1 ] && grep -q "deepspeed.moe" "$T/err" && [ ! -e "$T/rs" ] || fail "reshard $to: $(cat "$T/err")"
done

# $1 folder, $2 what the line must name: consolidate fails in one line, no output
refused() {
  "$BIN" consolidate -q "$T/$1" "$T/out.x" 2>"$T/err" && fail "$1: consolidate passed"
  [ "$(wc -l <"$T/err")" = 1 ] && grep -q "$2" "$T/err" && [ ! -e "$T/out.x" ] || fail "$1: $(cat "$T/err")"
}
E=moe.deepspeed_moe.experts.deepspeed_experts.1.weight
rm "$T/moe_ep1_s1/zero/$E/exp_avg.pt"
refused moe_ep1_s1 "$E"
rm "$T/pipe_pp2_s1/mp_rank_01_model_states.pt"
refused pipe_pp2_s1 "mp_rank_01_model_states.pt: missing"
