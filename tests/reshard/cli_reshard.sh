#!/bin/sh
# cli_reshard.sh ZCKPT FIXTURES: the `zckpt reshard` command line with universal sources and
# impossible requests: help on stdout; usage errors (exit 2, one line pointing to --help):
# world size 0, sub-group sizes that are not positive integers; runtime refusals (exit 1,
# one "zckpt: error: FILE: what" line) before anything is written: nothing at OUT, nothing
# beside it; and a reshard from a universal folder (exit 0) that `inspect` reads.
set -u
BIN=$1
FX=$2/deepspeed
[ -d "$FX/s3w2_bf16/ckpt" ] || { echo "SKIP: no DeepSpeed fixtures"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect RC NEEDLE ARGS...: exit code RC, NEEDLE on the one stderr line, nothing at $T/out*
expect() {
  rc=$1; needle=$2; shift 2
  "$BIN" "$@" >"$T/stdout" 2>"$T/err"
  got=$?
  [ "$got" = "$rc" ] || fail "$*: exit $got, expected $rc; stderr: $(cat "$T/err")"
  grep -qF -- "$needle" "$T/err" || fail "$*: stderr lacks '$needle': $(cat "$T/err")"
  [ "$(wc -l <"$T/err")" = 1 ] || fail "$*: not one line on stderr: $(cat "$T/err")"
  if [ "$rc" = 1 ]; then grep -q "^zckpt: error: " "$T/err" || fail "$*: not a 'zckpt: error:' line"; fi
  for f in "$T"/out* "$T"/.out*; do [ -e "$f" ] && fail "$*: left $f behind"; done
  return 0
}

"$BIN" reshard --help >"$T/stdout" 2>"$T/err" || fail "--help exit $?"
grep -q "universal folder" "$T/stdout" || fail "--help does not mention universal folders"
[ -s "$T/err" ] && fail "--help wrote to stderr"

S3=$FX/s3w2_bf16/ckpt
expect 2 "--to-world-size must be a positive integer" reshard --to-world-size 0 "$S3" "$T/out"
expect 2 "--to-world-size must be a positive integer" reshard --to-world-size -2 "$S3" "$T/out"
for bad in 0 -5 1.5 abc 2GiB ''; do
  expect 2 "--sub-group-size must be a positive integer" reshard --to-stage 3 --sub-group-size "$bad" "$S3" "$T/out"
done
expect 2 "--to-stage must be 1, 2 or 3" reshard --to-stage 0 "$S3" "$T/out"
expect 1 "--sub-group-size 100: only a ZeRO-3 target has sub-groups (the target is ZeRO-2)" \
  reshard -q --to-stage 2 --sub-group-size 100 "$S3" "$T/out"
expect 1 "--sub-group-size 1000000000000000000: at most 1e18" reshard -q --to-stage 3 --sub-group-size 1e18 "$S3" "$T/out"

# universal folders
"$BIN" to-universal -q "$S3" "$T/u3/uc" || fail "to-universal"
"$BIN" reshard -q --to-stage 1 --to-world-size 3 "$T/u3" "$T/ok" || fail "reshard from a universal folder"
"$BIN" inspect "$T/ok" >"$T/stdout" 2>&1 || fail "inspect of the result"
grep -q "ZeRO-1 checkpoint, tag global_step2, world size 3" "$T/stdout" || fail "inspect: $(head -3 "$T/stdout")"
rm -rf "$T/ok"
expect 1 "--tag: " reshard -q --tag global_step2 --to-world-size 2 "$T/u3" "$T/out"
cp -r "$T/u3" "$T/u3b"
rm "$T/u3b/uc/zero/fc1.bias/exp_avg.pt" "$T/u3b/uc/zero/fc1.bias/exp_avg_sq.pt"
expect 1 "u3b/uc/zero/fc1.bias/exp_avg.pt: missing" reshard -q --to-world-size 2 "$T/u3b" "$T/out"
rm "$T"/u3b/uc/zero/*/exp_avg.pt "$T"/u3b/uc/zero/*/exp_avg_sq.pt
expect 1 "no optimizer state (exp_avg / exp_avg_sq): saved before the first optimizer step" \
  reshard -q --to-world-size 2 "$T/u3b/uc" "$T/out"
cp -r "$T/u3" "$T/u3c"
rm "$T/u3c/uc/zero/ln.weight/fp32.pt"
expect 1 "ln.weight/fp32.pt: missing for trainable param ln.weight" reshard -q --to-world-size 2 "$T/u3c" "$T/out"
echo "cli_reshard: ok"
