#!/usr/bin/env bash
# train_procs.sh TRAIN ZCKPT: zckpt-train with one process per rank (tcp backend).
#  - --nproc W and --ranks W (threads) write byte-identical checkpoints (every file,
#    trainer_state.json included: it holds no wall time) and print the same losses, for
#    ZeRO 1, 2, 3 and W = 2, 3 (fp32 and bf16, frozen params, stage-3 16-bit model);
#  - resume under --nproc at another W / stage equals the thread mode's resume;
#  - the environment torchrun gives (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and the
#    one mpirun gives (OMPI_COMM_WORLD_RANK / _SIZE), processes started by this script;
#  - a rank killed mid-run (ZCKPT_TRAIN_TEST_KILL): the launcher exits 1 with one line
#    naming rank 1, every checkpoint left is complete (verify), no temporary folder
#    survives rank 0, no process is left;
#  - usage: --nproc with --ranks, --nproc under a launcher; --device cuda fails cleanly.
# Each run uses the same output folder name, since trainer_state.json records paths.
set -uo pipefail
train="$1"; zckpt="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
A=(--n-layer 1 --n-embd 32 --n-head 2 --n-positions 32 --per-device-train-batch-size 2 --eval-samples 4
   --logging-steps 1 --learning-rate 3e-3 --warmup-steps 1 --weight-decay 0.1 --seed 7)
out="$tmp/out"
losses() { sed -n 's/^\(step [0-9]*\/[0-9]* | loss [0-9.]* | grad_norm [0-9.]*\).*/\1/p; s/^\(.*eval_loss [0-9.]*\).*/\1/p' "$1"; }
cat >"$tmp/g16.json" <<'JSON'
{"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true,
 "sub_group_size": 3000}}
JSON

# same RUN-ARGS: threads vs processes
n=0
same() {
  local W=$1; shift
  rm -rf "$out"
  "$train" "${A[@]}" --ranks "$W" --output-dir "$out" "$@" >"$tmp/t.out" 2>"$tmp/t.log" || fail "threads W=$W $*: $(tail -3 "$tmp/t.log")"
  rm -rf "$tmp/threads"; mv "$out" "$tmp/threads"
  "$train" "${A[@]}" --nproc "$W" --output-dir "$out" "$@" >"$tmp/p.out" 2>"$tmp/p.log" || fail "--nproc $W $*: $(tail -3 "$tmp/p.log")"
  cmp -s "$tmp/t.out" "$tmp/p.out" || fail "--nproc $W $*: stdout differs: $(cat "$tmp/p.out")"
  grep -q "on $W ranks (a process each)" "$tmp/p.log" || fail "banner: $(head -2 "$tmp/p.log")"
  diff -r "$tmp/threads" "$out" >"$tmp/diff" || fail "--nproc $W $*: checkpoints differ: $(head -5 "$tmp/diff")"
  ls -a "$out" | grep -qE "zck-tmp|resharded|best-model" && fail "--nproc $W $*: temporary left: $(ls -a "$out")"
  losses "$tmp/t.log" >"$tmp/t.loss"; losses "$tmp/p.log" >"$tmp/p.loss"
  [ "$(grep -c '^step' "$tmp/t.loss")" -ge 2 ] || fail "no loss lines: $(cat "$tmp/t.log")"
  cmp -s "$tmp/t.loss" "$tmp/p.loss" || fail "--nproc $W $*: losses differ: $(diff "$tmp/t.loss" "$tmp/p.loss" | head -4)"
  n=$((n + 1))
}
for stage in 1 2 3; do
  same 2 --zero-stage $stage --max-steps 4 --save-steps 2
  same 3 --zero-stage $stage --max-steps 4 --save-steps 2 --bf16 --freeze transformer.h.0.mlp
done
same 3 --deepspeed "$tmp/g16.json" --bf16 --max-steps 3 --save-steps 3 --freeze transformer.wpe
same 2 --zero-stage 2 --max-steps 6 --save-steps 2 --eval-steps 2 --load-best-model-at-end --greater-is-better --save-total-limit 1 \
  --generate-tokens 4
cmp -s "$tmp/threads/model.safetensors" "$out/model.safetensors" || fail "best model differs"

# resume under --nproc at another stage / W: the thread mode's resume
rm -rf "$tmp/src"
"$train" "${A[@]}" --ranks 3 --zero-stage 3 --bf16 --max-steps 4 --save-steps 2 --output-dir "$tmp/src" 2>/dev/null ||
  fail "source run"
