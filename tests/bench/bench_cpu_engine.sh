#!/usr/bin/env bash
# bench_cpu_engine.sh: a ZeRO-3 fp32 GPT-2 training step on the CPU, side by side in one run:
#   - zckpt-train with its own loops (ZCKPT_TRAIN_NO_BLAS=1: the engine before OpenBLAS);
#   - zckpt-train with OpenBLAS (one BLAS thread per rank);
#   - torch + DeepSpeed 0.19 (ZeRO-3, gloo, torch AdamW, OMP_NUM_THREADS=1 per rank) on the
#     same model: transformers' GPT2LMHeadModel with the engine's sizes (byte vocabulary).
# The machine is shared and its load moves by 2-5x within minutes, so the three runs are
# repeated ROUNDS times, interleaved, and each row shows its fastest step after the first
# (start-up and the first gathers excluded; the least disturbed by other jobs) and, for
# reference, its median step over all rounds, the first and last training loss of its
# last round, and the ratio of its fastest step to DeepSpeed's.
# The losses are not comparable across rows (different data and init); the engine's two
# rows train the same data from the same init and must agree within fp32 tolerance.
#
# Usage: tests/bench/bench_cpu_engine.sh [BUILD_DIR] [W] [STEPS] [L] [C] [T] [B] [ROUNDS]
#        (default: build 2 6 2 768 64 4 2: GPT-2 small's width and heads, 2 blocks)
# Not run by ctest (label bench); needs the interop Python (tests/interop/find_python.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
W=${2:-2}; STEPS=${3:-6}; L=${4:-2}; C=${5:-768}; T=${6:-64}; B=${7:-4}; ROUNDS=${8:-2}
H=$((C / 64))
train=$build/bin/zckpt-train
[ -x "$train" ] || { echo "bench_cpu_engine: $train not built" >&2; exit 1; }
py=${ZCK_PYTHON:-${XDG_CACHE_HOME:-$HOME/.cache}/zckpt/interop-venv/bin/python}
"$py" -c "import torch, deepspeed, transformers" 2>/dev/null \
  || { echo "bench_cpu_engine: no interop Python with torch, deepspeed, transformers ($py)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# "min median" of the numbers on stdin
minmed() { sort -n | awk '{ v[NR] = $1 } END { print v[1], NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# engine ROWNAME [ENV=VAL]: appends its step times (after the first) to $tmp/ROWNAME.ms and
# leaves "first_loss last_loss" in $tmp/ROWNAME.loss, from rank 0's progress lines
engine() {
  local name=$1 log=$tmp/$1.log; shift
  env "$@" "$train" --ranks "$W" --zero-stage 3 --n-layer "$L" --n-embd "$C" --n-head "$H" --n-positions "$T" \
    --per-device-train-batch-size "$B" --max-steps "$STEPS" --logging-steps 1 --eval-samples 1 \
    --warmup-steps 0 2>"$log" >/dev/null
  sed -n 's/^step \([0-9]*\)\/.*| \([0-9.]*\) ms\/step$/\1 \2/p' "$log" | awk '$1 > 1 { print $2 }' >>"$tmp/$name.ms"
  echo "$(sed -n 's/^step 1\/.*| loss \([0-9.]*\) .*/\1/p' "$log") \
$(sed -n "s/^step $STEPS\/.*| loss \([0-9.]*\) .*/\1/p" "$log")" >"$tmp/$name.loss"
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

# ds: as engine, for the row "ds"
ds() {
  (cd "$here/tests/fixtures/gen" && "$py" -c "
import sys
from ds_launch import launch
sys.exit(launch($W, sys.argv[1:], log_prefix='$tmp/ds'))" "$tmp/ds_rank.py" "$L" "$C" "$H" "$T" "$B" "$STEPS") \
    >/dev/null 2>&1 || { echo "bench_cpu_engine: DeepSpeed run failed:" >&2; tail -20 "$tmp/ds.rank0.log" >&2; exit 1; }
  local log=$tmp/ds.rank0.log
  awk '/^step / && $2 > 1 { print $6 }' "$log" >>"$tmp/ds.ms"
  echo "$(awk '/^step 1 / { print $4 }' "$log") $(awk -v s="$STEPS" '/^step / && $2 == s { print $4 }' "$log")" \
    >"$tmp/ds.loss"
}

echo "GPT-2 L=$L C=$C H=$H T=$T vocab=256, ZeRO-3 fp32, W=$W ranks x B=$B, $STEPS steps x $ROUNDS rounds" \
  "($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg) at the start)"
for ((r = 0; r < ROUNDS; r++)); do
  ds
  engine loops ZCKPT_TRAIN_NO_BLAS=1
  engine blas ZCKPT_TRAIN_NO_BLAS=0
done
echo "(load $(cut -d' ' -f1 /proc/loadavg) at the end)"
read -r min_ds med_ds < <(minmed <"$tmp/ds.ms")
row() {
  local min med
  read -r min med < <(minmed <"$tmp/$2.ms")
  awk -v n="$1" -v min="$min" -v med="$med" -v ref="$min_ds" -v l="$(cat "$tmp/$2.loss")" \
    'BEGIN { split(l, L, " "); printf "%-28s fastest %6.0f ms/step (median %6.0f)  x%5.2f of DeepSpeed  loss %s -> %s\n",
             n, min, med, min / ref, L[1], L[2] }'
}
row "torch + DeepSpeed (ZeRO-3)" ds
row "zckpt-train, loops" loops
row "zckpt-train, OpenBLAS" blas
awk -v a="$(minmed <"$tmp/loops.ms" | cut -d' ' -f1)" -v b="$(minmed <"$tmp/blas.ms" | cut -d' ' -f1)" \
  'BEGIN { printf "OpenBLAS speed-up over the loops (fastest steps): x%.2f\n", a / b }'
