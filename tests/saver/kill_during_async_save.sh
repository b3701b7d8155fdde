#!/usr/bin/env bash
# kill_during_async_save.sh TRAIN ZCKPT [KILLS] [SEED]
#
# SIGKILL of the real zckpt-train process while a background save (--async-save) is being
# written must cost nothing: the newest complete checkpoint-N/ (what the HF Trainer resumes
# from) verifies, its `latest` names its own tag, and a resume from it to the end writes the
# same final checkpoint, file for file, as a run never interrupted.
#
# A kill counts as "during a background write" when a temporary checkpoint folder
# .checkpoint-W.zck-tmp-PID is left in the output: the writer thread of step W had started
# (the ranks return to training the moment it starts) and not yet renamed it into place.
# Of those, the kills after the log showed a later step than W finished prove the overlap
# outright: training went on while W was being written.
# Kills land at seeded random moments of the run's progress; trials go on until KILLS (default 20) of them were
# during a background write (at most 3 x KILLS trials); the test fails if fewer were, or if
# fewer than 5 of them show the overlap.
set -u
train="$1"; zckpt="$2"; want="${3:-20}"; seed="${4:-4242}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
RANDOM=$seed
steps=16
# a model with little compute per parameter, saved every 2 steps: a save (~6 MB, fsynced)
# takes longer than the 2 steps, so the writer is busy most of the run and each save waits
# for the one before
args=(--n-layer 2 --n-embd 128 --n-head 2 --n-positions 16 --per-device-train-batch-size 1 --ranks 2
      --zero-stage 3 --bf16 --eval-samples 1 --logging-steps 1 --save-steps 2 --max-steps $steps)

"$train" "${args[@]}" --output-dir "$tmp/ref" 2>/dev/null || { echo "FAIL: the reference run failed"; exit 1; }
ref="$tmp/ref/checkpoint-$steps"

trials=0; during=0; overlapped=0; fail=0; finished=0
while [ "$during" -lt "$want" ] && [ "$trials" -lt $((3 * want)) ]; do
  trials=$((trials + 1))
  out="$tmp/run"; rm -rf "$out"
  "$train" "${args[@]}" --async-save --output-dir "$out" 2>"$tmp/log" >/dev/null &
  pid=$!
  # the moment follows the run's own progress, not the clock, so a slower build (sanitizers)
  # or a busier machine moves it with the run: once the background write of a random save
  # has begun, half the trials kill a random few milliseconds later, the other half as soon
  # as the log shows a later step while that write is still going
  target=$(( (1 + RANDOM % (steps / 2 - 1)) * 2 )); wait_overlap=$((RANDOM % 2))
  for _ in $(seq 3000); do
    kill -0 "$pid" 2>/dev/null || break
    [ -d "$out/checkpoint-$target" ] && break
    if ls -a "$out" 2>/dev/null | grep -q "^\.checkpoint-$target\.zck-tmp-"; then
      [ "$wait_overlap" = 0 ] && { sleep "$(printf '0.%03d' $((RANDOM % 60)))"; break; }
      logged=$(sed -n 's/^step \([0-9]*\)\/.*/\1/p' "$tmp/log" | tail -1)
      [ -n "$logged" ] && [ "$logged" -gt "$target" ] && break
    fi
    sleep 0.01
  done
  if ! kill -9 "$pid" 2>/dev/null; then wait "$pid"; finished=$((finished + 1)); continue; fi
  wait "$pid" 2>/dev/null
  writing=$(ls -a "$out" 2>/dev/null | sed -n 's/^\.checkpoint-\([0-9]*\)\.zck-tmp-.*/\1/p' | sort -n | tail -1)
  logged=$(sed -n 's/^step \([0-9]*\)\/.*/\1/p' "$tmp/log" | tail -1)
  if [ -n "$writing" ]; then
    during=$((during + 1))
    [ -n "$logged" ] && [ "$logged" -gt "$writing" ] && overlapped=$((overlapped + 1))
  fi
  last=$(ls -d "$out"/checkpoint-* 2>/dev/null | sed 's/.*checkpoint-//' | sort -n | tail -1)
  resume=()
  if [ -n "$last" ]; then
    ck="$out/checkpoint-$last"
    if [ -n "$writing" ] && [ "$last" -ge "$writing" ]; then
      echo "trial $trials: checkpoint-$last is in place while the save of step $writing was still being written"; fail=$((fail + 1))
    fi
    if [ "$(cat "$ck/latest")" != "global_step$last" ]; then echo "trial $trials: $ck/latest: $(cat "$ck/latest")"; fail=$((fail + 1)); fi
    if ! "$zckpt" verify "$ck" >"$tmp/v" 2>&1; then echo "trial $trials: verify $ck failed:"; cat "$tmp/v"; fail=$((fail + 1)); fi
    resume=(--resume-from-checkpoint "$ck")
  fi
  # the resume writes into the same output, as a restarted job does (and sweeps the dead
  # writer's temporary folder); killed after the last save was committed: nothing to resume
  if [ "${last:-0}" -lt "$steps" ] && ! "$train" "${args[@]}" "${resume[@]}" --output-dir "$out" >/dev/null 2>"$tmp/r"; then
    echo "trial $trials: resume from checkpoint-${last:-none} failed: $(tail -1 "$tmp/r")"; fail=$((fail + 1)); continue
  fi
  if ! diff -r "$ref" "$out/checkpoint-$steps" >"$tmp/d"; then
    echo "trial $trials: resumed from checkpoint-${last:-none}, checkpoint-$steps differs from the uninterrupted run's:"
    head -5 "$tmp/d"; fail=$((fail + 1))
  fi
  if ls -a "$out" | grep -q "zck-tmp"; then echo "trial $trials: a temporary folder is left after the resume"; fail=$((fail + 1)); fi
done
echo "trials: $trials; kills during a background write: $during (wanted $want), $overlapped of them after a later step" \
     "was logged; runs that ended before the kill: $finished"
if [ "$during" -lt "$want" ]; then echo "FAIL: too few kills landed during a background write"; fail=$((fail + 1)); fi
if [ "$overlapped" -lt 5 ]; then echo "FAIL: too few kills show training going on during the write"; fail=$((fail + 1)); fi
echo "$fail failures"
[ "$fail" = 0 ]
