#!/usr/bin/env bash
# kill_during_reshard.sh TRAIN: a run killed (SIGKILL, the real process) in the reshard of
# its resume, before any save, leaves its temporary tree beside the output; the next run
# that makes one sweeps it first, so killed runs never pile trees up; a run that finishes
# leaves none.
set -uo pipefail
train="$1"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
out="$tmp/out"
A=(--n-layer 1 --n-embd 32 --n-head 2 --n-positions 32 --per-device-train-batch-size 2 --eval-samples 2 --quiet
   --logging-steps 1000 --output-dir "$out")
trees() { ls -a "$out" | grep -c '^\.resume-resharded\.zck-tmp-' || true; }
"$train" "${A[@]}" --zero-stage 1 --ranks 1 --max-steps 2 --save-steps 2 >/dev/null 2>"$tmp/log" ||
  fail "first run: $(tail -3 "$tmp/log")"
# ZeRO-1 on 1 rank -> ZeRO-3 on 2 ranks: the resume reshards; the process kills itself once
# the reshard is written (ZCKPT_TRAIN_TEST_KILL=0:2:reshard)
killed_run() {
  ZCKPT_TRAIN_TEST_KILL=0:2:reshard "$train" "${A[@]}" --zero-stage 3 --ranks 2 --max-steps 3 --save-steps 1 \
    --resume-from-checkpoint "$out/checkpoint-2" >/dev/null 2>"$tmp/log"
  local rc=$?
  [ "$rc" = 137 ] || fail "the killed run ended with $rc, not SIGKILL: $(tail -3 "$tmp/log")"
  grep -q "killing myself after resharding step 2" "$tmp/log" || fail "no kill: $(tail -3 "$tmp/log")"
}
killed_run
[ "$(trees)" = 1 ] || fail "after the first kill: $(trees) temporary trees, not 1"
first=$(ls -a "$out" | grep '^\.resume-resharded\.zck-tmp-')
killed_run
[ "$(trees)" = 1 ] || fail "after the second kill: $(trees) temporary trees, not 1 (the dead run's is not swept)"
[ -e "$out/$first" ] && fail "the first killed run's tree $first is still there"
"$train" "${A[@]}" --zero-stage 3 --ranks 2 --max-steps 3 --save-steps 1 --resume-from-checkpoint "$out/checkpoint-2" \
  >/dev/null 2>"$tmp/log" || fail "the resume: $(tail -3 "$tmp/log")"
[ -d "$out/checkpoint-3" ] || fail "the resume saved no checkpoint-3"
left=$(ls -a "$out" | grep -c 'zck-tmp' || true)
[ "$left" = 0 ] || fail "the finished run left $left temporary entries: $(ls -a "$out")"
echo "1 passed, 0 failed"
