#!/usr/bin/env bash
# bench_dcp_chunks.sh: the DCP reader's memory against the number of chunks. For each K in
# TENSORS, a DCP folder of K small tensors (8 x 64 fp32) saved by torch at 2 ranks (2K
# chunks, 2K storage items: tests/bench/make_big_dcp.py --tensors K; made once, kept in
# WORKDIR), then the peak RSS (/usr/bin/time) and wall time of `zckpt inspect`, `verify`
# and `consolidate` of it, and the growth per chunk between the smallest and largest K.
# BEFORE=BUILD_DIR runs that build's zckpt too, on the same folders (a before/after).
#
# usage: tests/bench/bench_dcp_chunks.sh [WORKDIR]   TENSORS (default "1000 10000 50000"),
#        ZCK_BUILD, ZCK_PYTHON as in bench_consolidate.sh. Not run by ctest.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-/tmp/zckpt-bench-dcp}
bin=${ZCK_BUILD:-build}/bin
py=${ZCK_PYTHON:-$(scripts/interop_env.sh)}
sizes=${TENSORS:-"1000 10000 50000"}
mkdir -p "$work"
for k in $sizes; do
  [ -f "$work/chunks-$k/.metadata" ] || "$py" tests/bench/make_big_dcp.py "$work/chunks-$k" --tensors "$k" >/dev/null 2>&1
done
builds=("$bin" ${BEFORE:+"$BEFORE/bin"})
: >"$work/chunk-runs"
printf '# %s cores, load %s\n' "$(nproc)" "$(cut -d' ' -f1 /proc/loadavg)"
printf '%-8s %8s %9s  %-12s %8s %9s\n' build chunks metadata job "wall s" "peak MB"
for k in $sizes; do
  d=$work/chunks-$k
  chunks=$((2 * k))
  meta=$(stat -c %s "$d/.metadata")
  for b in "${builds[@]}"; do
    name=$([ "$b" = "$bin" ] && echo this || echo before)
    for job in inspect verify consolidate; do
      rm -f "$work/o.safetensors"
      case $job in
        inspect) cmd=("$b/zckpt" inspect "$d") ;;
        verify) cmd=("$b/zckpt" verify -q "$d") ;;
        consolidate) cmd=("$b/zckpt" consolidate -q "$d" "$work/o.safetensors") ;;
      esac
      /usr/bin/time -f "%e %M" -o "$work/time" "${cmd[@]}" >/dev/null
      read -r wall rss <"$work/time"
      echo "$name $chunks $job $wall $rss" >>"$work/chunk-runs"
      printf '%-8s %8d %7.1fMB  %-12s %8.2f %9.1f\n' "$name" "$chunks" "$(echo "$meta / 1048576" | bc -l)" "$job" "$wall" \
        "$(echo "$rss / 1024" | bc -l)"
    done
  done
done
rm -f "$work/o.safetensors"
awk '{ k = $1 " " $3; if (!(k in lo) || $2 < lo[k]) { lo[k] = $2; rlo[k] = $5 } if (!(k in hi) || $2 > hi[k]) { hi[k] = $2; rhi[k] = $5 } }
  END { for (k in lo) if (hi[k] > lo[k]) printf "%-22s %.2f KB per chunk (%d -> %d chunks)\n", k, (rhi[k] - rlo[k]) / (hi[k] - lo[k]), lo[k], hi[k] }' \
  "$work/chunk-runs" | sort
