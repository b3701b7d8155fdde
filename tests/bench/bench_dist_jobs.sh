#!/usr/bin/env bash
# bench_dist_jobs.sh: the offline jobs under mpirun at N = 1, 2 and 4 ranks on this host.
# One synthetic ZeRO checkpoint (make_big_ckpt, bf16, 4 rank files) made in the same run;
# for each job and N: the job's wall time (mpirun included) and, per rank, the bytes it
# read (/proc/self/io rchar: every read call, page cache included, metadata and MPI's own
# reads too) and its time in the job, from ZCK_DIST_TRACE=1. Warm cache (the checkpoint
# is read once before), best of REPEAT runs: on one host the ranks share the same disk
# and cores, so the point is the split (each rank reads ~1/N of the data, every byte once
# in all) and the cost of the agreement, not a speed-up. Across nodes each rank reads
# from its node's link or local disk, so the aggregate read bandwidth is the sum of the
# nodes' (README: "Across machines").
#
# usage: tests/bench/bench_dist_jobs.sh [PARAMS] [WORKDIR]   PARAMS default 5e7
#        ZCK_BUILD=build (an MPI build); REPEAT=2; NPS="1 2 4"
# Not run by ctest (label bench); needs mpirun (scripts/deps.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
params=${1:-5e7}
work=${2:-/tmp/zckpt-bench-dist}
bin=${ZCK_BUILD:-build}/bin
repeat=${REPEAT:-2}
nps=${NPS:-"1 2 4"}
command -v mpirun >/dev/null || { echo "bench_dist_jobs: mpirun not installed" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$work"; mkdir -p "$work"
"$bin/make_big_ckpt" "$work/ckpt" --params "$params" --world 4 --stage 2 >/dev/null
total=$(du -sb "$work/ckpt" | cut -f1)
cat "$work"/ckpt/*/* >/dev/null
now() { date +%s.%N; }

run_job() { # np label out args...: prints "label np wall" and one line per rank
  local np=$1 label=$2 out=$3; shift 3
  local best="" best_log=""
  for _ in $(seq "$repeat"); do
    rm -rf "$out"
    local t0 t1 wall
    t0=$(now)
    if [ "$np" = 1 ]; then
      ZCK_DIST_TRACE=1 "$bin/zckpt" "$@" >/dev/null 2>"$work/log" || { echo "$label -np $np failed:"; tail -3 "$work/log"; exit 1; }
    else
      ZCK_DIST_TRACE=1 mpirun -np "$np" "$bin/zckpt" "$@" >/dev/null 2>"$work/log" || {
        echo "$label -np $np failed:"; tail -3 "$work/log"; exit 1; }
    fi
    t1=$(now)
    wall=$(echo "$t1 - $t0" | bc -l)
    if [ -z "$best" ] || [ "$(echo "$wall < $best" | bc -l)" = 1 ]; then best=$wall; best_log=$(cat "$work/log"); fi
  done
  rm -rf "$out"
  printf '%-14s -np %s  wall %7.2f s |' "$label" "$np" "$best"
  echo "$best_log" | sed -n 's/^zckpt: rank \([0-9]*\): read \([0-9]*\) bytes, \([0-9.]*\) s in the job$/\1 \2 \3/p' | sort -n |
    while read -r r bytes secs; do printf ' r%s %6.1f MB %6.2f s' "$r" "$(echo "$bytes / 1048576" | bc -l)" "$secs"; done
  echo
}

printf '# %s params, ZeRO-2 bf16, 4 rank files, %.1f MB on disk; %d cores, load %s\n' "$params" \
  "$(echo "$total / 1048576" | bc -l)" "$(nproc)" "$(cut -d' ' -f1 /proc/loadavg)"
echo "# per rank: MB read (rchar) and seconds in the job; warm cache, best of $repeat"
for np in $nps; do run_job "$np" consolidate "$work/st" consolidate -q "$work/ckpt" "$work/st"; done
for np in $nps; do run_job "$np" reshard "$work/rs" reshard -q --to-world-size 2 "$work/ckpt" "$work/rs"; done
for np in $nps; do run_job "$np" verify "$work/none" verify -q "$work/ckpt"; done
rm -rf "$work"
