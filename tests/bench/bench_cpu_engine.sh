#!/usr/bin/env bash
# bench_cpu_engine.sh: a ZeRO-3 fp32 GPT-2 training step on the CPU, side by side in one run:
#   - zckpt-train with its own loops (ZCKPT_TRAIN_NO_BLAS=1: the engine before OpenBLAS);
#   - zckpt-train with OpenBLAS (one BLAS thread per rank);
#   - torch + DeepSpeed 0.19 (ZeRO-3, gloo, torch AdamW, OMP_NUM_THREADS=1 per rank) on the
#     same model: transformers' GPT2LMHeadModel with the engine's sizes (byte vocabulary).
# Each row: the median ms/step over the steps after the first (start-up and the first
# gathers excluded), the first and last training loss, and the ratio to DeepSpeed's step.
# The losses are not comparable across rows (different data and init); the engine's two
# rows train the same data from the same init and must agree within fp32 tolerance.
#
# Usage: tests/bench/bench_cpu_engine.sh [BUILD_DIR] [W] [STEPS] [L] [C] [T] [B]
#        (default: build 2 6 2 768 64 4: GPT-2 small's width and heads, 2 blocks)
# Not run by ctest (label bench); needs the interop Python (tests/interop/find_python.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
W=${2:-2}; STEPS=${3:-6}; L=${4:-2}; C=${5:-768}; T=${6:-64}; B=${7:-4}
H=$((C / 64))
train=$build/bin/zckpt-train
[ -x "$train" ] || { echo "bench_cpu_engine: $train not built" >&2; exit 1; }
py=${ZCK_PYTHON:-${XDG_CACHE_HOME:-$HOME/.cache}/zckpt/interop-venv/bin/python}
"$py" -c "import torch, deepspeed, transformers" 2>/dev/null \
  || { echo "bench_cpu_engine: no interop Python with torch, deepspeed, transformers ($py)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# median of the numbers on stdin
median() { sort -n | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# engine ROWNAME [ENV=VAL]: prints "ms/step first_loss last_loss" from rank 0's progress lines
engine() {
  local log=$tmp/$1.log; shift
  env "$@" "$train" --ranks "$W" --zero-stage 3 --n-layer "$L" --n-embd "$C" --n-head "$H" --n-positions "$T" \
    --per-device-train-batch-size "$B" --max-steps "$STEPS" --logging-steps 1 --eval-samples 1 \
    --warmup-steps 0 2>"$log" >/dev/null
  local ms first last
  ms=$(sed -n 's/^step \([0-9]*\)\/.*| \([0-9.]*\) ms\/step$/\1 \2/p' "$log" | awk '$1 > 1 { print $2 }' | median)
  first=$(sed -n 's/^step 1\/.*| loss \([0-9.]*\) .*/\1/p' "$log")
  last=$(sed -n "s/^step $STEPS\/.*| loss \([0-9.]*\) .*/\1/p" "$log")
  echo "$ms $first $last"
}

cat >"$tmp/ds_rank.py" <<'EOF'
import os, sys, time
import torch, deepspeed, transformers
L, C, H, T, B, steps = map(int, sys.argv[1:7])
deepspeed.init_distributed(dist_backend="gloo")
rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
torch.manual_seed(42)
cfg = transformers.GPT2Config(vocab_size=256, n_positions=T, n_embd=C, n_layer=L, n_head=H,
                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = transformers.GPT2LMHeadModel(cfg)
ds_config = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 1,
             "gradient_clipping": 1.0, "zero_optimization": {"stage": 3},
             "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9}
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config)
g = torch.Generator().manual_seed(1 + rank)
for s in range(1, steps + 1):
    x = torch.randint(0, 256, (B, T), generator=g)
    t0 = time.perf_counter()
    loss = engine(x, labels=x).loss
    engine.backward(loss)
    engine.step()
    torch.distributed.barrier()
    ms = (time.perf_counter() - t0) * 1e3
    if rank == 0:
        print(f"step {s} loss {loss.item():.6f} ms {ms:.1f}", flush=True)
torch.distributed.barrier()
sys.stdout.flush()
os._exit(0)
EOF

# deepspeed: prints "ms/step first_loss last_loss"
ds() {
  (cd "$here/tests/fixtures/gen" && "$py" -c "
import sys
from ds_launch import launch
sys.exit(launch($W, sys.argv[1:], log_prefix='$tmp/ds'))" "$tmp/ds_rank.py" "$L" "$C" "$H" "$T" "$B" "$STEPS") \
    >/dev/null 2>&1 || { echo "bench_cpu_engine: DeepSpeed run failed:" >&2; tail -20 "$tmp/ds.rank0.log" >&2; exit 1; }
  local log=$tmp/ds.rank0.log
  echo "$(awk '/^step / && $2 > 1 { print $6 }' "$log" | median) $(awk '/^step 1 / { print $4 }' "$log") \
$(awk -v s="$STEPS" '/^step / && $2 == s { print $4 }' "$log")"
}

echo "GPT-2 L=$L C=$C H=$H T=$T vocab=256, ZeRO-3 fp32, W=$W ranks x B=$B, $STEPS steps ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
read -r ms_ds l1_ds ln_ds < <(ds)
read -r ms_loops l1_loops ln_loops < <(engine loops ZCKPT_TRAIN_NO_BLAS=1)
read -r ms_blas l1_blas ln_blas < <(engine blas ZCKPT_TRAIN_NO_BLAS=0)
row() { awk -v n="$1" -v ms="$2" -v a="$3" -v b="$4" -v ref="$ms_ds" \
  'BEGIN { printf "%-32s %9.0f ms/step  x%5.2f of DeepSpeed  loss %s -> %s\n", n, ms, ms / ref, a, b }'; }
row "torch + DeepSpeed (ZeRO-3)" "$ms_ds" "$l1_ds" "$ln_ds"
row "zckpt-train, loops" "$ms_loops" "$l1_loops" "$ln_loops"
row "zckpt-train, OpenBLAS" "$ms_blas" "$l1_blas" "$ln_blas"
awk -v a="$ms_loops" -v b="$ms_blas" 'BEGIN { printf "OpenBLAS speed-up over the loops: x%.2f\n", a / b }'
