#!/usr/bin/env bash
# resume_reshard.sh TRAIN: --resume-from-checkpoint with another ZeRO stage / rank count
# goes through the library's reshard: training continues from the same state, so the
# losses follow the uninterrupted run's (equal up to the order in which W ranks sum
# gradients: relative 1e-4 here, in fp32), and the temporary reshard is removed.
set -euo pipefail
train="$1"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
A=(--n-layer 1 --n-embd 32 --n-head 2 --n-positions 32 --logging-steps 1 --seed 5)
# the global batch (ranks x per-device batch) stays 8, so every run sees the same data
"$train" "${A[@]}" --output-dir "$tmp/a" --max-steps 8 --save-steps 4 --ranks 4 --per-device-train-batch-size 2 \
  --zero-stage 3 2>"$tmp/straight.log"
n=0
for target in "1 2" "2 1" "3 1" "3 2" "1 8"; do
  set -- $target
  "$train" "${A[@]}" --output-dir "$tmp/r$1$2" --max-steps 8 --save-steps 100 --zero-stage "$1" --ranks "$2" \
    --per-device-train-batch-size $((8 / $2)) \
    --resume-from-checkpoint "$tmp/a/checkpoint-4" 2>"$tmp/r.log"
  grep -q "resharding it for ZeRO-$1 on $2 ranks" "$tmp/r.log"
  ls -a "$tmp/r$1$2" | grep -q resume-resharded && { echo "FAIL: temporary reshard left behind"; exit 1; }
  for step in 5 6 7 8; do
    a=$(sed -n "s|^step $step/8 \| loss \([0-9.]*\).*|\1|p" "$tmp/straight.log")
    b=$(sed -n "s|^step $step/8 \| loss \([0-9.]*\).*|\1|p" "$tmp/r.log")
    [ -n "$a" ] && [ -n "$b" ] || { echo "FAIL: no loss for step $step"; cat "$tmp/r.log"; exit 1; }
    awk -v a="$a" -v b="$b" -v s="$step" -v t="$target" 'BEGIN { d = (a > b ? a - b : b - a) / a; if (d > 1e-4) { printf "FAIL ZeRO/W %s step %d: %s vs %s\n", t, s, a, b; exit 1 } }'
  done
  n=$((n + 1))
done
echo "$n passed, 0 failed"
