#!/bin/sh
# cli_verify_extra.sh: files added to a folder that carries a zckpt-manifest.json (a copy of
# a rank file in a resharded tag folder, a whole param folder in a universal folder) are
# one warning each, naming the file, not read, the result still clean (exit 0); what the
# manifest leaves out on purpose (itself, the partial marker, temporaries, symlinks) and a
# folder without a manifest say nothing new. consolidate and reshard keep ignoring an
# extra universal param folder, as DeepSpeed does.
# Needs $ZCK_BIN (the zckpt binary) and $ZCK_FIXTURES; exits 77 when verify is not built in.
set -u
BIN=${ZCK_BIN:?ZCK_BIN not set}
FIX=${ZCK_FIXTURES:?ZCK_FIXTURES not set}
"$BIN" verify --help >/dev/null 2>&1 || { echo "SKIP: zckpt has no verify command"; exit 77; }
SRC="$FIX/deepspeed/s3w2_bf16/ckpt"
[ -d "$SRC" ] || { echo "SKIP: fixture $SRC missing"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-cli-verify-extra-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# run EXPECTED_CODE ARGS...: output in $T/out, stderr in $T/err
run() {
  want=$1; shift
  "$BIN" verify -q "$@" >"$T/out" 2>"$T/err"
  got=$?
  [ "$got" -eq "$want" ] || { cat "$T/out" "$T/err"; fail "zckpt verify $*: exit $got, expected $want"; }
}
# setup only: leaks of reshard / to-universal are their own tests' business
setup() { ASAN_OPTIONS=detect_leaks=0 "$BIN" "$@" -q >/dev/null 2>"$T/err" || { cat "$T/err"; fail "zckpt $*"; }; }
warnings() { grep -c "^warning:" "$T/out"; }

# ---- a DeepSpeed tag folder written by reshard
setup reshard "$SRC" "$T/rs" --to-world-size 2
G=$(ls -d "$T"/rs/global_step*)
[ -f "$G/zckpt-manifest.json" ] || fail "reshard wrote no manifest"
run 0 "$T/rs"
grep -q "^result: clean" "$T/out" || fail "resharded folder not clean"
[ "$(warnings)" -eq 0 ] || { cat "$T/out"; fail "warnings on the untouched folder"; }
grep "^checked:" "$T/out" >"$T/checked.before"

cp "$G/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt" "$G/extra.pt"
mkdir "$G/notes"
echo "a note" >"$G/notes/readme.txt"
run 0 "$T/rs"
grep -q "^result: clean" "$T/out" || fail "extra files made the folder unclean"
grep -q "^warning: $G/extra.pt: not listed in zckpt-manifest.json" "$T/out" || { cat "$T/out"; fail "extra.pt not named"; }
grep -q "^warning: $G/notes/readme.txt: not listed in zckpt-manifest.json" "$T/out" || { cat "$T/out"; fail "notes/readme.txt not named"; }
[ "$(warnings)" -eq 2 ] || { cat "$T/out"; fail "expected 2 warnings"; }
# their bytes are not read: the same files, bytes and records checked as before
grep "^checked:" "$T/out" | cmp -s - "$T/checked.before" || { cat "$T/out" "$T/checked.before"; fail "extra files were read"; }
run 0 --json "$T/rs"
grep -q '"check":[[:space:]]*"extra-file"' "$T/out" || fail "JSON lacks the extra-file finding"
run 0 --structure-only "$T/rs"
[ "$(warnings)" -eq 2 ] || { cat "$T/out"; fail "--structure-only: expected 2 warnings"; }

# left out of the manifest on purpose: never reported
: >"$G/.zckpt-partial"                      # a stale marker: a note of its own
: >"$G/.extra.pt.zck-tmp-12345"             # a zckpt temporary
: >"$G/notes/.x.zck-tmp-12345"
ln -s "$G/zero_pp_rank_0_mp_rank_00_model_states.pt" "$G/linked.pt"   # symlinks are not listed
run 0 "$T/rs"
[ "$(warnings)" -eq 2 ] || { cat "$T/out"; fail "marker, temporaries or symlink reported"; }
grep -q "stale .zckpt-partial" "$T/out" || { cat "$T/out"; fail "stale marker note gone"; }
rm "$G/.zckpt-partial" "$G/.extra.pt.zck-tmp-12345" "$G/notes/.x.zck-tmp-12345" "$G/linked.pt"

# a listed file's damage is still damage beside the warnings
F="$G/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
truncate -s 3000 "$F"
run 3 "$T/rs"
[ "$(warnings)" -eq 2 ] || { cat "$T/out"; fail "warnings gone beside damage"; }

# no manifest: unchanged, the extra files are checked like the rest, nothing warned
setup reshard "$SRC" "$T/rs2" --to-world-size 2
G2=$(ls -d "$T"/rs2/global_step*)
rm "$G2/zckpt-manifest.json"
cp "$G2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt" "$G2/extra.pt"
run 0 "$T/rs2"
grep -q "^result: clean" "$T/out" || fail "no manifest: not clean"
[ "$(warnings)" -eq 0 ] || { cat "$T/out"; fail "no manifest: warnings"; }
grep -q "^checked: 5 files" "$T/out" || { cat "$T/out"; fail "no manifest: extra.pt not checked"; }

# ---- a universal folder written by to-universal --format ds
if "$BIN" to-universal --help >/dev/null 2>&1; then
  setup to-universal "$SRC" "$T/uv"
  [ -f "$T/uv/zckpt-manifest.json" ] || fail "to-universal wrote no manifest"
  setup consolidate "$T/uv" "$T/before.safetensors"
  cp -r "$T/uv/zero/fc1.weight" "$T/uv/zero/bogus.weight"
  run 0 "$T/uv"
  grep -q "^result: clean" "$T/out" || fail "universal: extra param folder made it unclean"
  for f in exp_avg.pt exp_avg_sq.pt fp32.pt; do
    grep -q "^warning: $T/uv/zero/bogus.weight/$f: not listed in zckpt-manifest.json" "$T/out" ||
      { cat "$T/out"; fail "universal: bogus.weight/$f not named"; }
  done
  [ "$(warnings)" -eq 3 ] || { cat "$T/out"; fail "universal: expected 3 warnings"; }
  # DeepSpeed ignores a param folder the model does not have; so do consolidate and reshard
  setup consolidate "$T/uv" "$T/after.safetensors"
  cmp -s "$T/before.safetensors" "$T/after.safetensors" || fail "consolidate read the extra param folder"
  setup reshard "$T/uv" "$T/uv_rs" --to-world-size 2
  run 0 "$T/uv_rs"
fi
echo ok
