#!/bin/sh
# uv_model_copy.sh ZCKPT ZCK_DAMAGE FIXTURES: `zckpt to-universal --format ds` copies the
# model-states files byte for byte (as ds_to_universal's shutil.copy2); every byte it copies
# is checked on the way: one bit flipped in a 16-bit record (its zip CRC-32 no longer
# matches) is refused, and so is a flip with the CRC rewritten (a valid zip holding other
# values) when the tag folder has a manifest (its whole-file XXH3). Refused means exit 1,
# one line naming the damaged file, and no output folder, no latest_universal.
set -u
BIN=$1
DMG=$2
FX=$3/deepspeed
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# refused CKPT FILE: to-universal of CKPT fails naming FILE, leaving nothing behind
refused() {
  "$BIN" to-universal -q --inject-missing-state "$1" "$T/out/uc" >"$T/o" 2>"$T/e"
  rc=$?
  [ "$rc" = 1 ] || fail "$1: exit $rc, expected 1 ($(cat "$T/e"))"
  [ "$(wc -l <"$T/e")" = 1 ] || fail "$1: not one line on stderr: $(cat "$T/e")"
  grep -q "^zckpt: error: .*$2" "$T/e" || fail "$1: the error does not name $2: $(cat "$T/e")"
  [ -z "$(ls -A "$T/out" 2>/dev/null)" ] || fail "$1: output left behind: $(ls -A "$T/out")"
}

# copy NAME STAGE: a fresh copy of fixture NAME in $T/NAME, its model file in $M
copy() {
  rm -rf "$T/$1" "$T/out"
  cp -r "$FX/$1" "$T/$1"
  tag=$(cat "$T/$1/ckpt/latest")
  if [ "$2" = 3 ]; then M=$T/$1/ckpt/$tag/zero_pp_rank_1_mp_rank_00_model_states.pt
  else M=$T/$1/ckpt/$tag/mp_rank_00_model_states.pt; fi
}

for fx in s1w2_bf16:1 s2w2_bf16:2 s3w2_bf16:3; do
  name=${fx%:*} stage=${fx#*:}
  # intact: converts
  copy "$name" "$stage"
  "$BIN" to-universal -q --inject-missing-state "$T/$name/ckpt" "$T/out/uc" || fail "$name intact: exit $?"
  cmp "$M" "$T/out/uc/$(basename "$M")" || fail "$name: the model file is not copied byte for byte"
  # a 16-bit record with a wrong CRC
  copy "$name" "$stage"
  "$DMG" flip "$M" @lp >/dev/null
  case $? in
    0) refused "$T/$name/ckpt" "$(basename "$M")" ;;
    2) ;; # no 16-bit record in this file
    *) fail "$name: zck_damage failed" ;;
  esac
  # the same with its CRC rewritten: only the manifest can tell
  copy "$name" "$stage"
  "$BIN" verify -q --write-manifest "$T/$name/ckpt" >/dev/null 2>&1 || fail "$name: verify --write-manifest: exit $?"
  "$DMG" flip --recrc "$M" @lp >/dev/null
  case $? in
    0) refused "$T/$name/ckpt" "$(basename "$M")" ;;
    2) ;;
    *) fail "$name: zck_damage --recrc failed" ;;
  esac
done
echo ok
