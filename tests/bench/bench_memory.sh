#!/usr/bin/env bash
# bench_memory.sh: the README's model-state memory table, measured.
#
# Runs zckpt-train one bf16 step of a GPT-2 L=6 C=384 (10.8 M params) with HF "auto"
# buckets for ZeRO stages 1-3 x W 1,2,4,8 (rank threads) and prints each run's
# "peak model-state memory per rank" in MiB, beside the ZeRO paper's model-state figure
# (K = 12: (2+2+K)N/W by stage) and DeepSpeed's estimate_zero{2,3}_model_states_mem_needs
# (the per-GPU figure, offload off, largest layer = one transformer block).
# Stage 3 is run twice: with DeepSpeed's residency defaults (stage3_param_persistence_threshold
# "auto" = 10 x hidden, stage3_max_reuse_distance 1e9: a model this small stays gathered
# once fetched, as it does in DeepSpeed) and with both set to 0 (every tensor released
# after use: ZeRO-3's per-module memory).
# Usage: tests/bench/bench_memory.sh [BUILD_DIR]   (default: build)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
train=$build/bin/zckpt-train
[ -x "$train" ] || { echo "bench_memory: $train not built" >&2; exit 1; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT

config() { # stage residency(default|off)
  local z="\"stage\": $1, \"reduce_bucket_size\": \"auto\""
  if [ "$1" = 3 ]; then
    z="$z, \"stage3_prefetch_bucket_size\": \"auto\""
    if [ "$2" = off ]; then z="$z, \"stage3_param_persistence_threshold\": 0, \"stage3_max_reuse_distance\": 0"
    else z="$z, \"stage3_param_persistence_threshold\": \"auto\""; fi
  fi
  printf '{"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {%s}}\n' "$z"
}

peak() { # stage W residency
  config "$1" "$3" >"$T/ds.json"
  "$train" --n-layer 6 --n-embd 384 --n-head 6 --max-steps 1 --bf16 --ranks "$2" --deepspeed "$T/ds.json" 2>&1 |
    sed -n 's/^peak model-state memory per rank: \([0-9.]*\) MiB.*/\1/p'
}

N=10770432 # the model's parameters (printed by zckpt-train)
L=$((12 * 384 * 384 + 13 * 384)) # its largest layer: a transformer block (the unit the engine gathers)
paper() { awk -v s="$1" -v w="$2" -v n=$N 'BEGIN { k = 12; m = (s == 1) ? (4 * n + k * n / w) : (s == 2) ? (2 * n + (2 + k) * n / w) : ((4 + k) * n / w); printf "%.1f", m / 1048576 }'; }
# deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs (gpu, no offload): 2N + 18N/W
# deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs (gpu, no offload): 4L + 18N/W
estimate() { awk -v s="$1" -v w="$2" -v n=$N -v l=$L 'BEGIN { if (s == 1) { printf "-"; exit } m = (s == 2) ? (2 * n + 18 * n / w) : (4 * l + 18 * n / w); printf "%.1f", m / 1048576 }'; }

echo "| stage | W=1 | W=2 | W=4 | W=8 |"
echo "|---|---|---|---|---|"
for row in "1 default" "2 default" "3 default" "3 off"; do
  set -- $row
  label=$1; [ "$1" = 3 ] && label="3 (residency $2)"
  line="| $label |"
  for w in 1 2 4 8; do line="$line $(peak "$1" "$w" "$2") / $(paper "$1" "$w") / $(estimate "$1" "$w") |"; done
  echo "$line"
done
