#!/bin/sh
# cli_dcp_to_ds.sh ZCKPT FIXTURES: `zckpt reshard DCP OUT` (to DeepSpeed) on the real torch
# Distributed Checkpoints of tests/fixtures/dcp. The fp32 masters it writes are the DCP's
# weights cast up exactly: the consolidation of OUT equals, byte for byte, that of the DCP
# with --dtype fp32 (a bf16 model, an Accelerate save_state). Tied weights are one param and
# its alias; the world size defaults to the ranks that saved the DCP, the stage to 3; the
# dtype of the DeepSpeed run is the DCP's unless --to-dtype says otherwise. (DeepSpeed
# itself loading what it writes: tests/interop/interop_dcp_to_ds.py.)
set -u
BIN=$1
D=$2/dcp
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for c in llama_untied_w2_bf16 accelerate_untied_w2_fp32; do
  "$BIN" reshard -q "$D/$c" "$T/$c.ds" --to-stage 2 --to-world-size 3 2>"$T/err" || fail "$c: reshard: $(cat "$T/err")"
  "$BIN" consolidate -q "$T/$c.ds" "$T/$c.a" 2>"$T/err" || fail "$c: consolidate of OUT: $(cat "$T/err")"
  "$BIN" consolidate -q "$D/$c" "$T/$c.b" --dtype fp32 2>"$T/err" || fail "$c: consolidate of the DCP: $(cat "$T/err")"
  cmp -s "$T/$c.a/model.safetensors" "$T/$c.b/model.safetensors" || fail "$c: OUT's fp32 weights are not the DCP's"
done

"$BIN" reshard -q "$D/llama_tied_w2_fp32" "$T/tied" --to-world-size 3 2>"$T/err" || fail "tied: $(cat "$T/err")"
"$BIN" inspect "$T/tied" >"$T/out" 2>&1 || fail "tied: inspect: $(cat "$T/out")"
grep -q "ZeRO-3 checkpoint, tag global_step3, world size 3" "$T/out" || fail "tied: not ZeRO-3 at W=3, step 3: $(head -2 "$T/out")"
grep -q "^lm_head.weight .*tied to model.embed_tokens.weight" "$T/out" || fail "tied: lm_head.weight is not an alias: $(cat "$T/out")"

"$BIN" reshard -q "$D/llama_tied_w3_bf16mp" "$T/mp" --to-stage 2 2>"$T/err" || fail "bf16mp: $(cat "$T/err")"
"$BIN" inspect "$T/mp" >"$T/out" 2>&1 || fail "bf16mp: inspect: $(cat "$T/out")"
grep -q "world size 3" "$T/out" || fail "bf16mp: the default world size is not the DCP's 3: $(head -1 "$T/out")"
grep -q "lp float32" "$T/out" || fail "bf16mp: fp32 weights do not make an fp32 run by default: $(sed -n 2p "$T/out")"
"$BIN" reshard -q "$D/llama_tied_w3_bf16mp" "$T/mp16" --to-stage 2 --to-dtype bf16 2>"$T/err" || fail "bf16mp --to-dtype: $(cat "$T/err")"
"$BIN" inspect "$T/mp16" >"$T/out" 2>&1 || fail "bf16mp --to-dtype: inspect: $(cat "$T/out")"
grep -q "lp bfloat16, master float32" "$T/out" || fail "--to-dtype bf16: $(sed -n 2p "$T/out")"

# --to-format deepspeed alone: every default (stage 3, the DCP's 2 ranks), the same bytes
"$BIN" reshard -q "$D/llama_tied_w2_fp32" "$T/named" --to-format deepspeed 2>"$T/err" || fail "--to-format deepspeed: $(cat "$T/err")"
"$BIN" inspect "$T/named" >"$T/out" 2>&1 || fail "named: inspect: $(cat "$T/out")"
grep -q "ZeRO-3 checkpoint, tag global_step3, world size 2" "$T/out" || fail "named: not the defaults: $(head -1 "$T/out")"
"$BIN" reshard -q "$D/llama_tied_w2_fp32" "$T/explicit" --to-stage 3 --to-world-size 2 2>"$T/err" || fail "explicit: $(cat "$T/err")"
diff -r "$T/named" "$T/explicit" >/dev/null || fail "--to-format deepspeed differs from --to-stage 3 --to-world-size 2"
"$BIN" reshard -q "$D/llama_tied_w2_fp32" "$T/x" 2>"$T/err" && fail "reshard with no target option accepted"
grep -q "give --to-stage" "$T/err" || fail "no target option: $(cat "$T/err")"

# options that do not apply to a DCP: one line, exit 2 (usage) or 1, nothing written
"$BIN" reshard -q "$D/llama_tied_w2_fp32" "$T/x" --to-stage 2 --tag global_step3 2>"$T/err" && fail "--tag accepted"
grep -q "no tags" "$T/err" || fail "--tag: $(cat "$T/err")"
"$BIN" reshard -q "$T/tied" "$T/x" --to-stage 2 --to-dtype bf16 2>"$T/err" && fail "--to-dtype accepted for DeepSpeed"
grep -q "only for a torch Distributed Checkpoint" "$T/err" || fail "--to-dtype: $(cat "$T/err")"
"$BIN" reshard -q "$D/llama_tied_w2_fp32" "$T/x" --to-stage 2 --to-dtype fp16 2>"$T/err" && fail "--to-dtype fp16 accepted"
grep -q "loss scaler" "$T/err" || fail "--to-dtype fp16: $(cat "$T/err")"
# an HF Trainer checkpoint-N whose scheduler.pt (the target's lr_scheduler) cannot be read
cp -r "$D/hf_trainer_tied_w2_fp32/checkpoint-2" "$T/hf"
truncate -s 100 "$T/hf/scheduler.pt"
"$BIN" reshard -q "$T/hf" "$T/x" --to-stage 2 2>"$T/err" && fail "a damaged scheduler.pt accepted"
[ "$(grep -c . "$T/err")" -eq 1 ] && grep -q "scheduler.pt" "$T/err" || fail "damaged scheduler.pt: $(cat "$T/err")"
[ ! -e "$T/x" ] || fail "a refused reshard left OUT"
echo ok
