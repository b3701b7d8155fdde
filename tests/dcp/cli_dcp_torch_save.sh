#!/bin/sh
# cli_dcp_torch_save.sh ZCKPT FIXTURES: `zckpt consolidate DCP OUT --format torch-save` writes
# the file torch's dcp_to_torch_save writes, byte for byte (the SHA-256s torch gave,
# tests/fixtures/dcp/torch_save.sha256), for a plain FSDP2 folder, FSDP2 + tensor parallel
# blocks and an HF Trainer output_dir (its newest checkpoint-N, the model folder); refuses
# the options that shape a model-only output (usage, exit 2), a DeepSpeed checkpoint and a
# bit flipped in a chunk (exit 1, one line naming the file), leaving nothing at OUT.
set -u
BIN=$1
DCP=$2/dcp
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
want() { grep "  $1\$" "$DCP/torch_save.sha256" | cut -d' ' -f1; }

# $1 input, $2 the torch_save.sha256 case
same() {
  rm -f "$T/full.pt"
  "$BIN" consolidate -q "$1" "$T/full.pt" --format torch-save 2>"$T/err" || fail "$2: $(cat "$T/err")"
  got=$(sha256sum "$T/full.pt" | cut -d' ' -f1)
  [ "$got" = "$(want "$2")" ] || fail "$2: sha256 $got, torch's file is $(want "$2")"
}
same "$DCP/llama_tied_w2_fp32" llama_tied_w2_fp32
same "$DCP/llama_tp2_dp2_fp32" llama_tp2_dp2_fp32
same "$DCP/hf_trainer_tied_w2_fp32" hf_trainer_tied_w2_fp32/checkpoint-2/pytorch_model_fsdp_0

rm -f "$T/full.pt"
for opt in "--dtype bf16" "--keep-tied" "--exclude-frozen" "--max-shard-size 1GB"; do
  # shellcheck disable=SC2086
  "$BIN" consolidate "$DCP/llama_tied_w2_fp32" "$T/full.pt" --format torch-save $opt 2>"$T/err"
  rc=$?
  [ $rc -eq 2 ] || fail "$opt: exit $rc, expected 2"
  grep -q "does not apply" "$T/err" || fail "$opt: $(cat "$T/err")"
  [ ! -e "$T/full.pt" ] || fail "$opt: wrote OUT"
done

# $1 input, $2 what the one line names
refused() {
  "$BIN" consolidate -q "$1" "$T/full.pt" --format torch-save 2>"$T/err"
  rc=$?
  [ $rc -eq 1 ] || fail "$1: exit $rc, expected 1"
  [ "$(grep -c . "$T/err")" -eq 1 ] || fail "$1: not one line: $(cat "$T/err")"
  grep -q "$2" "$T/err" || fail "$1: does not name $2: $(cat "$T/err")"
  [ -z "$(ls -A "$T" | grep -v '^err$' | grep -v '^damaged$')" ] || fail "$1: left $(ls -A "$T")"
}
refused "$2/deepspeed" "not a torch Distributed Checkpoint"
mkdir "$T/damaged"
cp "$DCP"/llama_tied_w2_fp32/.metadata "$DCP"/llama_tied_w2_fp32/__*.distcp "$T/damaged/"
# a byte inside the first item's data: the embedding's first chunk (512 bytes), whose zip
# record data/0 starts at most 64 bytes after its name
at=$(grep -obUa 'data/0' "$T/damaged/__1_0.distcp" | head -1 | cut -d: -f1)
printf '\377' | dd of="$T/damaged/__1_0.distcp" bs=1 seek=$((at + 200)) conv=notrunc 2>/dev/null
refused "$T/damaged" "__1_0.distcp"
echo ok
