#!/usr/bin/env bash
# bench_dcp_tp.sh: consolidating tensor-parallel chunks against row chunks and the I/O
# floor, side by side in one run. Two DCP folders of the same K weights of D x D fp32 saved
# by torch at W ranks (tests/bench/make_big_dcp.py; made once, kept in WORKDIR):
#   - rows: every weight sharded by rows (Shard(0), FSDP2's): W chunks of one run each;
#   - tp:   every weight sharded by columns (Shard(1), tensor parallel's RowwiseParallel):
#           W chunks of D runs each (D x W contiguous runs in all: 32k for D = 4096, W = 8),
#           each chunk one strided extent of the copy.
# For each, `zckpt consolidate` and its floor (io_floor: read every chunk once, write as
# many bytes into one file, fsync), interleaved REPS times (page cache dropped before each
# run where the script may); medians, ratio = median(job) / median(floor), peak RSS. Then
# both outputs must be the same bytes. BEFORE=BUILD_DIR runs that build's zckpt on the tp
# folder too (a before/after).
#
# usage: tests/bench/bench_dcp_tp.sh [WORKDIR]   K (default 4), D (4096), W (8), REPS (3),
#        ZCK_BUILD, ZCK_PYTHON as in bench_consolidate.sh. Not run by ctest.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-/tmp/zckpt-bench-dcp-tp}
bin=${ZCK_BUILD:-build}/bin
py=${ZCK_PYTHON:-$(scripts/interop_env.sh)}
k=${K:-4} d=${D:-4096} w=${W:-8} reps=${REPS:-3}
threads=$(nproc)
mkdir -p "$work"
for kind in rows tp; do
  dir=$work/$kind-$k-$d-$w
  [ -f "$dir/.metadata" ] && continue
  "$py" tests/bench/make_big_dcp.py "$dir" --tensors "$k" --shape "${d}x$d" --world "$w" \
    $([ $kind = tp ] && echo --columns) >/dev/null 2>&1
done
cache=${CACHE:-cold}
sync
if [ "$cache" = cold ] && ! echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then cache=warm; echo "note: cannot drop the page cache here: warm runs"; fi
drop() { sync; if [ "$cache" = cold ]; then echo 3 >/proc/sys/vm/drop_caches; else cat "$1"/* >/dev/null 2>&1 || true; fi; }

# run LABEL SRC cmd...: one timed run, appended to $work/runs as "LABEL wall_s peak_kb"
run() {
  local label=$1 src=$2; shift 2
  rm -f "$work/out.safetensors" "$work/floor.bin"; drop "$src"
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >"$work/log" 2>&1 || { echo "$label failed:"; tail -5 "$work/log"; exit 1; }
  echo "$label $(cat "$work/time")" >>"$work/runs"
}
echo "== $k weights of ${d}x$d fp32 at $w ranks, by rows and by columns (tp); $threads threads, $reps runs each ($cache cache), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
: >"$work/runs"
builds=("$bin" ${BEFORE:+"$BEFORE/bin"})
for rep in $(seq 1 "$reps"); do
  for kind in rows tp; do
    dir=$work/$kind-$k-$d-$w
    for b in "${builds[@]}"; do
      name=$([ "$b" = "$bin" ] && echo "" || echo "_before")
      [ "$name" ] && [ $kind = rows ] && continue
      run "consolidate_$kind$name" "$dir" "$b/zckpt" consolidate -q --threads "$threads" "$dir" "$work/out.safetensors"
    done
    bytes=$(stat -c %s "$work/out.safetensors")
    run "floor_$kind" "$dir" "$bin/io_floor" "$dir" "$work/floor.bin" "$threads" "$bytes"
  done
done
"$bin/zckpt" consolidate -q "$work/rows-$k-$d-$w" "$work/rows.safetensors"
"$bin/zckpt" consolidate -q "$work/tp-$k-$d-$w" "$work/tp.safetensors"
cmp "$work/rows.safetensors" "$work/tp.safetensors" && echo "== the two outputs are the same bytes"
rm -f "$work/out.safetensors" "$work/floor.bin" "$work/rows.safetensors" "$work/tp.safetensors"
awk '
  function med(label, col,   n, i, j, t, v) {
    n = 0
    for (i = 1; i <= nr; i++) if (lab[i] == label) v[++n] = val[i, col]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { nr++; lab[nr] = $1; val[nr, 2] = $2; val[nr, 3] = $3; if (!($1 in seen)) { seen[$1] = 1; if ($1 !~ /^floor_/) order[++nj] = $1 } }
  END {
    printf "%-28s %7s %7s %7s %8s\n", "job", "wall s", "floor s", "ratio", "peak MB"
    for (i = 1; i <= nj; i++) {
      k = order[i]; f = k; sub(/^consolidate_/, "floor_", f); sub(/_before$/, "", f)
      printf "%-28s %7.2f %7.2f %6.2fx %8.1f\n", k, med(k, 2), med(f, 2), med(k, 2) / med(f, 2), med(k, 3) / 1024
    }
  }' "$work/runs" | tee "$work/summary"
