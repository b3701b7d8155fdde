#!/bin/sh
# cli_dcp_torch_safetensors.sh ZCKPT FIXTURES: `zckpt consolidate SHARDED OUT --format
# torch-safetensors` of the safetensors-storage DCP tests/fixtures/dcp/st_tp2_dp2_fp32/sharded
# writes the files torch's own consolidation wrote beside it at save time
# (HuggingFaceStorageWriter.finish: model-00001-of-00001.safetensors and its index), byte for
# byte, plus zckpt's manifest; the options that shape save_pretrained's output are usage errors
# (exit 2), --fqn-to-index goes with the format only; a .metadata DCP and malformed mappings are
# refused (exit 1, one line), nothing at OUT. (interop_dcp_safetensors holds the live torch variants.)
set -u
BIN=$1
ST=$2/dcp/st_tp2_dp2_fp32
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" consolidate -q --format torch-safetensors "$ST/sharded" "$T/out" 2>"$T/err" || fail "consolidate: $(cat "$T/err")"
for f in model-00001-of-00001.safetensors model.safetensors.index.json; do
  cmp -s "$ST/$f" "$T/out/$f" || fail "$f differs from torch's"
done
[ "$(ls "$T/out" | tr '\n' ' ')" = "model-00001-of-00001.safetensors model.safetensors.index.json zckpt-manifest.json " ] ||
  fail "OUT holds $(ls "$T/out" | tr '\n' ' ')"
"$BIN" verify -q "$T/out" 2>"$T/err" || fail "verify of OUT: $(cat "$T/err")"

for opt in "--dtype bf16" "--keep-tied" "--exclude-frozen" "--max-shard-size 1GB"; do
  # shellcheck disable=SC2086
  "$BIN" consolidate "$ST/sharded" "$T/o2" --format torch-safetensors $opt 2>"$T/err"
  rc=$?
  [ $rc -eq 2 ] || fail "$opt: exit $rc, expected 2"
  grep -q "does not apply" "$T/err" || fail "$opt: $(cat "$T/err")"
  [ ! -e "$T/o2" ] || fail "$opt: wrote OUT"
done
"$BIN" consolidate "$ST/sharded" "$T/o2" --fqn-to-index "$ST/model.safetensors.index.json" 2>"$T/err"
[ $? -eq 2 ] || fail "--fqn-to-index without the format: not a usage error"

# $1 what, $2 what the one line says, the rest: consolidate's arguments
refused() {
  what=$1 needle=$2
  shift 2
  "$BIN" consolidate -q --format torch-safetensors "$@" "$T/o2" 2>"$T/err"
  rc=$?
  [ $rc -eq 1 ] || fail "$what: exit $rc, expected 1"
  [ "$(grep -c . "$T/err")" -eq 1 ] && grep -q "$needle" "$T/err" || fail "$what: $(cat "$T/err")"
  [ ! -e "$T/o2" ] || fail "$what: wrote OUT"
}
refused ".metadata DCP" "safetensors storage" "$2/dcp/llama_tied_w2_fp32"
printf '[1, 2]' >"$T/list.json"
refused "a mapping that is a list" "not a JSON object" --fqn-to-index "$T/list.json" "$ST/sharded"
printf '{"weight_map": {"lm_head.weight": "weights.safetensors"}}' >"$T/names.json"
refused "an index naming no file number" "lm_head.weight" --fqn-to-index "$T/names.json" "$ST/sharded"
printf '{"lm_head.weight": 0}' >"$T/zero.json"
refused "file index 0" "whole number >= 1" --fqn-to-index "$T/zero.json" "$ST/sharded"
printf '{"lm_head.weight": 1, "lm_head.weight": 1}' >"$T/twice.json"
refused "a name twice" "twice" --fqn-to-index "$T/twice.json" "$ST/sharded"
echo "consolidate --format torch-safetensors = torch's files byte for byte"
