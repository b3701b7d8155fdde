#!/usr/bin/env bash
# bench_universal.sh: DeepSpeed's ds_to_universal.py vs zckpt to-universal (DeepSpeed
# layout and HDF5) vs zckpt reshard, on one synthetic ZeRO-3 checkpoint over 8 ranks made
# in the same run; wall time, peak RSS and files created, against the I/O floor (read all
# optimizer state once, write as much once). Page cache dropped before each step.
#
# usage: tests/bench/bench_universal.sh [PARAMS] [WORKDIR]   (ZCK_BUILD, ZCK_PYTHON as in
#        bench_consolidate.sh; KEEP=1 reuses WORKDIR/ckpt)
set -euo pipefail
cd "$(dirname "$0")/../.."
params=${1:-2e8}
work=${2:-/tmp/zckpt-bench-universal}
bin=${ZCK_BUILD:-build}/bin
py=${ZCK_PYTHON:-/work/venv/bin/python}
threads=$(nproc)
if [ "${KEEP:-0}" = 1 ] && [ -d "$work/ckpt" ]; then find "$work" -mindepth 1 -maxdepth 1 ! -name ckpt -exec rm -rf {} +; else rm -rf "$work"; mkdir -p "$work"; fi
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
timed() { # label output cmd...
  local label=$1 output=$2; shift 2
  drop
  /usr/bin/time -f "%e %M" -o "$work/time.$label" "$@" >"$work/log.$label" 2>&1 || { echo "$label failed:"; tail -5 "$work/log.$label"; exit 1; }
  read -r wall rss <"$work/time.$label"
  local files; files=$(find "$output" -type f 2>/dev/null | wc -l)
  local bytes; bytes=$(du -sb "$output" 2>/dev/null | cut -f1); bytes=${bytes:-0}
  echo "$label $wall $rss $files $bytes" >>"$work/results"
  printf '%-22s %9.2f s %9.1f MB %7d files %8.2f GB\n' "$label" "$wall" "$(echo "$rss / 1024" | bc -l)" "$files" "$(echo "$bytes / 1000000000" | bc -l)"
}
if [ ! -d "$work/ckpt" ]; then
  echo "== generating a ZeRO-3 checkpoint of ~$params params over 8 ranks"
  $bin/make_big_ckpt "$work/ckpt" --params "$params" --world 8
fi
du -sh "$work/ckpt"
: >"$work/results"
for chunk in 65536 262144 1048576; do
  FLOOR_PARTS=all FLOOR_CHUNK=$chunk timed "io_floor_$chunk" "$work/floor.bin" $bin/io_floor "$work/ckpt" "$work/floor.bin" "$threads"
  rm -f "$work/floor.bin"
done
awk '$1 ~ /^io_floor_/ { if (!best || $2 < best) { best = $2; line = $0 } } END { split(line, f, " "); print "io_floor", f[2], f[3], f[4], f[5] }' "$work/results" >>"$work/results"
timed zckpt_universal_ds "$work/zu" $bin/zckpt to-universal -q --threads "$threads" "$work/ckpt" "$work/zu"
timed zckpt_universal_h5 "$work/zu.h5" $bin/zckpt to-universal -q --format hdf5 --threads "$threads" "$work/ckpt" "$work/zu.h5"
timed zckpt_reshard "$work/zr" $bin/zckpt reshard -q --to-stage 2 --to-world-size 4 --threads "$threads" "$work/ckpt" "$work/zr"
if "$py" -c "import deepspeed" 2>/dev/null; then
  timed ds_to_universal "$work/du" env DS_ACCELERATOR=cpu "$py" -m deepspeed.checkpoint.ds_to_universal \
    --input_folder "$work/ckpt/global_step10" --output_folder "$work/du" --num_extract_workers "$threads" --num_merge_workers "$threads"
fi
echo "== ratios"
awk '{t[$1]=$2; m[$1]=$3; f[$1]=$4} END {
  for (k in t) if (k != "io_floor" && k !~ /^io_floor_/) printf "%-20s %6.2fx the I/O floor, peak RSS %.0f MB, %d files\n", k, t[k]/t["io_floor"], m[k]/1024, f[k];
  if ("ds_to_universal" in t) {
    printf "to-universal (ds layout) is %.1fx faster than ds_to_universal.py, %.3f of its peak RSS\n", t["ds_to_universal"]/t["zckpt_universal_ds"], m["zckpt_universal_ds"]/m["ds_to_universal"];
    printf "to-universal (hdf5) is %.1fx faster, reshard %.1fx faster than ds_to_universal.py\n", t["ds_to_universal"]/t["zckpt_universal_h5"], t["ds_to_universal"]/t["zckpt_reshard"] } }' "$work/results" | tee "$work/ratios"
