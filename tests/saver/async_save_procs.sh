#!/usr/bin/env bash
# async_save_procs.sh TRAIN ZCKPT [KILLS] [SEED]
#
# --async-save with one process per rank (--nproc, mpirun), where each rank's writer
# thread writes its own files and rank 0's commits the checkpoint once every rank's files
# are in (saver/save_async_ranks.c):
#  - the checkpoints are byte-identical to a synchronous save's (ZeRO 2 and 3, and stage 3
#    with the 16-bit model.safetensors each rank's writer fills its bytes of, with
#    --save-only-model too, where the manifest lists that file);
#  - a full disk (lib/io's ZCK_FAULT=write:K:ENOSPC, in every rank) during a background
#    write fails the run with exit 1 and one line of zckpt-train's naming the save, at the
#    next save or at the end of training; the checkpoints before stay complete, none after
#    is in place, no temporary folder is left;
#  - SIGKILL of a random rank process at a random moment while a background save is being
#    written (its temporary folder .checkpoint-W.zck-tmp-PID is there): mpirun ends the job,
#    no checkpoint from W on is in place, the newest one verifies with `latest` on its own
#    tag. Each killed run is resumed from that checkpoint with --async-save, and killed
#    again, until KILLS (default 20) kills landed during a background write; the run then
#    finishes, and its last checkpoint equals the uninterrupted run's, file for file.
# Skipped (77) without mpirun or in a build without MPI.
set -u
train="$1"; zckpt="$2"; want="${3:-20}"; seed="${4:-5151}"
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not installed"; exit 77; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_odls_base_sigkill_timeout=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
RANDOM=$seed
fail=0
"$train" --n-layer 1 --n-embd 32 --n-head 2 --n-positions 16 --nproc 1 --max-steps 1 --output-dir "$tmp/one" \
  >/dev/null 2>"$tmp/one.log"
if grep -q "built without MPI" "$tmp/one.log"; then echo "SKIP: zckpt-train built without MPI"; exit 77; fi

# ---- same bytes as a synchronous save
small=(--n-layer 1 --n-embd 32 --n-head 2 --n-positions 16 --per-device-train-batch-size 1 --logging-steps 1
       --eval-samples 1 --max-steps 6 --save-steps 2 --quiet)
cat >"$tmp/g16.json" <<'JSON'
{"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"},
 "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true}}
JSON
for run in "--zero-stage 2 --nproc 2" "--zero-stage 3 --bf16 --nproc 3" "--deepspeed $tmp/g16.json --bf16 --nproc 3" \
           "--deepspeed $tmp/g16.json --bf16 --nproc 2 --freeze transformer.wpe --save-only-model"; do
  read -ra extra <<<"$run"
  rm -rf "$tmp/run" "$tmp/sync"
  "$train" "${small[@]}" "${extra[@]}" --output-dir "$tmp/run" >/dev/null 2>"$tmp/err" || { echo "FAIL: sync $run: $(cat "$tmp/err")"; exit 1; }
  mv "$tmp/run" "$tmp/sync"
  "$train" "${small[@]}" "${extra[@]}" --async-save --output-dir "$tmp/run" >/dev/null 2>"$tmp/err" ||
    { echo "FAIL: async $run: $(cat "$tmp/err")"; exit 1; }
  case $run in *g16.json*) [ -s "$tmp/run/checkpoint-6/model.safetensors" ] ||
    { echo "FAIL: $run: no model.safetensors"; fail=$((fail + 1)); } ;; esac
  if diff -r "$tmp/sync" "$tmp/run" >"$tmp/d"; then echo "${run//$tmp\//}: async and sync checkpoints identical"
  else echo "FAIL: $run: async and sync checkpoints differ:"; head -5 "$tmp/d"; fail=$((fail + 1)); fi
done

