#!/bin/sh
# cli_train.sh ZCKPT_TRAIN: the zckpt-train command line: help, usage errors (exit 2, one line
# pointing to --help), runtime errors (exit 1, "zckpt-train: error: ..."), a short run's
# progress lines, and the same output from two identical runs.
set -u
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect RC NEEDLE ARGS...: exit code RC and NEEDLE in stderr
expect() {
  rc=$1; needle=$2; shift 2
  "$BIN" "$@" >"$T/out" 2>"$T/err"
  got=$?
  [ "$got" = "$rc" ] || fail "$*: exit $got, expected $rc; stderr: $(cat "$T/err")"
  grep -qF -- "$needle" "$T/err" || fail "$*: stderr lacks '$needle': $(cat "$T/err")"
}

"$BIN" --help >"$T/out" 2>"$T/err" || fail "--help exit $?"
grep -q "^usage: zckpt-train" "$T/out" || fail "--help: no usage on stdout"
grep -q -- "--per-device-train-batch-size" "$T/out" || fail "--help: options missing"
[ -s "$T/err" ] && fail "--help wrote to stderr"
"$BIN" --version | grep -q "^zckpt-train " || fail "--version"

U="(see 'zckpt-train --help')"
expect 2 "zckpt-train: unknown option '--bogus' $U" --bogus
expect 2 "--max-steps: 'abc' is not an integer" --max-steps abc
expect 2 "--learning-rate needs a value" --learning-rate
expect 2 "--ranks 0: must be in [1, 64]" --ranks 0
expect 2 "--zero-stage 5: must be 1, 2 or 3" --zero-stage 5
expect 2 "--device tpu: must be cpu or cuda" --device tpu
expect 2 "unexpected argument 'extra'" extra
expect 2 "--bf16: 'maybe' is not true or false" --bf16=maybe
expect 2 "--gather-for-generation: 'sometimes'" --gather-for-generation sometimes
expect 2 "--max-steps must be positive" --max-steps 0
expect 2 "--lr-scheduler-type polynomial" --lr-scheduler-type polynomial
expect 2 "--corpus-bytes must be in" --corpus-bytes 2000000000
expect 2 "--load-best-model-at-end needs --eval-steps" --load-best-model-at-end
expect 2 "round multiple of the evaluation steps, but found 5, which is not a round multiple of 2" \
  --load-best-model-at-end --eval-steps 2 --save-steps 5 --output-dir "$T/o"
n=$(wc -l <"$T/err")
[ "$n" = 1 ] || fail "a usage error printed $n lines"

expect 1 "zckpt-train: error: --device cuda:" --device cuda --max-steps 1
expect 1 "zckpt-train: error: /nonexistent.json" --deepspeed /nonexistent.json
cat >"$T/ds.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto", "gradient_clipping": 0.5,
 "bf16": {"enabled": true}, "zero_optimization": {"stage": 3}}
JSON
expect 1 "zckpt-train: error: Please correct the following DeepSpeed config values that mismatch TrainingArguments values:" \
  --deepspeed "$T/ds.json" --per-device-train-batch-size 2
grep -qxF -- "- ds train_micro_batch_size_per_gpu=4 vs hf per_device_train_batch_size=2" "$T/err" || fail "mismatch 1"
grep -qxF -- "- ds gradient_clipping=0.5 vs hf max_grad_norm=1.0" "$T/err" || fail "mismatch 2"
grep -qxF -- "- ds bf16.enabled=True vs hf bf16|bf16_full_eval=False" "$T/err" || fail "mismatch 3"
grep -qxF -- "The easiest method is to set these DeepSpeed config values to 'auto'." "$T/err" || fail "mismatch tail"

# a short run: one progress line per logging step, nothing on stdout; underscores accepted
run() {
  "$BIN" --max-steps 4 --logging-steps 2 --per_device_train_batch_size 2 --ranks 2 --n-positions 16 \
    --n-embd 16 --n-head 2 --eval-samples 2 --deepspeed "$T/ds3.json" --bf16 "$@"
}
cat >"$T/ds3.json" <<'JSON'
{"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_clipping": "auto",
 "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": "auto"}}
JSON
run >"$T/out1" 2>"$T/err1" || fail "run: exit $?: $(cat "$T/err1")"
[ -s "$T/out1" ] && fail "run wrote to stdout"
[ "$(grep -c '^step ' "$T/err1")" = 2 ] || fail "expected 2 progress lines: $(cat "$T/err1")"
grep -q "ZeRO-3 on 2 ranks" "$T/err1" || fail "banner: $(cat "$T/err1")"
run >"$T/out2" 2>"$T/err2" || fail "second run"
sed 's/ | [0-9.]* ms\/step//' "$T/err1" >"$T/a"
sed 's/ | [0-9.]* ms\/step//' "$T/err2" >"$T/b"
cmp -s "$T/a" "$T/b" || fail "two identical runs printed different losses"
# generation prints prompt + text on stdout
run --generate-tokens 4 --prompt "1+1=" --gather-for-generation both >"$T/out3" 2>/dev/null || fail "generation run"
[ "$(grep -c '^\[gather_for_generation=o' "$T/out3")" = 2 ] || fail "generation output: $(cat "$T/out3")"
# held-out sums: N prompts whose line is not in the training text, completed and counted
run --eval-sums 5 2>"$T/err4" >/dev/null || fail "eval-sums run"
grep -Eq '^held-out sums: [0-5]/5 right \(prompts' "$T/err4" || fail "eval-sums output: $(cat "$T/err4")"
run --eval-sums 1001 2>/dev/null >/dev/null && fail "--eval-sums 1001 accepted"
# --reverse-sums: the model is trained on sums written least-significant digit first; what it
# generates is shown in the usual order (the run prints the same counts either way)
run --reverse-sums --eval-sums 5 --generate-tokens 8 --prompt "9+3=" --lr-scheduler-type cosine --warmup-steps 2 \
  2>"$T/err5" >"$T/out5" || fail "reverse-sums run: $(cat "$T/err5")"
