#!/usr/bin/env bash
# kill_during_save.sh TRAIN ZCKPT [TRIALS] [SEED]
#
# Kills the training engine with SIGKILL at random moments (a seeded schedule) while it
# saves a checkpoint every step, TRIALS times (default 100) in one output directory, with
# rotation on. After every kill, the newest checkpoint-N/ (what the HF Trainer resumes
# from) must be complete: `zckpt verify` passes when available, it consolidates, and the
# engine resumes from it and trains on. Temporary trees of killed saves must not pile up.
set -u
train="$1"; zckpt="$2"; trials="${3:-100}"; seed="${4:-1234}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
out="$tmp/run"
RANDOM=$seed
has_verify=0; "$zckpt" verify --help >/dev/null 2>&1 && has_verify=1
common=(--n-layer 1 --n-embd 32 --n-head 2 --n-positions 32 --per-device-train-batch-size 2
        --logging-steps 1000 --quiet --save-total-limit 2 --eval-samples 2)
pass=0; fail=0; killed_in_save=0; no_ckpt=0
last_ckpt() { ls -d "$out"/checkpoint-* 2>/dev/null | sed 's/.*checkpoint-//' | sort -n | tail -1; }
for ((i = 1; i <= trials; i++)); do
  stage=$((RANDOM % 3 + 1)); ranks=$((RANDOM % 3 + 1)); delay_ms=$((RANDOM % 400 + 20))
  bf16=(); ((RANDOM % 2)) && bf16=(--bf16)
  prev=$(last_ckpt)
  if [ -n "$prev" ]; then
    "$train" "${common[@]}" "${bf16[@]}" --zero-stage "$stage" --ranks "$ranks" --output-dir "$out" \
      --max-steps 100000 --save-steps 1 --resume-from-checkpoint "$out/checkpoint-$prev" >/dev/null 2>"$tmp/err" &
  else
    "$train" "${common[@]}" "${bf16[@]}" --zero-stage "$stage" --ranks "$ranks" --output-dir "$out" \
      --max-steps 100000 --save-steps 1 --seed $i >/dev/null 2>"$tmp/err" &
  fi
  pid=$!
  sleep "$(printf '0.%03d' "$delay_ms")"
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  ls -a "$out" 2>/dev/null | grep -q "zck-tmp" && killed_in_save=$((killed_in_save + 1))
  last=$(last_ckpt)
  if [ -z "$last" ]; then no_ckpt=$((no_ckpt + 1)); pass=$((pass + 1)); continue; fi
  ck="$out/checkpoint-$last"
  ok=1
  if [ "$has_verify" = 1 ] && ! "$zckpt" verify "$ck" >"$tmp/v" 2>&1; then echo "trial $i: verify failed on $ck:"; cat "$tmp/v"; ok=0; fi
  if ! "$zckpt" consolidate -q "$ck" "$tmp/cons" --overwrite 2>"$tmp/c"; then echo "trial $i: consolidate failed on $ck: $(cat "$tmp/c")"; ok=0; fi
  # resume with the stage / world size the checkpoint was saved at (reshard is for changes)
  info=$("$zckpt" inspect "$ck" | head -1)
  s=$(sed -n 's/.*ZeRO-\([0-9]\).*/\1/p' <<<"$info"); w=$(sed -n 's/.*world size \([0-9]*\).*/\1/p' <<<"$info")
  if ! "$train" "${common[@]}" --zero-stage "$s" --ranks "$w" $(grep -q "lp bfloat16" < <("$zckpt" inspect "$ck") && echo --bf16) \
       --output-dir "$tmp/resume" --max-steps $((last + 1)) --save-steps 100000 --resume-from-checkpoint "$ck" >/dev/null 2>"$tmp/r"; then
    echo "trial $i: resume from $ck failed: $(tail -2 "$tmp/r")"; ok=0
  fi
  rm -rf "$tmp/resume"
  if [ "$ok" = 1 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
stale=$(ls -a "$out" | grep -c "zck-tmp" || true)
echo "kills: $trials (a save was in flight in $killed_in_save, no checkpoint yet in $no_ckpt); stale temporary trees at the end: $stale"
if [ "$stale" -gt 1 ]; then echo "FAIL: temporary trees of killed saves pile up"; fail=$((fail + 1)); fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
