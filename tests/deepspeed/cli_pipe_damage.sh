#!/bin/sh
# cli_pipe_damage.sh ZCKPT FIXTURES: a PipelineModule checkpoint (tests/fixtures/deepspeed-moe/pipe_pp2_s1, made by
# DeepSpeed 0.19.8) is read by consolidate, verify, inspect and to-universal (folder and HDF5, both read back);
# reshard writes it at dp 2 (verify clean, the same masters; DeepSpeed loading
# it: interop_pipeline_reshard) and refuses a ZeRO-2 target in one line; a layer file missing or two swapped: every
# job (reshard too) one line naming the file, non-zero exit, nothing at OUT. With a TiedLayerSpec weight
# (deepspeed-pipe/pipe_tied_pp2_s1): the weight once, read back from to-universal's folder and container, resharded at
# dp 2; its layer file missing named.
set -u
BIN=$1
SRC=$2/deepspeed-moe/pipe_pp2_s1/ckpt
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" consolidate -q "$SRC" "$T/ok.safetensors" 2>"$T/err" || fail "intact consolidate: $(cat "$T/err")"
"$BIN" verify "$SRC" >"$T/out" 2>&1 || fail "intact verify: $(cat "$T/out")"
grep -q "checked: 8 files" "$T/out" || fail "verify did not check the layer files: $(cat "$T/out")"
"$BIN" inspect "$SRC" >"$T/out" 2>&1 || fail "intact inspect: $(cat "$T/out")"
grep -q "^PipelineModule: 2 stages" "$T/out" && grep -q "^3.weight " "$T/out" || fail "inspect: $(cat "$T/out")"
"$BIN" to-universal -q --inject-missing-state "$SRC" "$T/uv" 2>"$T/err" || fail "intact to-universal: $(cat "$T/err")"
# its universal folder (module None, as ds_to_universal.py's) and the HDF5 container read back
"$BIN" consolidate -q "$T/uv" "$T/uv.safetensors" 2>"$T/err" || fail "universal folder: $(cat "$T/err")"
cmp -s "$T/ok.safetensors" "$T/uv.safetensors" || fail "the universal folder's consolidate differs from the checkpoint's"
"$BIN" to-universal -q --inject-missing-state --format hdf5 "$SRC" "$T/c.h5" 2>"$T/err" || fail "hdf5: $(cat "$T/err")"
"$BIN" consolidate -q "$T/c.h5" "$T/h5.safetensors" 2>"$T/err" || fail "hdf5 consolidate: $(cat "$T/err")"
cmp -s "$T/ok.safetensors" "$T/h5.safetensors" || fail "the container's consolidate differs from the checkpoint's"
"$BIN" reshard -q --to-stage 2 "$SRC" "$T/rs" 2>"$T/err" && fail "reshard wrote a pipeline checkpoint at ZeRO-2"
[ "$(wc -l <"$T/err")" = 1 ] && grep -q "PipelineModule" "$T/err" && [ ! -e "$T/rs" ] || fail "reshard: $(cat "$T/err")"
# at dp 2: the same layout (every stage's files for 2 dp ranks, the layer files), verify clean, the same masters
"$BIN" reshard -q --to-world-size 2 "$SRC" "$T/dp2" 2>"$T/err" || fail "reshard --to-world-size 2: $(cat "$T/err")"
[ -e "$T/dp2/global_step2/zero_pp_rank_1_mp_rank_01_optim_states.pt" ] &&
  [ -e "$T/dp2/global_step2/layer_03-model_states.pt" ] || fail "reshard at dp 2: $(ls "$T/dp2/global_step2")"
"$BIN" verify "$T/dp2" >"$T/out" 2>&1 && grep -q "checked: 10 files" "$T/out" || fail "verify dp 2: $(cat "$T/out")"
"$BIN" consolidate -q "$T/dp2" "$T/dp2.safetensors" 2>"$T/err" || fail "consolidate dp 2: $(cat "$T/err")"
cmp -s "$T/ok.safetensors" "$T/dp2.safetensors" || fail "consolidate at dp 2 differs from the source's"

