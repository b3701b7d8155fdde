#!/usr/bin/env bash
# cli_faults.sh ZCKPT: every writing command under injected faults (lib/io's ZCK_FAULT:
# the Nth write / read / fsync / rename / open fails with ENOSPC, EIO or a short write).
# Each run must exit 1 with one line "zckpt: error: ...", leave nothing at the
# destination (no temporary files either), and leave an earlier output untouched.
set -u
zckpt="$1"
fx="${ZCK_FIXTURES:?}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
ck="$fx/deepspeed/s3w2_bf16/ckpt"
[ -d "$ck" ] || { echo "SKIP: fixture missing"; exit 77; }
pass=0; fail=0
snapshot() { (cd "$tmp/out" && find . -type f -exec md5sum {} + 2>/dev/null | sort); }
run_case() { # label fault cmd... (the command writes to $tmp/out/target)
  local label="$1" fault="$2"; shift 2
  local before; before=$(snapshot)
  ZCK_FAULT="$fault" "$@" >"$tmp/stdout" 2>"$tmp/stderr"; local rc=$?
  local after; after=$(snapshot)
  local lines; lines=$(wc -l <"$tmp/stderr")
  if [ "$rc" = 0 ]; then
    # the fault hit no call of that kind (N beyond the command's calls): output must be whole
    rm -rf "$tmp/out/target" "$tmp/out/target.pt"; pass=$((pass + 1)); return
  fi
  if [ "$rc" != 1 ] || [ "$lines" != 1 ] || ! grep -q "^zckpt: error: " "$tmp/stderr"; then
    echo "FAIL $label [$fault]: exit $rc, stderr:"; cat "$tmp/stderr"; fail=$((fail + 1)); return
  fi
  if ls -a "$tmp/out" | grep -q -e '^target' -e zck-tmp; then
    echo "FAIL $label [$fault]: partial output left: $(ls -a "$tmp/out")"; fail=$((fail + 1)); return
  fi
  if [ "$before" != "$after" ]; then echo "FAIL $label [$fault]: earlier output changed"; fail=$((fail + 1)); return; fi
  pass=$((pass + 1))
}
mkdir -p "$tmp/out"
# an earlier output that must survive everything
"$zckpt" consolidate -q "$ck" "$tmp/out/earlier" || { echo "setup failed"; exit 1; }
# a file replaced in place (--overwrite): on failure the earlier version must be back
replace_case() { # fault
  printf 'earlier version\n' >"$tmp/replace.pt"
  ZCK_FAULT="$1" "$zckpt" convert -q --overwrite "$fx/safetensors/dtypes.safetensors" "$tmp/replace.pt" 2>"$tmp/stderr"
  local rc=$?
  if [ "$rc" = 1 ] && { ! printf 'earlier version\n' | cmp -s - "$tmp/replace.pt" || ls -a "$tmp" | grep -q zck-; }; then
    echo "FAIL convert-replace [$1]: earlier file not restored: $(ls -a "$tmp")"; fail=$((fail + 1)); return
  fi
  pass=$((pass + 1))
}
for fault in write:1:ENOSPC write:2:ENOSPC write:5:SHORT write:9:EIO read:1:EIO read:7:EIO fsync:1:EIO fsync:2:EIO fsync:3:EIO \
             rename:1:EIO rename:2:EIO open:2:EIO open:6:EIO; do
  run_case consolidate "$fault" "$zckpt" consolidate -q "$ck" "$tmp/out/target"
  run_case consolidate-sharded "$fault" "$zckpt" consolidate -q --max-shard-size 1KB --format both "$ck" "$tmp/out/target"
  run_case reshard "$fault" "$zckpt" reshard -q --to-stage 2 --to-world-size 3 "$ck" "$tmp/out/target"
  run_case convert "$fault" "$zckpt" convert -q "$fx/torch/dtypes.pt" "$tmp/out/target"
  run_case convert-pt "$fault" "$zckpt" convert -q "$fx/safetensors/dtypes.safetensors" "$tmp/out/target.pt"
  replace_case "$fault"
  if "$zckpt" to-universal --help >/dev/null 2>&1; then
    run_case to-universal "$fault" "$zckpt" to-universal -q "$ck" "$tmp/out/target"
    run_case to-universal-h5 "$fault" "$zckpt" to-universal -q --format hdf5 "$ck" "$tmp/out/target"
  fi
done
# a full disk names the output file with its folder (it named the bare "model.safetensors")
for sharding in "" "--format both"; do
  # shellcheck disable=SC2086
  ZCK_FAULT=write:2:ENOSPC "$zckpt" consolidate -q $sharding "$ck" "$tmp/out/named" 2>"$tmp/stderr"
  if grep -q "^zckpt: error: $tmp/out/named/model[-0-9of]*\.safetensors: write of" "$tmp/stderr"; then pass=$((pass + 1))
  else echo "FAIL full-disk message [$sharding]: $(cat "$tmp/stderr")"; fail=$((fail + 1)); fi
done
# a file OUT with missing parents is written, as a folder OUT is (it failed)
if "$zckpt" consolidate -q "$ck" "$tmp/out/new3/new4/whole.safetensors" 2>"$tmp/stderr" && [ -f "$tmp/out/new3/new4/whole.safetensors" ]; then
  pass=$((pass + 1)); rm -rf "$tmp/out/new3"
else echo "FAIL file OUT with missing parents: $(cat "$tmp/stderr")"; fail=$((fail + 1)); rm -rf "$tmp/out/new3"; fi
# a failed save leaves none of the parent folders it made (for a folder OUT and a file OUT)
for target in new1/new2/target new1/new2/target.safetensors; do
  ZCK_FAULT=write:2:ENOSPC "$zckpt" consolidate -q "$ck" "$tmp/out/$target" 2>"$tmp/stderr"
  if [ $? = 1 ] && [ ! -e "$tmp/out/new1" ]; then pass=$((pass + 1))
  else echo "FAIL parents left [$target]: $(ls -A "$tmp/out") $(cat "$tmp/stderr")"; fail=$((fail + 1)); rm -rf "$tmp/out/new1"; fi
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
