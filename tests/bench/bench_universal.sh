#!/usr/bin/env bash
# bench_universal.sh: DeepSpeed's ds_to_universal.py vs zckpt to-universal (DeepSpeed
# layout and HDF5) vs zckpt reshard, on one synthetic ZeRO-3 checkpoint over 8 ranks made
# in the same run; wall time, peak RSS, files and bytes written, each against its own I/O
# floor: io_floor reading every optimizer-state byte of the checkpoint once and writing
# exactly as many bytes as that job wrote (its output's file sizes), into one file, fsync'd.
#
# Every job and its floor run REPS times (default 3), interleaved (job, floor, next job,
# ...) so background load hits both alike; the medians are reported, and the ratio is
# median(job) / median(floor); "best" is min(job) / min(floor), the spread min..max of
# the job's runs (on a shared machine the same floor varies by tens of percent); cpu is
# the median user + system seconds, steadier than the wall time under load. The page
# cache is dropped before each run (as root; the script says when it cannot, and the runs
# are then warm). CACHE=warm: the checkpoint is read into the page cache before each run
# instead (every tool reads from memory: CPU efficiency rather than the disk).
#
# usage: tests/bench/bench_universal.sh [PARAMS] [WORKDIR]   (ZCK_BUILD, ZCK_PYTHON as in
#        bench_consolidate.sh; KEEP=1 reuses WORKDIR/ckpt; REPS=n; DS_REPS=n for the slow
#        ds_to_universal.py, default REPS; DS=0 skips it; BEFORE=BUILD_DIR also runs that
#        build's zckpt, interleaved, as <job>_before: a before/after under the same load;
#        JOBS="universal_ds universal_h5 reshard" (the default) picks the zckpt jobs)
set -euo pipefail
cd "$(dirname "$0")/../.."
params=${1:-2e8}
work=${2:-/tmp/zckpt-bench-universal}
bin=${ZCK_BUILD:-build}/bin
py=${ZCK_PYTHON:-$(scripts/interop_env.sh)}   # the pinned interop venv, made when missing
threads=$(nproc)
reps=${REPS:-3}
ds_reps=${DS_REPS:-$reps}
if [ "${KEEP:-0}" = 1 ] && [ -d "$work/ckpt" ]; then find "$work" -mindepth 1 -maxdepth 1 ! -name ckpt -exec rm -rf {} +; else rm -rf "$work"; mkdir -p "$work"; fi
cache=${CACHE:-cold}
sync
if [ $cache = cold ] && ! echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then cache=warm; echo "note: cannot drop the page cache here: warm runs"; fi
drop() { sync; if [ $cache = cold ]; then echo 3 >/proc/sys/vm/drop_caches; else cat "$work"/ckpt/*/* >/dev/null; fi; }
clean() { rm -rf "$work/out" "$work/floor.bin" "$work/latest_universal"; }
# run LABEL REP cmd...: one timed run writing $work/out; appends to $work/runs
#   "LABEL REP wall_s peak_kb files bytes cpu_s" (cpu: user + system seconds)
run() {
  local label=$1 rep=$2; shift 2
  clean; drop
  /usr/bin/time -f "%e %M %U %S" -o "$work/time" "$@" >"$work/log.$label" 2>&1 || { echo "$label failed:"; tail -5 "$work/log.$label"; exit 1; }
  local wall rss user sys files bytes
  read -r wall rss user sys <"$work/time"
  if [ -d "$work/out" ]; then
    files=$(find "$work/out" -type f | wc -l)
    bytes=$(find "$work/out" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.0f", s}')
  else
    files=1; bytes=$(stat -c %s "$work/out")
  fi
  local cpu; cpu=$(echo "$user + $sys" | bc -l)
  echo "$label $rep $wall $rss $files $bytes $cpu" >>"$work/runs"
  printf '  %-26s run %d %7.2f s %7.2f s cpu %7.1f MB %5d files %6.3f GB\n' "$label" "$rep" "$wall" "$cpu" \
    "$(echo "$rss / 1024" | bc -l)" "$files" "$(echo "$bytes / 10^9" | bc -l)"
  last_bytes=$bytes
}
# job LABEL REP cmd...: the job, then its floor writing as many bytes
job() {
  local label=$1 rep=$2; shift 2
  run "$label" "$rep" "$@"
  run "floor_$label" "$rep" env FLOOR_PARTS=all $bin/io_floor "$work/ckpt" "$work/out" "$threads" "$last_bytes"
}
if [ ! -d "$work/ckpt" ]; then
  echo "== generating a ZeRO-3 checkpoint of ~$params params over 8 ranks"
  $bin/make_big_ckpt "$work/ckpt" --params "$params" --world 8
fi
echo "== $(du -sh "$work/ckpt" | cut -f1) checkpoint, $threads threads, $reps runs each ($cache cache), $(nproc) cores"
: >"$work/runs"
have_ds=0
if [ "${DS:-1}" != 0 ] && "$py" -c "import deepspeed" 2>/dev/null; then have_ds=1; fi
builds=("" ${BEFORE:+_before})
jobs=" ${JOBS:-universal_ds universal_h5 reshard} "
want() { case "$jobs" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
zbin() { if [ "$1" = _before ]; then echo "$BEFORE/bin/zckpt"; else echo "$bin/zckpt"; fi; }
for rep in $(seq 1 "$reps"); do
  for b in "${builds[@]}"; do
    if want universal_ds; then
      job zckpt_universal_ds$b "$rep" "$(zbin "$b")" to-universal -q --threads "$threads" "$work/ckpt" "$work/out"
    fi
    if want universal_h5; then
      job zckpt_universal_h5$b "$rep" "$(zbin "$b")" to-universal -q --format hdf5 --threads "$threads" "$work/ckpt" "$work/out"
    fi
    if want reshard; then
      job zckpt_reshard$b "$rep" "$(zbin "$b")" reshard -q --to-stage 2 --to-world-size 4 --threads "$threads" "$work/ckpt" "$work/out"
    fi
  done
  if [ $have_ds = 1 ] && [ "$rep" -le "$ds_reps" ]; then
    job ds_to_universal "$rep" env DS_ACCELERATOR=cpu "$py" -m deepspeed.checkpoint.ds_to_universal \
      --input_folder "$work/ckpt/global_step10" --output_folder "$work/out" --num_extract_workers "$threads" --num_merge_workers "$threads"
  fi
done
clean
read_bytes=$(cat "$work"/log.floor_zckpt_* | sed -n 's/.*read \([0-9]*\) bytes.*/\1/p' | head -1)
echo "== medians (floor: read $(echo "$read_bytes / 10^9" | bc -l | xargs printf '%.2f') GB of optimizer state once, write what the job wrote, one file, fsync)"
awk -v cache="$cache" '
  function median(label, col) { return pick(label, col, 0) }
  function lo(label, col) { return pick(label, col, -1) }
  function hi(label, col) { return pick(label, col, 1) }
  function pick(label, col, which,   n, i, j, t, v) {
    n = 0
    for (i = 1; i <= nr; i++) if (lab[i] == label) v[++n] = val[i, col]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    if (!n) return 0
    if (which < 0) return v[1]
    if (which > 0) return v[n]
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { nr++; lab[nr] = $1; for (c = 3; c <= 7; c++) val[nr, c] = $c; if (!($1 in seen)) { seen[$1] = 1; if ($1 !~ /^floor_/) order[++nj] = $1 } }
  END {
    printf "%-26s %7s %11s %7s %7s %6s %6s %8s %6s %6s\n", "job", "wall s", "(spread)", "floor s", "ratio", "best", "cpu s", "peak MB", "files", "GB"
    for (i = 1; i <= nj; i++) {
      k = order[i]; t = median(k, 3); f = median("floor_" k, 3); wall[k] = t; rss[k] = median(k, 4)
      printf "%-26s %7.2f %5.2f..%-5.2f %7.2f %6.2fx %5.2fx %6.2f %8.0f %6.0f %6.3f\n", k, t, lo(k, 3), hi(k, 3), f, t / f,
        lo(k, 3) / lo("floor_" k, 3), median(k, 7), rss[k] / 1024, median(k, 5), median(k, 6) / 1e9
    }
    for (k in wall) if ((k "_before") in wall)
      printf "%s: %.2fx the speed of the build before (median %.2f s -> %.2f s)\n", k, wall[k "_before"] / wall[k], wall[k "_before"], wall[k]
    if (("ds_to_universal" in wall) && ("zckpt_universal_ds" in wall) && ("zckpt_universal_h5" in wall)) {
      printf "to-universal (ds layout) is %.1fx faster than ds_to_universal.py, %.3f of its peak RSS\n", wall["ds_to_universal"] / wall["zckpt_universal_ds"], rss["zckpt_universal_ds"] / rss["ds_to_universal"]
      printf "to-universal (hdf5) is %.1fx faster than ds_to_universal.py\n", wall["ds_to_universal"] / wall["zckpt_universal_h5"]
    }
    if (("ds_to_universal" in wall) && ("zckpt_reshard" in wall))
      printf "reshard is %.1fx faster than ds_to_universal.py%s\n", wall["ds_to_universal"] / wall["zckpt_reshard"],
        ("zckpt_reshard_before" in wall) ? sprintf(" (the build before: %.1fx)", wall["ds_to_universal"] / wall["zckpt_reshard_before"]) : ""
  }' "$work/runs" | tee "$work/summary"