for target in "1 2" "2 3" "3 2"; do
  set -- $target
  same "$2" --zero-stage "$1" --bf16 --max-steps 4 --save-steps 4 --resume-from-checkpoint "$tmp/src/checkpoint-2"
  grep -q "resharding it for ZeRO-$1 on $2 ranks" "$tmp/p.log" || fail "no reshard message"
  [ "$(grep -c "resharding it" "$tmp/p.log")" = 1 ] || fail "resharded more than once"
done

# a launcher's environment, processes started here (torchrun's variables, then mpirun's)
env_launch() {
  local W=$1 style=$2; shift 2
  for try in 1 2 3; do
    local port=$((20000 + RANDOM % 30000)) pids=() r
    rm -rf "$out"
    for ((r = 0; r < W; r++)); do
      if [ "$style" = torchrun ]; then
        RANK=$r LOCAL_RANK=$r WORLD_SIZE=$W MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
          "$train" "${A[@]}" --output-dir "$out" "$@" >"$tmp/e$r.out" 2>"$tmp/e$r.log" &
      else
        OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$W OMPI_COMM_WORLD_LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 \
          MASTER_PORT=$port "$train" "${A[@]}" --output-dir "$out" "$@" >"$tmp/e$r.out" 2>"$tmp/e$r.log" &
      fi
      pids+=($!)
    done
    local ok=1
    for p in "${pids[@]}"; do wait "$p" || ok=0; done
    [ $ok = 1 ] && return 0
    grep -qi "in use" "$tmp"/e*.log || fail "$style launch W=$W: $(cat "$tmp"/e*.log | tail -5)"
  done
  fail "$style launch: no free port after 3 tries"
}
for style in torchrun mpirun; do
  same 2 --zero-stage 3 --max-steps 4 --save-steps 2 --generate-tokens 3
  env_launch 2 $style --zero-stage 3 --max-steps 4 --save-steps 2 --generate-tokens 3
  diff -r "$tmp/threads" "$out" >"$tmp/diff" || fail "$style launch: checkpoints differ: $(head -5 "$tmp/diff")"
  losses "$tmp/e0.log" >"$tmp/e.loss"
  cmp -s "$tmp/t.loss" "$tmp/e.loss" || fail "$style launch: losses differ"
  [ -s "$tmp/e0.out" ] || fail "$style launch: rank 0 printed no generated text"
  [ -s "$tmp/e1.out" ] && fail "$style launch: rank 1 wrote to stdout"
  [ -s "$tmp/e1.log" ] && fail "$style launch: rank 1 wrote to stderr: $(cat "$tmp/e1.log")"
  n=$((n + 1))
done

# a rank killed: at the start of a step, and in the middle of a save (its files written)
for when in "1:3" "1:3:save"; do
  rm -rf "$tmp/kill"
  ZCKPT_TRAIN_TEST_KILL=$when "$train" "${A[@]}" --nproc 2 --zero-stage 3 --max-steps 6 --save-steps 1 \
    --output-dir "$tmp/kill" >/dev/null 2>"$tmp/k.log"
  rc=$?
  [ $rc = 1 ] || fail "kill $when: launcher exit $rc, expected 1: $(cat "$tmp/k.log")"
  last=$(tail -1 "$tmp/k.log")
  [[ "$last" == "zckpt-train: error: rank 1 of 2 was killed by signal 9"* ]] || fail "kill $when: last line: $last"
  [ "$(grep -c "^zckpt-train: error: rank 1 of 2" "$tmp/k.log")" = 1 ] || fail "kill $when: not one line"
  ls "$tmp/kill" | grep -q "checkpoint-3" && fail "kill $when: checkpoint-3 exists"
  for ck in "$tmp"/kill/checkpoint-*; do
    "$zckpt" verify "$ck" >"$tmp/v" 2>&1 || fail "kill $when: $ck does not verify: $(cat "$tmp/v")"
  done
  [ -d "$tmp/kill/checkpoint-2" ] || fail "kill $when: checkpoint-2 missing"
  ls -a "$tmp/kill" | grep -q "zck-tmp" && fail "kill $when: a temporary folder survived rank 0: $(ls -a "$tmp/kill")"
  pgrep -f -- "$tmp/kill" >/dev/null && fail "kill $when: processes left: $(pgrep -af -- "$tmp/kill")"
  n=$((n + 1))
done

# SIGKILL at random moments (seeded) to a rank or to the launcher, saving every step: the
# newest checkpoint left verifies and resumes under --nproc, and no process is left.
# A kill lands a seeded delay after the launch, which on a slow or loaded machine (or
# under ASan) may be before any save of that run: the trials start from a checkpoint made
# here, so that one always exists, and each trial resumes from the newest one.
"$train" "${A[@]}" --nproc 2 --zero-stage 1 --max-steps 1 --save-steps 1 --output-dir "$tmp/rk" 2>"$tmp/rk.log" ||
  fail "random kills: first checkpoint: $(tail -2 "$tmp/rk.log")"