# $1 case, $2 file the message must name, $3 jobs; every job: exit != 0, one line naming it, no OUT
refused() {
  for job in $3; do
    rm -rf "$T/out.x"
    case $job in
      verify) "$BIN" verify "$T/$1" >"$T/err" 2>&1 && fail "$1: verify passed"
              grep -q "^damaged: .*$2" "$T/err" || fail "$1: verify: $(cat "$T/err")"; continue ;;
      consolidate) "$BIN" consolidate -q "$T/$1" "$T/out.x" 2>"$T/err" ;;
      to-universal) "$BIN" to-universal -q --inject-missing-state "$T/$1" "$T/out.x" 2>"$T/err" ;;
      reshard) "$BIN" reshard -q --to-world-size 2 "$T/$1" "$T/out.x" 2>"$T/err" ;;
    esac && fail "$1: $job passed"
    [ "$(wc -l <"$T/err")" = 1 ] && grep -q "$2" "$T/err" || fail "$1: $job: $(cat "$T/err")"
    [ ! -e "$T/out.x" ] || fail "$1: $job left its output"
  done
}
G=global_step2
cp -r "$SRC" "$T/missing" && rm "$T/missing/$G/layer_02-model_states.pt"
refused missing "layer_02-model_states.pt: missing" "verify consolidate to-universal reshard"
cp -r "$SRC" "$T/swapped" && mv "$T/swapped/$G/layer_02-model_states.pt" "$T/x" &&
  mv "$T/swapped/$G/layer_03-model_states.pt" "$T/swapped/$G/layer_02-model_states.pt" &&
  mv "$T/x" "$T/swapped/$G/layer_03-model_states.pt"
refused swapped "layer_02-model_states.pt: holds 'layer_03-model_states'" "verify consolidate to-universal reshard"
# a bit flipped in a layer file's weight (record data/0 lies at bytes 832..1088): reshard copies that file as it is,
# so it checks the file's zip CRCs first; consolidate and to-universal read no layer weight (the masters are the values)
cp -r "$SRC" "$T/flipped" && L="$T/flipped/$G/layer_00-model_states.pt" &&
  b=$(od -An -tu1 -j900 -N1 "$L" | tr -d ' ') && printf "$(printf '\\%03o' $((b ^ 64)))" |
  dd of="$L" bs=1 seek=900 conv=notrunc 2>/dev/null
cmp -s "$SRC/$G/layer_00-model_states.pt" "$L" && fail "the flip did not happen"
refused flipped "layer_00-model_states.pt: entry \"layer_00-model_states/data/0\": CRC-32 mismatch" "reshard"
"$BIN" verify "$T/flipped" >"$T/err" 2>&1 && fail "flipped: verify passed"
grep -q "^damaged: .*layer_00-model_states.pt: zip record" "$T/err" || fail "flipped: verify: $(cat "$T/err")"
# a TiedLayerSpec weight (tests/fixtures/deepspeed-pipe/pipe_tied_pp2_s1: tied_modules.embed.weight, in both stages'
# flat groups, its layer file layer_00): read once; its layer file missing is named by every job
TIED=$2/deepspeed-pipe/pipe_tied_pp2_s1/ckpt
"$BIN" inspect "$TIED" >"$T/out" 2>&1 && grep -q "^tied_modules.embed.weight " "$T/out" || fail "tied inspect: $(cat "$T/out")"
"$BIN" consolidate -q "$TIED" "$T/tied.safetensors" 2>"$T/err" || fail "tied consolidate: $(cat "$T/err")"
for form in ds hdf5; do   # its universal folder and container read back; its reshard at dp 2 verifies clean
  "$BIN" to-universal -q --inject-missing-state --format $form "$TIED" "$T/tied.$form" 2>"$T/err" &&
    "$BIN" consolidate -q "$T/tied.$form" "$T/tied-$form.safetensors" 2>>"$T/err" &&
    cmp -s "$T/tied.safetensors" "$T/tied-$form.safetensors" || fail "tied to-universal $form read back: $(cat "$T/err")"
done
"$BIN" reshard -q --to-world-size 2 "$TIED" "$T/tied2" 2>"$T/err" && "$BIN" verify "$T/tied2" >"$T/out" 2>&1 &&
  "$BIN" consolidate -q "$T/tied2" "$T/tied2.safetensors" 2>"$T/err" && cmp -s "$T/tied.safetensors" "$T/tied2.safetensors" ||
  fail "tied reshard at dp 2: $(cat "$T/err" "$T/out")"
cp -r "$TIED" "$T/tied_missing" && rm "$T/tied_missing/$G/layer_00-model_states.pt"
refused tied_missing "'tied_modules.embed.weight' (TiedLayerSpec 'embed') is in no layer file here" \
  "consolidate to-universal reshard"
# a layer file of another save (same records, other values) is interop_pipeline.py's: it needs torch to make one
exit 0
