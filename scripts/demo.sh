#!/usr/bin/env bash
# The main job on an embedded default: installs what is missing, builds zckpt, trains a
# small GPT-2 with ZeRO-3 on 4 CPU ranks (bf16, one frozen parameter, decay/no-decay
# groups) saving DeepSpeed checkpoints in the HF Trainer layout, then consolidates the
# last checkpoint into safetensors and reshards it to ZeRO-2 on 2 ranks; checks that the
# resharded checkpoint consolidates to the same bytes. Output goes to ./demo-out/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
bin=build/bin
out=${1:-demo-out}
rm -rf "$out"
echo "== training: GPT-2 (HF names), ZeRO-3 on 4 ranks, bf16, saving every 50 steps"
"$bin/zckpt-train" --output-dir "$out/run" --max-steps 100 --ranks 4 --zero-stage 3 --bf16 \
  --save-steps 50 --save-total-limit 2 --logging-steps 25 --eval-steps 50 --load-best-model-at-end \
  --freeze transformer.wpe --weight-decay 0.01 --generate-tokens 12 --prompt "12+7="
ckpt="$out/run/checkpoint-100"
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