grep -Eq '^held-out sums: [0-5]/5 right \(prompts' "$T/err5" || fail "reverse-sums output: $(cat "$T/err5")"
grep -q '^9+3=' "$T/out5" || fail "reverse-sums generation: $(cat "$T/out5")"

# the sample configs, each stage over 2 ranks
CONF=$(dirname "$0")/../../samples/configs
for z in 1 2 3; do
  "$BIN" --deepspeed "$CONF/ds_zero$z.json" --ranks 2 --max-steps 2 --per-device-train-batch-size 2 --bf16 \
    --n-positions 16 --n-embd 16 --n-head 2 --eval-samples 2 --logging-steps 1 >"$T/out" 2>"$T/err" ||
    fail "ds_zero$z.json: $(cat "$T/err")"
  grep -q "ZeRO-$z on 2 ranks" "$T/err" || fail "ds_zero$z.json: banner: $(cat "$T/err")"
done

# save and resume from the command line: steps 4-6 print the same losses
small="--ranks 2 --per-device-train-batch-size 2 --n-positions 16 --n-embd 16 --n-head 2 --eval-samples 2 --logging-steps 1 --max-steps 6"
"$BIN" $small --output-dir "$T/run" --save-steps 3 --deepspeed "$CONF/ds_zero3.json" --bf16 2>"$T/err1" >/dev/null ||
  fail "save run: $(cat "$T/err1")"
[ -f "$T/run/checkpoint-3/latest" ] && [ -f "$T/run/checkpoint-6/model.safetensors" ] || fail "checkpoints missing: $(ls -R "$T/run")"
# the manifest says who wrote the checkpoint: zckpt, at this program's version
m="$T/run/checkpoint-3/global_step3/zckpt-manifest.json"
grep -qxF '  "tool": "zckpt",' "$m" && grep -qxF "  \"version\": \"$("$BIN" --version | cut -d' ' -f2)\"," "$m" ||
  fail "$m does not name zckpt and its version: $(sed -n 2,6p "$m")"
# the console and trainer_state.json give one learning rate per step (HF logs the rate after
# the scheduler's step in both); the run warms up, so an off-by-one step shows
for k in 1 2 3 4 5 6; do
  con=$(sed -n "s/^step $k\/6 | .* | lr \([^ ]*\) | .*/\1/p" "$T/err1")
  js=$(tr -d ' \n' <"$T/run/checkpoint-6/trainer_state.json" |
    grep -o "{[^{}]*\"step\":$k}" | grep -o '"learning_rate":[^,}]*' | head -n 1 | cut -d: -f2)
  [ -n "$con" ] && [ -n "$js" ] || fail "lr of step $k: console '$con', trainer_state '$js'"
  awk -v a="$con" -v b="$js" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(d <= 1e-4 * m + 1e-12) }' ||
    fail "step $k: console lr $con, trainer_state.json learning_rate $js"
done
"$BIN" $small --resume-from-checkpoint "$T/run/checkpoint-3" --deepspeed "$CONF/ds_zero3.json" --bf16 2>"$T/err2" >/dev/null ||
  fail "resume run: $(cat "$T/err2")"
grep -q "resuming from $T/run/checkpoint-3 at step 3" "$T/err2" || fail "resume banner: $(cat "$T/err2")"
grep '^step [456]/' "$T/err1" | sed 's/ | [0-9.]* ms\/step//' >"$T/a"
grep '^step [456]/' "$T/err2" | sed 's/ | [0-9.]* ms\/step//' >"$T/b"
[ "$(wc -l <"$T/a")" = 3 ] && cmp -s "$T/a" "$T/b" || fail "resumed losses differ: $(cat "$T/a") vs $(cat "$T/b")"
# another world size goes through the library's reshard; another dtype is refused
expect 0 "resharding it for ZeRO-3 on 3 ranks" $small --ranks 3 \
  --resume-from-checkpoint "$T/run/checkpoint-3" --deepspeed "$CONF/ds_zero3.json" --bf16
expect 1 "bfloat16" $small --resume-from-checkpoint "$T/run/checkpoint-3" --deepspeed "$CONF/ds_zero3.json"
# memory report; offload to cpu accepted (a note, nothing changes), nvme refused in one line
cat >"$T/off.json" <<'JSON'
{"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
 "zero_optimization": {"stage": 3, "reduce_bucket_size": 64, "stage3_prefetch_bucket_size": 0,
 "offload_optimizer": {"device": "cpu", "pin_memory": true}, "offload_param": {"device": "cpu"}}}
JSON
expect 0 "peak model-state memory per rank: " $small --max-steps 2 --deepspeed "$T/off.json" --bf16
grep -q "^offload to cpu: every rank's model states already live in host memory" "$T/err" || fail "offload note: $(cat "$T/err")"
sed 's/"cpu", "pin_memory": true/"nvme", "nvme_path": "\/tmp"/' "$T/off.json" >"$T/nvme.json"
expect 1 "zero_optimization.offload_optimizer.device=nvme: NVMe offloading is not supported by zckpt-train" \
  $small --max-steps 2 --deepspeed "$T/nvme.json" --bf16
# --save-steps 0: no periodic save, but the final one (the help says "and at the end")
expect 0 "step 2/2" $small --max-steps 2 --save-steps 0 --output-dir "$T/s0"
[ -d "$T/s0/checkpoint-2" ] && [ "$(ls "$T/s0")" = checkpoint-2 ] || fail "--save-steps 0: $(ls "$T/s0" 2>&1)"
echo ok
