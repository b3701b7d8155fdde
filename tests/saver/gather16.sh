#!/usr/bin/env bash
# gather16.sh TRAIN ZCKPT: with stage3_gather_16bit_weights_on_model_save, each save's
# model.safetensors (written from every rank's partitions by one copy plan) holds exactly
# the 16-bit weights: the same tensors, bit for bit, as consolidating the DeepSpeed
# checkpoint with --dtype bf16 (RNE of the fp32 masters; frozen params as saved).
set -euo pipefail
train="$1"; zckpt="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
n=0
for ranks in 1 3 4; do
  for sub in 1000000000 3000; do
    cat >"$tmp/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
 "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true, "sub_group_size": $sub}}
JSON
    rm -rf "$tmp/run" "$tmp/g" "$tmp/k" "$tmp/c"
    "$train" --deepspeed "$tmp/ds.json" --output-dir "$tmp/run" --max-steps 3 --save-steps 3 --ranks $ranks --bf16 \
      --freeze transformer.wpe --quiet --n-layer 1 --n-embd 32 --n-head 2 --n-positions 32
    ck="$tmp/run/checkpoint-3"
    test -s "$ck/model.safetensors"
    "$zckpt" consolidate -q --dtype bf16 "$ck" "$tmp/c"
    # one file name for both: a .pt names its archive folder after the file (as torch.save)
    mkdir -p "$tmp/g" "$tmp/k"
    "$zckpt" convert -q "$ck/model.safetensors" "$tmp/g/model.pt"
    "$zckpt" convert -q "$tmp/c/model.safetensors" "$tmp/k/model.pt"
    cmp "$tmp/g/model.pt" "$tmp/k/model.pt"
    n=$((n + 1))
  done
done
echo "$n passed, 0 failed"
