#!/bin/sh
# cli_side_damage.sh ZCKPT FIXTURES: the other files of a save root (an HF checkpoint-N/) that reshard carries over
# are checked as they are copied (jobs/side_copy.c). Intact, each is the source's byte for byte (trainer_state.json
# with Python's NaN, the real torch.save files of tests/fixtures/torch as scheduler.pt and rng_state_<r>.pth, a real
# safetensors file). One byte changed in the real file, checked with cmp: a torch.save record (its CRC-32), a torch
# file's first bytes, a safetensors header (a shape no longer matching the bytes), JSON that no longer parses: each
# one line naming the file, exit != 0, nothing at OUT. Files of no format of their own (zero_to_fp32.py) and a
# safetensors file's tensor bytes carry no check: they come over as they are (docs/guarantees.md says so).
# consolidate's HF folder takes config.json along, checked as well.
set -u
BIN=$1
FX=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# $1 file, $2 offset, $3 the bits to flip in that byte
flip() {
  b=$(od -An -tu1 -j"$2" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\%03o' $((b ^ $3)))" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}
HF=$T/hf
cp -r "$FX/deepspeed/s2w2_bf16/ckpt" "$HF"   # holds zero_to_fp32.py and zero_to_torch.py
cp "$FX/torch/module_state_dict.pt" "$HF/scheduler.pt"
cp "$FX/torch/nested.pt" "$HF/rng_state_0.pth"
cp "$FX/torch/nested.pt" "$HF/rng_state_1.pth"
cp "$FX/safetensors/dtypes.safetensors" "$HF/model.safetensors"
printf '{\n  "global_step": 2,\n  "log_history": [{"grad_norm": NaN, "loss": 1.5e-3, "x": -Infinity}],\n  "s": "caf\303\251 \\u00e9"\n}\n' \
  >"$HF/trainer_state.json"
printf '{\n  "architectures": ["GPT2LMHeadModel"],\n  "n_embd": 32\n}\n' >"$HF/config.json"

"$BIN" reshard -q --to-world-size 1 "$HF" "$T/ok" 2>"$T/err" || fail "intact: $(cat "$T/err")"
for f in scheduler.pt rng_state_0.pth model.safetensors trainer_state.json config.json zero_to_fp32.py zero_to_torch.py; do
  cmp -s "$HF/$f" "$T/ok/$f" || fail "$f not carried byte for byte"
done
[ ! -e "$T/ok/rng_state_1.pth" ] || fail "rng_state_1.pth carried to 1 rank"

# $1 file, $2 offset, $3 bits, $4 what the one line must say after the file's name
damaged() {
  rm -rf "$T/d" "$T/out"
  cp -r "$HF" "$T/d"
  flip "$T/d/$1" "$2" "$3"
  cmp -s "$HF/$1" "$T/d/$1" && fail "$1: the flip did not happen"
  "$BIN" reshard -q --to-world-size 2 "$T/d" "$T/out" 2>"$T/err" && fail "$1 byte $2: reshard passed"
  [ -n "${SHOW:-}" ] && cat "$T/err"
  [ "$(wc -l <"$T/err")" = 1 ] && grep -q "/d/$1: $4" "$T/err" || fail "$1 byte $2: $(cat "$T/err")"
  [ ! -e "$T/out" ] || fail "$1 byte $2: left its output"
}
# record data/1 lies at bytes 1856..1916 of module_state_dict.pt, data/0 at 2112..2136 of nested.pt
damaged scheduler.pt 1880 64 'entry "module_state_dict/data/1": CRC-32 mismatch'
damaged rng_state_1.pth 2120 1 'entry "nested/data/0": CRC-32 mismatch'
damaged rng_state_0.pth 100 4 'entry "nested/data.pkl": CRC-32 mismatch'
# its first byte: no longer a zip's start, still a torch file by its name and its zip end record
damaged rng_state_0.pth 0 64 'not a zip archive'
# i.i64's shape [4] (byte 134) becomes [5]: 40 bytes that the header gives 32
damaged model.safetensors 134 1 'tensor i.i64: data_offsets'
damaged trainer_state.json 0 64 'not JSON'
damaged trainer_state.json 20 64 'not JSON'
damaged config.json 2 64 'not JSON'
# consolidate into an HF folder takes config.json along: checked as well
"$BIN" consolidate -q "$HF" "$T/hfout/" 2>"$T/err" || fail "consolidate intact: $(cat "$T/err")"
cmp -s "$HF/config.json" "$T/hfout/config.json" || fail "consolidate: config.json not taken along byte for byte"
"$BIN" consolidate -q "$T/d" "$T/out/" 2>"$T/err" && fail "consolidate took a damaged config.json along"
[ "$(wc -l <"$T/err")" = 1 ] && grep -q "/d/config.json: not JSON" "$T/err" || fail "consolidate: $(cat "$T/err")"
[ ! -e "$T/out" ] || fail "consolidate left its output"
exit 0
