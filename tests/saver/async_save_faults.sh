#!/usr/bin/env bash
# async_save_faults.sh TRAIN ZCKPT
#
# A full disk during a background write (--async-save) fails the run with one line and
# exit status 1, never a silent loss: the disk fills (lib/io's ZCK_FAULT=write:K:ENOSPC)
# in the save of step S, which the writer thread is writing while training goes on; the
# next save (or the end of training) reports it: "zckpt-train: error: background save of
# step S: ...: No space left on device". The checkpoints before S stay complete (they
# verify, each `latest` names its own tag), none from S on is in place, and no temporary
# folder is left. K picks the first save (reported at the second), a middle one, and the
# last one (reported at the end of training).
set -u
train="$1"; zckpt="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail=0; at_save=0; at_end=0
args=(--n-layer 1 --n-embd 32 --n-head 2 --n-positions 16 --per-device-train-batch-size 1 --ranks 2 --zero-stage 2
      --max-steps 8 --save-steps 2 --quiet --async-save)
# a save of this run makes about 33 writes: these land in the first, second and last save
for k in 1 45 100; do
  out="$tmp/k$k"
  ZCK_FAULT="write:$k:ENOSPC" "$train" "${args[@]}" --output-dir "$out" >/dev/null 2>"$tmp/err"
  rc=$?
  lines=$(wc -l <"$tmp/err")
  s=$(sed -n 's/^zckpt-train: error: background save of step \([0-9]*\): .*No space left on device$/\1/p' "$tmp/err")
  if [ "$rc" != 1 ] || [ "$lines" != 1 ] || [ -z "$s" ]; then
    echo "write $k: exit $rc, $lines lines on stderr, wanted 1 and one line naming the background save:"; cat "$tmp/err"
    fail=$((fail + 1)); continue
  fi
  for ck in "$out"/checkpoint-*; do
    [ -d "$ck" ] || continue
    n=${ck##*checkpoint-}
    if [ "$n" -ge "$s" ]; then echo "write $k: $ck is in place although the save of step $s failed"; fail=$((fail + 1)); fi
    if [ "$(cat "$ck/latest")" != "global_step$n" ]; then echo "write $k: $ck/latest: $(cat "$ck/latest")"; fail=$((fail + 1)); fi
    if ! "$zckpt" verify "$ck" >"$tmp/v" 2>&1; then echo "write $k: verify $ck failed:"; cat "$tmp/v"; fail=$((fail + 1)); fi
  done
  if ls -a "$out" | grep -q "zck-tmp"; then echo "write $k: a temporary folder is left"; fail=$((fail + 1)); fi
  if [ "$s" = 8 ]; then at_end=1; else at_save=1; fi
  echo "write $k: the save of step $s failed, reported in one line: $(cut -c1-90 "$tmp/err")..."
done
# both ways a failure comes back: at a later save, and at the end of training
if [ "$at_save" = 0 ] || [ "$at_end" = 0 ]; then
  echo "the faults did not hit both a middle save and the last one: adjust the write counts above"; fail=$((fail + 1))
fi
echo "$fail failures"
[ "$fail" = 0 ]
