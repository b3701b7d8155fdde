#!/usr/bin/env bash
# bench_train_procs.sh: step time before and after a checkpoint save, with one process per
# rank under mpirun (the MPI backend), beside the same run with rank threads.
#
# Issue 16's regression: with the former tcp backend, after the first sharded save of a
# `--nproc 4` ZeRO-3 run every step took about 3x longer, ranks 1-3 burning ~3.8x the
# CPU-seconds per step. Here each run saves every SAVE steps; the steps whose interval
# holds no save are split into those before the first save and those after it, and the
# row shows the median wall ms/step (rank 0's log) and the median CPU-seconds per step of
# each rank process (from /proc, sampled at each step line) for both, and their ratio.
# The step time after a save must equal the one before it (ratio ~1.0).
#
# Usage: tests/bench/bench_train_procs.sh [BUILD_DIR] [W] [STEPS] [SAVE]
#        (default: build 4 10 3; model GPT-2 L=2 C=512, bf16, ZeRO-3)
# Not run by ctest (label bench); needs mpirun (scripts/deps.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$here/build}
W=${2:-4}; STEPS=${3:-10}; SAVE=${4:-3}
train=$build/bin/zckpt-train
[ -x "$train" ] || { echo "bench_train_procs: $train not built" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "bench_train_procs: mpirun not installed" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
A=(--n-layer 2 --n-embd 512 --n-head 8 --n-positions 64 --per-device-train-batch-size 1 --eval-samples 1
   --logging-steps 1 --bf16 --zero-stage 3 --max-steps "$STEPS" --save-steps "$SAVE")
hz=$(getconf CLK_TCK)

# CPU seconds (utime + stime) of each process whose command line holds $1, pid order
cpu_of() {
  local p
  for p in $(pgrep -f -- "$1" | sort -n); do
    [ -r "/proc/$p/stat" ] || continue
    [ "$(tr '\0' ' ' <"/proc/$p/cmdline" | cut -d' ' -f1)" = "$train" ] || continue
    awk -v hz="$hz" '{ sub(/^.*\) /, ""); printf "%.3f ", ($12 + $13) / hz }' "/proc/$p/stat"
  done
}

# run MODE: prints "STEP WALL_MS CPU_RANK0 CPU_RANK1 ..." (CPU since the previous step line)
run() {
  local mode=$1 out="$T/out-$1" prev="" line step ms cur
  rm -rf "$out"
  if [ "$mode" = procs ]; then
    mpirun --oversubscribe -np "$W" "$train" "${A[@]}" --output-dir "$out" 2>&1 >/dev/null
  else
    "$train" "${A[@]}" --ranks "$W" --output-dir "$out" 2>&1 >/dev/null
  fi | while IFS= read -r line; do
    [[ "$line" =~ ^step\ ([0-9]+)/[0-9]+\ .*\|\ ([0-9.]+)\ ms/step ]] || continue
    step=${BASH_REMATCH[1]}; ms=${BASH_REMATCH[2]}
    cur=$(cpu_of "$out")
    echo "$step $ms $(awk -v a="$prev" -v b="$cur" 'BEGIN { n = split(b, B, " "); split(a, P, " ");
      for (i = 1; i <= n; i++) printf "%.3f ", B[i] - (i in P ? P[i] : 0) }')"
    prev=$cur
  done
}

# the row: medians over the save-free steps before the first save and after it
row() {
  awk -v save="$SAVE" -v label="$1" '
    function median(v, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
    # step s holds a save when s - 1 is a multiple of save (its interval follows that save)
    $1 > 1 && ($1 - 1) % save != 0 {
      after = $1 > save; k = after ? ++na : ++nb
      if (after) wa[k] = $2; else wb[k] = $2
      for (r = 3; r <= NF; r++) { if (after) ca[r, k] = $r; else cb[r, k] = $r }
      nr = NF
    }
    END {
      mb = median(wb, nb); ma = median(wa, na)
      printf "%-22s wall ms/step before %8.0f after %8.0f (x%.2f) | CPU s/step per rank", label, mb, ma, ma / mb
      for (r = 3; r <= nr; r++) {
        for (k = 1; k <= nb; k++) xb[k] = cb[r, k]; for (k = 1; k <= na; k++) xa[k] = ca[r, k]
        b = median(xb, nb); a = median(xa, na)
        printf " %d: %.2f->%.2f", r - 3, b, a
      }
      printf "\n"
    }'
}

echo "GPT-2 L=2 C=512 bf16 ZeRO-3, W=$W, $STEPS steps, a save every $SAVE ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
run procs >"$T/procs.txt"
row "mpirun -np $W" <"$T/procs.txt"
run threads >"$T/threads.txt"
row "--ranks $W (threads)" <"$T/threads.txt"