RANDOM=4321
for trial in 1 2 3 4; do
  W=$((RANDOM % 2 + 2)); stage=$((RANDOM % 3 + 1)); victim=$((RANDOM % (W + 1))); delay=$((RANDOM % 300 + 150))
  prev=$(ls -d "$tmp"/rk/checkpoint-* | sed 's/.*checkpoint-//' | sort -n | tail -1)
  "$train" "${A[@]}" --nproc "$W" --zero-stage $stage --max-steps 100000 --save-steps 1 --save-total-limit 2 \
    --output-dir "$tmp/rk" --resume-from-checkpoint "$tmp/rk/checkpoint-$prev" >/dev/null 2>"$tmp/rk.log" &
  launcher=$!
  sleep "$(printf '0.%03d' "$delay")"
  kids=($(pgrep -P $launcher))
  if [ $victim = $W ] || [ ${#kids[@]} = 0 ]; then
    kill -9 $launcher
    wait $launcher 2>/dev/null
    # its ranks die of PR_SET_PDEATHSIG, each when the kernel gets to it: wait for that
    for i in $(seq 600); do pgrep -f -- "$tmp/rk" >/dev/null || break; sleep 0.05; done
  else
    # the launcher stops the other ranks and reaps them all before it exits
    kill -9 "${kids[$((victim % ${#kids[@]}))]}"
    wait $launcher 2>/dev/null
  fi
  pgrep -f -- "$tmp/rk" >/dev/null && fail "random kill $trial: processes left: $(pgrep -af -- "$tmp/rk")"
  last=$(ls -d "$tmp"/rk/checkpoint-* 2>/dev/null | sed 's/.*checkpoint-//' | sort -n | tail -1)
  [ -n "$last" ] || fail "random kill $trial: no checkpoint left (checkpoint-$prev was there)"
  "$zckpt" verify "$tmp/rk/checkpoint-$last" >"$tmp/v" 2>&1 || fail "random kill $trial: checkpoint-$last: $(cat "$tmp/v")"
  n=$((n + 1))
done
# the next save sweeps the temporary trees of killed writers (checkpoint folders, reshards)
# once their processes are gone (a killed rank is a zombie until its new parent reaps it)
for p in $(ls -a "$tmp/rk" | sed -n 's/.*\.zck-tmp-\([0-9]*\)$/\1/p'); do
  for i in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
done
last=$(ls -d "$tmp"/rk/checkpoint-* | sed 's/.*checkpoint-//' | sort -n | tail -1)
info=$("$zckpt" inspect "$tmp/rk/checkpoint-$last" | head -1)
s=$(sed -n 's/.*ZeRO-\([0-9]\).*/\1/p' <<<"$info"); w=$(sed -n 's/.*world size \([0-9]*\).*/\1/p' <<<"$info")
"$train" "${A[@]}" --nproc "$w" --zero-stage "$s" --max-steps $((last + 1)) --save-steps 1 \
  --resume-from-checkpoint "$tmp/rk/checkpoint-$last" --output-dir "$tmp/rk" 2>"$tmp/r.log" ||
  fail "resume after the random kills: $(tail -2 "$tmp/r.log")"
ls -a "$tmp/rk" | grep -qE "zck-tmp|resharded|best-model" && fail "random kills: temporary trees left: $(ls -a "$tmp/rk")"

# usage and clean failures
"$train" --nproc 2 --ranks 2 2>"$tmp/u" && fail "--nproc with --ranks accepted"
grep -q "exclude each other" "$tmp/u" || fail "--nproc --ranks: $(cat "$tmp/u")"
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$train" --nproc 2 2>"$tmp/u"; [ $? = 2 ] || fail "--nproc under a launcher"
grep -q "already rank 0 of 2" "$tmp/u" || fail "--nproc under a launcher: $(cat "$tmp/u")"
"$train" "${A[@]}" --nproc 2 --device cuda --max-steps 1 2>"$tmp/u"; [ $? = 1 ] || fail "--device cuda: exit status"
grep -q "^zckpt-train: error: --device cuda: " "$tmp/u" || fail "--device cuda: $(cat "$tmp/u")"
"$train" --help >"$tmp/help" || fail "--help"
grep -q -- "--nproc N" "$tmp/help" || fail "--help lacks --nproc"
echo "$n passed, 0 failed"
