#!/usr/bin/env bash
# bench_save_gather.sh: the rank-by-rank ZeRO-3 --save-only-model save alone (the 16-bit
# model.safetensors gathered from the ranks' partitions, saver/gather16_ranks.c), one
# process per rank under mpirun, this build beside another one (BEFORE) in the same run.
#
# Each run trains GPT-2 L=8 C=1024 (101M params, T=8 so that a step is short) for SAVES
# steps with a save after every one; an LD_PRELOAD shim (save_clock.c) times each save
# from rank 0's mkdir of its temporary folder to the rename that commits it, and rank 0's
# CPU time (all its threads) over that span. The builds' runs alternate (before, after,
# before, ...) so that both see the same load; the rows give the median wall and CPU time
# of a save for each, their ratio, and the load average before and after.
#
# Usage: tests/bench/bench_save_gather.sh BUILD_DIR BEFORE_BUILD_DIR [W] [RUNS] [SAVES]
#        (default: W 2, 3 runs each, 5 saves a run)
# Not run by ctest (label bench); needs mpirun and a C compiler (for the shim).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: bench_save_gather.sh BUILD_DIR BEFORE_BUILD_DIR [W] [RUNS] [SAVES]}
before=${2:?usage: bench_save_gather.sh BUILD_DIR BEFORE_BUILD_DIR [W] [RUNS] [SAVES]}
W=${3:-2}; RUNS=${4:-3}; SAVES=${5:-5}
for b in "$build" "$before"; do
  [ -x "$b/bin/zckpt-train" ] || { echo "bench_save_gather: $b/bin/zckpt-train not built" >&2; exit 1; }
done
command -v mpirun >/dev/null || { echo "bench_save_gather: mpirun not installed" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cc -O2 -shared -fPIC -o "$T/save_clock.so" "$here/tests/bench/save_clock.c" -ldl
A=(--n-layer 8 --n-embd 1024 --n-head 8 --n-positions 8 --per-device-train-batch-size 1 --eval-samples 1
   --bf16 --zero-stage 3 --save-only-model --max-steps "$SAVES" --save-steps 1 --save-total-limit 1 --quiet)

# run BUILD LOG: one training run whose saves' milliseconds are appended to LOG
run() {
  rm -rf "$T/out"
  mpirun --oversubscribe -np "$W" -x LD_PRELOAD="$T/save_clock.so" -x SAVE_CLOCK_LOG="$2" \
    "$1/bin/zckpt-train" "${A[@]}" --output-dir "$T/out" >/dev/null
}

load0=$(cut -d' ' -f1 /proc/loadavg)
for ((i = 0; i < RUNS; i++)); do
  run "$before" "$T/before.txt"
  run "$build" "$T/after.txt"
done
load1=$(cut -d' ' -f1 /proc/loadavg)

# med FILE COLUMN: the median of a column of the shim's lines
med() { awk -v c="$2" '{ print $c }' "$1" | sort -n | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
nb=$(wc -l <"$T/before.txt"); na=$(wc -l <"$T/after.txt")
echo "GPT-2 L=8 C=1024 (101M params) bf16 ZeRO-3 --save-only-model, mpirun -np $W ($(nproc) cores, load $load0 -> $load1)"
for col in 2 4; do
  awk -v mb="$(med "$T/before.txt" $col)" -v ma="$(med "$T/after.txt" $col)" -v nb="$nb" -v na="$na" -v col=$col 'BEGIN {
    printf "save, %-17s median ms before %7.0f (%d saves) after %7.0f (%d saves) (x%.2f)\n",
      col == 2 ? "wall (mkdir-rename)" : "rank 0 CPU", mb, nb, ma, na, ma / mb }'
done
echo "  wall before: $(awk '{ printf "%.0f ", $2 }' "$T/before.txt")"
echo "  wall after:  $(awk '{ printf "%.0f ", $2 }' "$T/after.txt")"
