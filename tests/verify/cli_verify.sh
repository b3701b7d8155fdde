#!/bin/sh
# cli_verify.sh: `zckpt verify` exit codes and output: 0 clean, 3 damaged (naming the file
# and tensor), 1 could not check (malformed manifest, missing path), 2 usage; --json.
# Needs $ZCK_BIN (the zckpt binary) and $ZCK_FIXTURES; exits 77 when verify is not built in.
set -u
BIN=${ZCK_BIN:?ZCK_BIN not set}
FIX=${ZCK_FIXTURES:?ZCK_FIXTURES not set}
"$BIN" verify --help >/dev/null 2>&1 || { echo "SKIP: zckpt has no verify command"; exit 77; }
SRC="$FIX/deepspeed/s2w2_bf16/ckpt"
[ -d "$SRC" ] || { echo "SKIP: fixture $SRC missing"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-cli-verify-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# run EXPECTED_CODE ARGS...: output in $T/out, stderr in $T/err
run() {
  want=$1; shift
  "$BIN" verify -q "$@" >"$T/out" 2>"$T/err"
  got=$?
  [ "$got" -eq "$want" ] || { cat "$T/out" "$T/err"; fail "zckpt verify $*: exit $got, expected $want"; }
}

cp -r "$SRC" "$T/ck"
run 0 "$T/ck"
grep -q "^result: clean" "$T/out" || fail "no clean result line"
run 0 --json "$T/ck"
grep -q '"result":[[:space:]]*"clean"' "$T/out" || fail "JSON lacks the result"
run 0 "$FIX/torch/views.pt"
run 0 "$FIX/safetensors/gpt2_sharded"

# usage errors
run 2
run 2 --bogus "$T/ck"
run 2 "$T/ck" "$T/ck"
"$BIN" verify --help | grep -q "exit status" || fail "--help lacks the exit status"

# a path that does not exist: could not check
run 1 "$T/nothing"

# record a manifest, then damage one byte of tensor data
run 0 --write-manifest "$T/ck"
[ -f "$T/ck/global_step2/zckpt-manifest.json" ] || fail "--write-manifest wrote nothing"
run 0 "$T/ck"
grep -q "tensors against the manifest" "$T/out" || fail "no summary line"
F="$T/ck/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
# byte 5156 lies inside the data of record data/2 (exp_avg_sq of group 0) in this fixture
printf '\377' | dd of="$F" bs=1 seek=5156 conv=notrunc 2>/dev/null
run 3 "$T/ck"
grep -q "^damaged: .*bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: tensor optimizer_state_dict.base_optimizer_state.state.0.exp_avg_sq: bytes 5056..6888 damaged" "$T/out" \
  || { cat "$T/out"; fail "damaged tensor not named"; }
run 3 --json "$T/ck"
grep -q '"check":[[:space:]]*"tensor-xxh3"' "$T/out" || fail "JSON lacks the tensor finding"

# truncated: damaged, saying so
truncate -s 6000 "$F"
run 3 "$T/ck"
grep -q "truncated" "$T/out" || fail "truncation not reported"

# deleted rank file: damaged, naming it
rm "$F"
run 3 "$T/ck"
grep -q "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: missing" "$T/out" || fail "missing rank file not named"

# corrupt manifest: could not check, one clear line
printf '{"format": "zckpt-manifest", "files": [' >"$T/ck/global_step2/zckpt-manifest.json"
run 1 "$T/ck"
grep -q "malformed manifest" "$T/out" || fail "malformed manifest not reported"

# an interrupted zckpt save: damaged unless --force
cp -r "$SRC" "$T/partial"
: >"$T/partial/global_step2/.zckpt-partial"
run 3 "$T/partial"
grep -q "incomplete checkpoint" "$T/out" || fail "incomplete save not reported"
run 0 --force "$T/partial"

# a universal checkpoint (when this zckpt has to-universal)
if "$BIN" to-universal --help >/dev/null 2>&1 && [ -d "$FIX/deepspeed/s3w2_bf16/ckpt" ]; then
  mkdir "$T/uv"
  # setup only: leaks of to-universal are its own tests' business
  ASAN_OPTIONS=detect_leaks=0 "$BIN" to-universal -q "$FIX/deepspeed/s3w2_bf16/ckpt" "$T/uv/out" >/dev/null 2>&1 ||
    fail "to-universal failed"
  run 0 "$T/uv"
  grep -q "^$T/uv: universal" "$T/out" || fail "universal checkpoint not recognised"
  run 0 --write-manifest "$T/uv/out"
  run 0 "$T/uv"
  U="$T/uv/out/zero/fc1.weight/fp32.pt"
  size=$(wc -c <"$U")
  # the tensor data sits before the pickle's end records: damage a byte in the middle of the file
  printf '\377' | dd of="$U" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
  run 3 "$T/uv"
  grep -q "^damaged: .*zero/fc1.weight/fp32.pt" "$T/out" || fail "damaged universal file not named"
  rm "$T/uv/out/zero/fc1.bias/exp_avg.pt"
  run 3 "$T/uv"
  grep -q "zero/fc1.bias/exp_avg.pt: missing" "$T/out" || fail "missing universal file not named"
fi

# a rank file copied over another rank's: one damaged: line per damaged file, naming it
# (the reader's identity check and the copy check both see it; it used to be two lines)
damaged_lines() { # N FILE...: exactly N damaged: lines, one naming each FILE
  n=$1; shift
  [ "$(grep -c '^damaged: ' "$T/out")" -eq "$n" ] || { cat "$T/out"; fail "expected $n damaged: lines"; }
  for f in "$@"; do
    [ "$(grep -c "^damaged: [^ ]*/$f: " "$T/out")" -eq 1 ] || { cat "$T/out"; fail "$f not named by exactly one damaged: line"; }
  done
}
O1=bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt
cp -r "$SRC" "$T/copy"
cp "$T/copy/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt" "$T/copy/global_step2/$O1"
run 3 "$T/copy"
damaged_lines 1 "$O1"
grep -q "^damaged: .*/$O1: holds rank 0's optimizer state" "$T/out" || { cat "$T/out"; fail "copied rank file: not the reader's line"; }
grep -q "^result: DAMAGED (1 problem)" "$T/out" || { cat "$T/out"; fail "copied rank file: not one problem"; }
run 3 --json "$T/copy"
[ "$(grep -c '"severity":[[:space:]]*"damaged"' "$T/out")" -eq 1 ] || { cat "$T/out"; fail "JSON: not one damage finding"; }
grep -q "\"file\":[[:space:]]*\"$T/copy/global_step2/$O1\"" "$T/out" || { cat "$T/out"; fail "JSON: the finding names no file"; }
# two rank files swapped: each named once
O0=bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt
cp "$SRC/global_step2/$O0" "$T/copy/global_step2/$O1"
cp "$SRC/global_step2/$O1" "$T/copy/global_step2/$O0"
run 3 "$T/copy"
damaged_lines 2 "$O0" "$O1"
if [ -d "$FIX/deepspeed/s3w2_bf16/ckpt" ]; then
  # ZeRO-3: the optimizer states and the model states of rank 1 both copies: one line each
  cp -r "$FIX/deepspeed/s3w2_bf16/ckpt" "$T/copy3"
  M1=zero_pp_rank_1_mp_rank_00_model_states.pt
  cp "$T/copy3/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt" "$T/copy3/global_step2/$O1"
  cp "$T/copy3/global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt" "$T/copy3/global_step2/$M1"
  run 3 "$T/copy3"
  damaged_lines 2 "$O1" "$M1"
  # with a manifest: the findings against it (each tensor that differs) stay as they were
  rm "$T/copy3/global_step2/$M1"
  cp "$FIX/deepspeed/s3w2_bf16/ckpt/global_step2/$M1" "$FIX/deepspeed/s3w2_bf16/ckpt/global_step2/$O1" "$T/copy3/global_step2/"
  run 0 --write-manifest "$T/copy3"
  cp "$T/copy3/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt" "$T/copy3/global_step2/$O1"
  run 3 "$T/copy3"
  grep -q "^damaged: .*/$O1: holds rank 0's optimizer state" "$T/out" || { cat "$T/out"; fail "manifest: no identity line"; }
  grep -q "^damaged: .*/$O1: tensor .*: bytes .* damaged: xxh3" "$T/out" || { cat "$T/out"; fail "manifest: no tensor line"; }
  grep -q "a copy of another rank's file" "$T/out" && { cat "$T/out"; fail "manifest: the copy said twice"; }
fi

# an injected read error: could not check (1), never "damaged"
ZCK_FAULT=read:1:EIO run 1 --threads 1 "$SRC"
grep -q "Input/output error" "$T/out" || fail "the read error is not reported"
echo ok
