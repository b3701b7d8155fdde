#!/usr/bin/env bash
# The main job on an embedded default: installs what is missing, builds zckpt, trains a
# small GPT-2 to add two numbers with ZeRO-3 on 4 CPU ranks (bf16, one frozen parameter,
# decay/no-decay groups) saving DeepSpeed checkpoints in the HF Trainer layout, then
# consolidates the last checkpoint into safetensors and reshards it to ZeRO-2 on 2 ranks; checks that the
# resharded checkpoint consolidates to the same bytes. Output goes to ./demo-out/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
bin=build/bin
out=${1:-demo-out}
rm -rf "$out"
mkdir -p "$out"
steps=2400
echo "== training: GPT-2 (HF names), ZeRO-3 on 4 ranks, bf16, saving every $((steps / 2)) steps"
echo "   corpus: lines 'a+b=c' with random a, b in [0, 100), each sum c written least-significant"
echo "   digit first (12+9=12 for 21: the order in which a left-to-right model can carry);"
echo "   everything printed below shows sums the usual way round"
start=$SECONDS
"$bin/zckpt-train" --output-dir "$out/run" --max-steps $steps --ranks 4 --zero-stage 3 --bf16 \
  --learning-rate 3e-3 --lr-scheduler-type cosine --warmup-steps 50 --reverse-sums \
  --save-steps $((steps / 2)) --save-total-limit 2 --logging-steps 400 --eval-steps $((steps / 2)) \
  --load-best-model-at-end --freeze transformer.ln_f.bias --weight-decay 0.01 --generate-tokens 24 \
  --prompt $'\n12+7=' --eval-sums 100 2>&1 | tee "$out/train.log"
echo "   (training took $((SECONDS - start)) s)"
# what was learned, in numbers: an untrained model guesses each of the 256 byte values
# alike (ln 256 = 5.55 nats per byte); the operands are random, so even a model that adds
# perfectly pays about 1 nat per byte for them
final=$(sed -n 's/^final eval_loss //p' "$out/train.log")
sums=$(sed -n 's/^held-out sums: \([0-9]*\/[0-9]*\) right.*/\1/p' "$out/train.log")
echo "== learned: eval loss $final nats/byte, from 5.55 untrained (ln 256); $sums held-out"
echo "   sums (prompts 'a+b=' whose line the model never saw) came out right, examples above"
ckpt="$out/run/checkpoint-$steps"
echo "== inspect $ckpt"
"$bin/zckpt" inspect "$ckpt" | head -8
echo "== consolidate -> $out/model (safetensors, as zero_to_fp32 would)"
"$bin/zckpt" consolidate "$ckpt" "$out/model"
ls -l "$out/model"
echo "== reshard ZeRO-3 x4 -> ZeRO-2 x2 -> $out/resharded"
"$bin/zckpt" reshard --to-stage 2 --to-world-size 2 "$ckpt" "$out/resharded"
"$bin/zckpt" inspect "$out/resharded" | head -3
"$bin/zckpt" consolidate "$out/resharded" "$out/model-from-resharded"
cmp "$out/model/model.safetensors" "$out/model-from-resharded/model.safetensors"
echo "== the resharded checkpoint holds exactly the same weights"