# ---- a full disk: in the first save (reported at the second), the last (at the end)
at_save=0; at_end=0
for k in 1 100; do
  out="$tmp/k$k"
  ZCK_FAULT="write:$k:ENOSPC" timeout 120 "$train" "${small[@]}" --zero-stage 2 --nproc 2 --max-steps 8 --async-save \
    --output-dir "$out" >/dev/null 2>"$tmp/err"
  rc=$?
  ours=$(grep -c "^zckpt-train:" "$tmp/err")
  s=$(sed -n 's/^zckpt-train: error: background save of step \([0-9]*\): .*No space left on device$/\1/p' "$tmp/err")
  if [ "$rc" != 1 ] || [ "$ours" != 1 ] || [ -z "$s" ]; then
    echo "FAIL: write $k: exit $rc, $ours lines of zckpt-train's, wanted 1 naming the background save:"; cat "$tmp/err"
    fail=$((fail + 1)); continue
  fi
  for ck in "$out"/checkpoint-*; do
    [ -d "$ck" ] || continue
    n=${ck##*checkpoint-}
    [ "$n" -ge "$s" ] && { echo "FAIL: write $k: $ck is in place although the save of step $s failed"; fail=$((fail + 1)); }
    [ "$(cat "$ck/latest")" = "global_step$n" ] || { echo "FAIL: write $k: $ck/latest"; fail=$((fail + 1)); }
    "$zckpt" verify "$ck" >"$tmp/v" 2>&1 || { echo "FAIL: write $k: verify $ck:"; cat "$tmp/v"; fail=$((fail + 1)); }
  done
  ls -a "$out" | grep -q "zck-tmp" && { echo "FAIL: write $k: a temporary folder is left"; fail=$((fail + 1)); }
  if [ "$s" = 8 ]; then at_end=1; else at_save=1; fi
  echo "write $k: the save of step $s failed: $(grep '^zckpt-train:' "$tmp/err" | cut -c1-100)..."
done
[ "$at_save" = 1 ] && [ "$at_end" = 1 ] || { echo "FAIL: the faults did not hit a middle save and the last one"; fail=$((fail + 1)); }

# ---- kill -9 of a random rank during background writes, resumed until the end
steps=16
# stage 3 with the 16-bit model.safetensors: a kill also lands while ranks fill that file
args=(--n-layer 2 --n-embd 256 --n-head 2 --n-positions 16 --per-device-train-batch-size 1 --nproc 2
      --deepspeed "$tmp/g16.json" --bf16 --eval-samples 1 --logging-steps 1 --save-steps 2 --max-steps $steps)
rm -rf "$tmp/run"
"$train" "${args[@]}" --output-dir "$tmp/run" >/dev/null 2>&1 || { echo "FAIL: the reference run failed"; exit 1; }
mv "$tmp/run" "$tmp/ref"
out="$tmp/run"
during=0; written=0; launches=0; chains=0
while [ "$during" -lt "$want" ] && [ "$launches" -lt $((4 * want)) ]; do
  chains=$((chains + 1)); rm -rf "$out"; from=0; resume=()
  while [ "$from" -lt "$steps" ]; do
    launches=$((launches + 1))
    # a killed run's temporary folder stays until a later save sweeps it: only new ones count
    before=$(ls -a "$out" 2>/dev/null | grep zck-tmp)
    fresh() { ls -a "$out" 2>/dev/null | grep zck-tmp | { if [ -n "$before" ]; then grep -vxF "$before"; else cat; fi; }; }
    [ -n "$before" ] || before=none
    "$train" "${args[@]}" --async-save "${resume[@]}" --output-dir "$out" >/dev/null 2>"$tmp/log" &
    pid=$!
    # a random save after the resume point; once its folder is there, a random few ms more
    target=$((from + 2 * (1 + RANDOM % ((steps - from) / 2))))
    kill_it=$([ "$during" -lt "$want" ] && echo 1 || echo 0)
    # polled with shell builtins (globs), since the writes take only tens of milliseconds
    for _ in $(seq 6000); do
      [ "$kill_it" = 1 ] || break
      kill -0 "$pid" 2>/dev/null || break
      [ -d "$out/checkpoint-$target" ] && break
      hit=
      for d in "$out"/.checkpoint-*.zck-tmp-*; do
        [ -d "$d" ] || continue
        case $'\n'"$before"$'\n' in *$'\n'"${d##*/}"$'\n'*) continue ;; esac
        n=${d##*/.checkpoint-}; n=${n%%.*}
        [ "$n" -ge "$target" ] && hit=$d && break
      done
      if [ -n "$hit" ]; then
        # half the trials a random few ms after the folder appeared, half once a rank's
        # first file is in
        if [ $((RANDOM % 2)) = 0 ]; then sleep "$(printf '0.%03d' $((RANDOM % 10)))"; break; fi
        for _ in $(seq 500); do
          for f in "$hit"/global_step*/*; do [ -e "$f" ] && break 2; done
          [ -d "$hit" ] || break
        done
        break
      fi
      sleep 0.002
    done
    if [ "$kill_it" = 1 ]; then
      mapfile -t ranks < <(pgrep -P "$pid")
      [ "${#ranks[@]}" -gt 0 ] && kill -9 "${ranks[$((RANDOM % ${#ranks[@]}))]}" 2>/dev/null
    fi
    wait "$pid"; rc=$?
    new=$(fresh | grep "^\.checkpoint-" | sort -t- -k2 -n | tail -1)
    writing=$(echo "$new" | sed -n 's/^\.checkpoint-\([0-9]*\)\.zck-tmp-.*/\1/p')
    if [ -n "$writing" ]; then
      during=$((during + 1))
      ls "$out/$new"/global_step*/ 2>/dev/null | grep -q . && written=$((written + 1))
    fi
    last=$(ls -d "$out"/checkpoint-* 2>/dev/null | sed 's/.*checkpoint-//' | sort -n | tail -1)
    if [ -n "$last" ]; then
      ck="$out/checkpoint-$last"
      if [ -n "$writing" ] && [ "$last" -ge "$writing" ]; then
        echo "FAIL: launch $launches: checkpoint-$last is in place while the save of step $writing was being written"
        fail=$((fail + 1))
      fi
      [ "$(cat "$ck/latest")" = "global_step$last" ] || { echo "FAIL: launch $launches: $ck/latest"; fail=$((fail + 1)); }
      "$zckpt" verify "$ck" >"$tmp/v" 2>&1 || { echo "FAIL: launch $launches: verify $ck:"; cat "$tmp/v"; fail=$((fail + 1)); }
      resume=(--resume-from-checkpoint "$ck"); from=$last
    fi
    if [ "$rc" = 0 ]; then from=$steps; fi
  done
  if ! diff -r "$tmp/ref/checkpoint-$steps" "$out/checkpoint-$steps" >"$tmp/d"; then
    echo "FAIL: chain $chains: checkpoint-$steps differs from the uninterrupted run's:"; head -5 "$tmp/d"; fail=$((fail + 1))
  fi
  ls -a "$out" | grep -q "zck-tmp" && { echo "FAIL: chain $chains: a temporary folder is left"; fail=$((fail + 1)); }
done
echo "launches: $launches in $chains resumed chains; kills during a background write: $during (wanted $want)," \
     "$written of them after a rank's files were being written"
[ "$during" -ge "$want" ] || { echo "FAIL: too few kills landed during a background write"; fail=$((fail + 1)); }
[ "$written" -ge 5 ] || { echo "FAIL: too few kills landed while files were being written"; fail=$((fail + 1)); }
echo "$fail failures"
[ "$fail" = 0 ]
