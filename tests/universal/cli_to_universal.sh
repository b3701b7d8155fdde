#!/bin/sh
# cli_to_universal.sh ZCKPT FIXTURES: the `zckpt to-universal` command line: help on stdout
# (exit 0), usage errors (exit 2, one line pointing to --help), runtime errors (exit 1,
# "zckpt: error: ..."), and both layouts written.
set -u
BIN=$1
FX=$2/deepspeed
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect RC NEEDLE ARGS...: exit code RC and NEEDLE in stderr
expect() {
  rc=$1; needle=$2; shift 2
  "$BIN" "$@" >"$T/out" 2>"$T/err"
  got=$?
  [ "$got" = "$rc" ] || fail "$*: exit $got, expected $rc; stderr: $(cat "$T/err")"
  grep -qF -- "$needle" "$T/err" || fail "$*: stderr lacks '$needle': $(cat "$T/err")"
  [ "$(wc -l <"$T/err")" -le 1 ] || fail "$*: more than one line on stderr"
}

"$BIN" to-universal --help >"$T/out" 2>"$T/err" || fail "--help exit $?"
grep -q "^usage: zckpt to-universal" "$T/out" || fail "--help: no usage on stdout"
[ -s "$T/err" ] && fail "--help wrote to stderr"

U="(see 'zckpt to-universal --help')"
expect 2 "expected CHECKPOINT and OUT" to-universal
expect 2 "--format must be ds or hdf5, not 'zip'" to-universal --format zip a b
expect 2 "--level must be 1..22" to-universal --level 0 a b
expect 2 "--chunk-size" to-universal --chunk-size 2GiB a b
expect 2 "unknown option '--bogus'" to-universal --bogus a b
expect 1 "zckpt: error:" to-universal "$T/missing" "$T/x"
expect 1 "no universal_checkpoint_info in the model states; pass --inject-missing-state" to-universal -q "$FX/s2w2_bf16/ckpt" "$T/p/uc"
[ -e "$T/p/uc" ] && fail "output left after an error"

"$BIN" to-universal -q --inject-missing-state "$FX/s2w2_bf16/ckpt" "$T/p/uc/" || fail "ds layout: exit $?"
[ "$(cat "$T/p/latest_universal")" = "uc" ] || fail "latest_universal is not 'uc' (trailing slash)"
[ -f "$T/p/uc/zero/fc1.weight/exp_avg.pt" ] || fail "zero/fc1.weight/exp_avg.pt missing"
[ -f "$T/p/uc/zero/optimizer_state.pt" ] || fail "zero/optimizer_state.pt missing"
expect 1 "exists" to-universal -q --inject-missing-state "$FX/s2w2_bf16/ckpt" "$T/p/uc"
"$BIN" to-universal -q --inject-missing-state --overwrite "$FX/s2w2_bf16/ckpt" "$T/p/uc" || fail "--overwrite"

# the folder's zckpt-manifest.json, its tensor files hashed as they were written: the same
# bytes as a manifest made by reading the folder back, and verify checks the folder with it
[ -f "$T/p/uc/zckpt-manifest.json" ] || fail "no zckpt-manifest.json in the universal folder"
"$BIN" verify -q "$T/p/uc" >"$T/out" 2>"$T/err" || fail "verify of the universal folder: exit $?: $(cat "$T/err")"
cp -r "$T/p/uc" "$T/uc2" && rm "$T/uc2/zckpt-manifest.json"
"$BIN" verify -q --write-manifest "$T/uc2" >"$T/out" 2>"$T/err" || fail "verify --write-manifest: exit $?: $(cat "$T/err")"
cmp "$T/p/uc/zckpt-manifest.json" "$T/uc2/zckpt-manifest.json" || fail "the manifest differs from one made by reading the folder"
for fx in s1w2_bf16 s3w2_bf16 s3w4_fp32_3groups; do # the other stages and layouts
  "$BIN" to-universal -q --inject-missing-state "$FX/$fx/ckpt" "$T/m/$fx" || fail "$fx: exit $?"
  cp "$T/m/$fx/zckpt-manifest.json" "$T/m/$fx.json" && rm "$T/m/$fx/zckpt-manifest.json"
  "$BIN" verify -q --write-manifest "$T/m/$fx" >"$T/out" 2>"$T/err" || fail "$fx: verify --write-manifest: $(cat "$T/err")"
  cmp "$T/m/$fx.json" "$T/m/$fx/zckpt-manifest.json" || fail "$fx: the manifest differs from one made by reading the folder"
done
F=$T/uc2/zero/fc1.weight/fp32.pt
N=$(( $(wc -c <"$F") / 2 ))
B=$(od -An -tu1 -j "$N" -N1 "$F" | tr -d ' ')
printf "\\$(printf %o $(( B ^ 1 )))" | dd of="$F" bs=1 seek="$N" conv=notrunc 2>/dev/null
"$BIN" verify -q "$T/uc2" >"$T/out" 2>"$T/err"
[ $? = 3 ] || fail "verify of a damaged universal folder: not exit 3"
grep -q "fc1.weight/fp32.pt" "$T/out" "$T/err" || fail "verify does not name the damaged file: $(cat "$T/out" "$T/err")"

"$BIN" to-universal -q --format hdf5 --level 7 --chunk-size 4KiB --threads 2 "$FX/s3w2_bf16/ckpt" "$T/u.h5" || fail "hdf5: exit $?"
[ -s "$T/u.h5" ] || fail "u.h5 missing"
expect 1 "exists" to-universal -q --format hdf5 "$FX/s3w2_bf16/ckpt" "$T/u.h5"
echo ok
