#!/bin/sh
# cli_verify_write_manifest.sh: `zckpt verify --write-manifest` of a folder that holds files
# besides the checkpoint (notes, another tool's files) lists only the files verify checked.
# It used to list every file of the folder: removing a note afterwards made the checkpoint
# "damaged" for verify and "incomplete" for consolidate. Files written by zckpt's jobs are
# built in a fresh folder renamed into place, so only this flag writes a manifest over a
# folder that may hold foreign files.
# Needs $ZCK_BIN (the zckpt binary) and $ZCK_FIXTURES; exits 77 when verify is not built in.
set -u
BIN=${ZCK_BIN:?ZCK_BIN not set}
FIX=${ZCK_FIXTURES:?ZCK_FIXTURES not set}
"$BIN" verify --help >/dev/null 2>&1 || { echo "SKIP: zckpt has no verify command"; exit 77; }
DS="$FIX/deepspeed/s2w2_bf16/ckpt"
HF="$FIX/safetensors/gpt2_sharded"
[ -d "$DS" ] && [ -d "$HF" ] || { echo "SKIP: fixtures missing"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/zckpt-cli-verify-wm-XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() { # EXPECTED_CODE ARGS...: `zckpt verify -q ARGS`, output in $T/out
  want=$1; shift
  "$BIN" verify -q "$@" >"$T/out" 2>"$T/err"
  got=$?
  [ "$got" -eq "$want" ] || { cat "$T/out" "$T/err"; fail "zckpt verify $*: exit $got, expected $want"; }
}
listed() { # MANIFEST: its files' paths, sorted, one a line
  sed -n 's/^ *{"path": "\([^"]*\)".*/\1/p' "$1" | LC_ALL=C sort
}

# ---- a DeepSpeed tag folder from DeepSpeed, with a note, another tool's file and a symlink
cp -r "$DS" "$T/ck"
G="$T/ck/global_step2"
echo "trained on the March data" >"$G/notes.txt"
mkdir "$G/other-tool"
echo "x" >"$G/other-tool/state.bin"
ln -s "$G/mp_rank_00_model_states.pt" "$G/link.pt"
run 0 --write-manifest "$T/ck"
# checked: the 3 rank files and the symlink (read as DeepSpeed would follow it; a manifest
# never lists a symlink)
grep -q "^checked: 4 files" "$T/out" || { cat "$T/out"; fail "not the 3 rank files and the link checked"; }
[ -f "$G/zckpt-manifest.json" ] || fail "no manifest written"
listed "$G/zckpt-manifest.json" >"$T/got"
printf '%s\n' bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt \
  mp_rank_00_model_states.pt >"$T/want"
diff -u "$T/want" "$T/got" || fail "the manifest lists other files than the 3 rank files verify checked"
# the rank files' tensors and the layout are recorded as before
grep -q '"layout": {"tag": "global_step2", "stage": 2, "world_size": 2' "$G/zckpt-manifest.json" || fail "no layout"
grep -q '"file": "mp_rank_00_model_states.pt"' "$G/zckpt-manifest.json" || fail "no tensors of the model file"
# the manifest holds: clean against it; the foreign files are named, not read
run 0 "$T/ck"
grep -q "^checked: 4 files, .* tensors against the manifest" "$T/out" || { cat "$T/out"; fail "not checked against the manifest"; }
grep -q "^warning: $G/notes.txt: not listed in zckpt-manifest.json" "$T/out" || { cat "$T/out"; fail "notes.txt not named"; }
# the note removed: the checkpoint is still whole, for verify and for consolidate
rm -r "$G/notes.txt" "$G/other-tool"
run 0 "$T/ck"
grep -q "^result: clean" "$T/out" || { cat "$T/out"; fail "not clean once the note is gone"; }
"$BIN" consolidate -q "$T/ck" "$T/model.safetensors" 2>"$T/err" || { cat "$T/err"; fail "consolidate refused once the note is gone"; }
# a rank file damaged afterwards is still caught (the manifest covers it)
printf '\377' | dd of="$G/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt" bs=1 seek=5156 conv=notrunc 2>/dev/null
run 3 "$T/ck"

# ---- an HF folder (shards, index, config.json from save_pretrained) with a note
cp -r "$HF" "$T/hf"
echo "note" >"$T/hf/notes.txt"
run 0 --write-manifest "$T/hf"
listed "$T/hf/zckpt-manifest.json" >"$T/got"
(cd "$T/hf" && ls model-*.safetensors && echo model.safetensors.index.json) | LC_ALL=C sort >"$T/want"
diff -u "$T/want" "$T/got" || fail "the HF manifest lists other files than the shards and the index verify checked"
rm "$T/hf/notes.txt"
run 0 "$T/hf"
grep -q "^result: clean" "$T/out" || { cat "$T/out"; fail "HF folder not clean once the note is gone"; }

# ---- a folder that already has a manifest keeps it
run 0 --write-manifest "$T/hf"
grep -q "^manifest: already present, not rewritten" "$T/out" || { cat "$T/out"; fail "an existing manifest rewritten"; }
echo ok
