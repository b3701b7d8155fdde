#!/bin/sh
# cli_dcp_damage.sh ZCKPT FIXTURES: `zckpt consolidate`, `verify`, `inspect`, `reshard` (to
# DeepSpeed) and `to-universal` on a real torch Distributed Checkpoint (tests/fixtures/dcp)
# pass the intact folder, and refuse each damaged copy in one line naming the file, with a
# non-zero exit and nothing at OUT (nor a hidden folder beside it): a bit
# flipped inside a chunk's data (the zip CRC-32 the executor checks as it streams; inspect
# reads no tensor byte and passes it), a truncated .distcp, a missing .distcp, a .distcp of
# another save of another layout, a .metadata pickle that calls os.system.
set -u
BIN=$1
SRC=$2/dcp/llama_tied_w2_fp32
OTHER=$2/dcp/llama_untied_w3_fp32
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" consolidate -q "$SRC" "$T/ref" 2>"$T/err" || fail "intact consolidate: $(cat "$T/err")"
"$BIN" verify -q "$SRC" >"$T/out" 2>&1 || fail "intact verify: $(cat "$T/out")"
"$BIN" inspect "$SRC" >"$T/out" 2>&1 || fail "intact inspect: $(cat "$T/out")"
grep -q "model.embed_tokens.weight" "$T/out" || fail "inspect lists no weights: $(cat "$T/out")"
# the tied lm_head.weight (DCP saves it under both names, its optimizer state once) is
# named as the copy it is, not as a frozen param
grep -q "^lm_head.weight .*tied: a copy of model.embed_tokens.weight" "$T/out" || fail "tie not shown: $(cat "$T/out")"
"$BIN" inspect "$OTHER" >"$T/out" 2>&1 || fail "intact inspect (untied): $(cat "$T/out")"
! grep -q "tied: a copy" "$T/out" || fail "an untied model shown tied: $(cat "$T/out")"
"$BIN" reshard -q "$SRC" "$T/ds" --to-stage 2 --to-world-size 3 2>"$T/err" || fail "intact reshard: $(cat "$T/err")"
"$BIN" to-universal -q "$SRC" "$T/uv/universal" 2>"$T/err" || fail "intact to-universal: $(cat "$T/err")"

# $1 case, $2 file the message must name; every job: exit != 0, one line naming it, no OUT
refused() {
  for job in consolidate verify inspect reshard to-universal; do
    [ "$job" = inspect ] && [ "$1" = bitflip ] && continue
    out="$T/out-$1-$job"
    case $job in
      consolidate) "$BIN" consolidate -q "$T/$1" "$out" >"$T/so" 2>"$T/se"; rc=$? ;;
      verify) "$BIN" verify -q "$T/$1" >"$T/so" 2>"$T/se"; rc=$?; cat "$T/so" >>"$T/se" ;;
      inspect) "$BIN" inspect "$T/$1" >"$T/so" 2>"$T/se"; rc=$? ;;
      reshard) "$BIN" reshard -q "$T/$1" "$out" --to-stage 2 --to-world-size 3 >"$T/so" 2>"$T/se"; rc=$? ;;
      to-universal) "$BIN" to-universal -q "$T/$1" "$out" >"$T/so" 2>"$T/se"; rc=$? ;;
    esac
    [ $rc -ne 0 ] || fail "$1: $job exited 0"
    if [ "$job" = verify ]; then
      grep -q "damaged: .*$2" "$T/se" || grep -q "error: .*$2" "$T/se" || fail "$1: verify did not name $2: $(cat "$T/se")"
    else
      [ "$(grep -c . "$T/se")" -eq 1 ] || fail "$1: $job said more than one line: $(cat "$T/se")"
      grep -q "^zckpt: error: .*$2" "$T/se" || fail "$1: $job did not name $2: $(cat "$T/se")"
    fi
    [ ! -e "$out" ] || fail "$1: $job left $out"
    ! ls -A "$T" | grep -q "^\.out-" || fail "$1: $job left $(ls -A "$T" | grep "^\.out-")"
  done
}

copy() { cp -r "$SRC" "$T/$1"; }

# a bit flipped in the embedding's first chunk: its first 4 float32 values, found in the file
copy bitflip
pat=$(od -An -v -tx1 -N 16 "$T/ref/model.safetensors" -j $((8 + $(od -An -tu8 -N8 "$T/ref/model.safetensors" | tr -d ' ') + \
  $(dd if="$T/ref/model.safetensors" bs=1 skip=8 count=$(od -An -tu8 -N8 "$T/ref/model.safetensors" | tr -d ' ') 2>/dev/null |
    grep -o '"model.embed_tokens.weight":{[^}]*}' | grep -o 'data_offsets":\[[0-9]*' | grep -o '[0-9]*$'))) | tr -d ' \n')
at=$(od -An -v -tx1 "$T/bitflip/__0_0.distcp" | tr -d ' \n' | awk -v p="$pat" '{ i = index($0, p); print (i > 0 && (i - 1) % 2 == 0) ? (i - 1) / 2 : -1 }')
[ "$at" -ge 0 ] || fail "the embedding's first values not found in __0_0.distcp"
b=$(od -An -tu1 -j $((at + 5)) -N1 "$T/bitflip/__0_0.distcp" | tr -d ' ')
printf "$(printf '\\%03o' $((b ^ 16)))" | dd of="$T/bitflip/__0_0.distcp" bs=1 seek=$((at + 5)) conv=notrunc 2>/dev/null
refused bitflip __0_0.distcp
grep -q "CRC-32" "$T/se" || true

copy truncated
truncate -s -100 "$T/truncated/__1_0.distcp"
refused truncated __1_0.distcp

copy missing
rm "$T/missing/__1_0.distcp"
refused missing __1_0.distcp

copy other
cp "$OTHER/__1_0.distcp" "$T/other/__1_0.distcp"
refused other __1_0.distcp

# a protocol-2 pickle: os.system("touch PWNED") -- refused before anything runs
copy hostile
printf 'cos\nsystem\n(S"touch %s/PWNED"\ntR.' "$T" >"$T/hostile/.metadata"
refused hostile .metadata
[ ! -e "$T/PWNED" ] || fail "hostile: the pickle ran"
echo ok
