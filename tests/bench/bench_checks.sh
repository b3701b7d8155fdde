#!/usr/bin/env bash
# bench_checks.sh: what the checks cost consolidate, against the I/O floor, in one run.
# The checks are the CRC-32 of every record read (verify on read) and the manifest's XXH3s
# of every byte written (whole file, 64 MiB chunks, each tensor). Rows, interleaved REPS
# times so background load hits them alike, page cache dropped before each (as root):
#   - io_floor: read the fp32 weights once, write as many bytes, fsync (io_floor.c);
#   - zckpt consolidate (this build);
#   - zckpt consolidate --no-verify (no read-side checks; the manifest is still hashed);
#   - with BASE="NAME=DIR ...": the consolidate of each other build's bin/ DIR too, as row
#     NAME (a before/after in one run).
# On a DCP folder (tests/bench/make_big_dcp.py, made once with the interop Python) of
# PARAMS params, and with DS_PARAMS on a DeepSpeed ZeRO-3 checkpoint (make_big_ckpt, made
# once). Reports medians of wall and CPU (user + system) seconds and each median's ratio
# to the floor's: on a shared machine the CPU seconds are the steadier figure.
#
# usage: tests/bench/bench_checks.sh [PARAMS] [WORKDIR]   PARAMS default 1e9 (4 GB fp32)
#        DS_PARAMS (default 0: no DeepSpeed rows), REPS (default 3), BASE, ZCK_BUILD,
#        ZCK_PYTHON as in bench_dcp.sh. Not run by ctest.
set -euo pipefail
cd "$(dirname "$0")/../.."
params=${1:-1e9}
work=${2:-/tmp/zckpt-bench-checks}
bin=${ZCK_BUILD:-build}/bin
base=${BASE:-}
ds_params=${DS_PARAMS:-0}
reps=${REPS:-3}
threads=$(nproc)
mkdir -p "$work"
cache=cold
sync
if ! echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then cache=warm; echo "note: cannot drop the page cache here: warm runs"; fi
drop() { sync; if [ "$cache" = cold ]; then echo 3 >/proc/sys/vm/drop_caches; else cat "$1"/* "$1"/*/* >/dev/null 2>&1 || true; fi; }

srcs=()
if [ "$params" != 0 ]; then
  dcp=$work/dcp-$params
  if [ ! -f "$dcp/.metadata" ]; then
    py=${ZCK_PYTHON:-$(scripts/interop_env.sh)}
    "$py" tests/bench/make_big_dcp.py "$dcp" --params "$params"
  fi
  srcs+=("dcp:$dcp")
fi
if [ "$ds_params" != 0 ]; then
  ds=$work/ds-$ds_params
  [ -f "$ds/latest" ] || { rm -rf "$ds"; "$bin/make_big_ckpt" "$ds" --params "$ds_params" --world 4 --stage 3; }
  srcs+=("ds:$ds")
fi

# run LABEL SRC cmd...: one timed run, appended to $work/runs as "LABEL wall_s cpu_s peak_kb"
run() {
  local label=$1 src=$2; shift 2
  rm -rf "$work/out" "$work/floor.bin"; drop "$src"
  /usr/bin/time -f "%e %U %S %M" -o "$work/time" "$@" >"$work/log.$label" 2>&1 || { echo "$label failed:"; tail -5 "$work/log.$label"; exit 1; }
  local wall user sys rss
  read -r wall user sys rss <"$work/time"
  echo "$label $wall $(echo "$user + $sys" | bc -l) $rss" >>"$work/runs"
  printf '  %-28s %7.2f s %7.2f s cpu %7.1f MB\n' "$label" "$wall" "$(echo "$user + $sys" | bc -l)" "$(echo "$rss / 1024" | bc -l)"
}

echo "== $(date -u '+%F %H:%M') UTC, commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- lib || echo '+lib changes'), $threads threads, $reps runs each ($cache cache), load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$work/runs"
for rep in $(seq 1 "$reps"); do
  for s in "${srcs[@]}"; do
    kind=${s%%:*} src=${s#*:}
    run "$kind.zckpt" "$src" "$bin/zckpt" consolidate -q --threads "$threads" "$src" "$work/out"
    bytes=$(find "$work/out" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.0f", s}')
    run "$kind.io_floor" "$src" "$bin/io_floor" "$src" "$work/floor.bin" "$threads" "$bytes"
    run "$kind.zckpt_no_verify" "$src" "$bin/zckpt" consolidate -q --no-verify --threads "$threads" "$src" "$work/out"
    for b in $base; do run "$kind.${b%%=*}" "$src" "${b#*=}/zckpt" consolidate -q --threads "$threads" "$src" "$work/out"; done
  done
done
rm -rf "$work/out" "$work/floor.bin"
echo "== medians ($reps runs; ratio: to the floor's median, wall and cpu)"
printf '%-28s %8s %8s %8s %8s %8s\n' job "wall s" "cpu s" "x wall" "x cpu" "peak MB"
awk '
  function med(label, col,   n, i, j, t, v) {
    n = 0
    for (i = 1; i <= nr; i++) if (lab[i] == label) v[++n] = val[i, col]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { nr++; lab[nr] = $1; val[nr, 2] = $2; val[nr, 3] = $3; val[nr, 4] = $4; if (!($1 in seen)) { seen[$1] = 1; order[++nl] = $1 } }
  END {
    for (k = 1; k <= nl; k++) {
      l = order[k]; split(l, p, "."); f = p[1] ".io_floor"
      printf "%-28s %8.2f %8.2f %7.2fx %7.2fx %8.1f\n", l, med(l, 2), med(l, 3), med(l, 2) / med(f, 2), med(l, 3) / med(f, 3), med(l, 4) / 1024
    }
  }' "$work/runs"
