#!/usr/bin/env bash
# bench_verify_cost.sh: what verify on read costs consolidate. One checkpoint with a
# zckpt-manifest.json (make_big_ckpt, then `zckpt verify --write-manifest`), page cache
# warm, then `zckpt consolidate` with the checks (each zip record's CRC-32 and each
# tensor range's XXH3 from the manifest) and with --no-verify, alternating, ROUNDS times
# each in the same run. Reports the median wall and CPU time of each and the ratio
# verify / no-verify (issue 12: within 1.05 warm). On a shared machine compare the
# medians, not single runs.
#
# usage: tests/bench/bench_verify_cost.sh [PARAMS] [WORKDIR]   PARAMS default 2e8
#        WORLD=2 (fewer stores than threads is the case where a per-store stream would
#        show); ROUNDS=5; ZCK_BUILD=build; THREADS=all cores
set -euo pipefail
cd "$(dirname "$0")/../.."
params=${1:-2e8}
work=${2:-/tmp/zckpt-bench-verify}
bin=${ZCK_BUILD:-build}/bin
world=${WORLD:-2}
rounds=${ROUNDS:-5}
threads=${THREADS:-$(nproc)}
rm -rf "$work"; mkdir -p "$work"
$bin/make_big_ckpt "$work/ckpt" --params "$params" --world "$world" >/dev/null 2>&1
$bin/zckpt verify -q --write-manifest "$work/ckpt" >/dev/null
du -sh "$work/ckpt"
: >"$work/results"
for ((i = 0; i < rounds; i++)); do
  for mode in verify no-verify; do
    flag=(); [ "$mode" = no-verify ] && flag=(--no-verify)
    cat "$work"/ckpt/*/*optim_states.pt >/dev/null   # warm
    rm -rf "$work/out"
    /usr/bin/time -f "%e %U %S" -o "$work/time" $bin/zckpt consolidate -q --threads "$threads" "${flag[@]}" \
      "$work/ckpt" "$work/out" >"$work/log" 2>&1 || { echo "consolidate ($mode) failed:"; tail -3 "$work/log"; exit 1; }
    read -r wall user sys <"$work/time"
    echo "$mode $wall $(echo "$user + $sys" | bc -l)" >>"$work/results"
  done
done
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for mode in verify no-verify; do
  w=$(awk -v m="$mode" '$1 == m { print $2 }' "$work/results" | median)
  c=$(awk -v m="$mode" '$1 == m { print $3 }' "$work/results" | median)
  printf '%-10s median %7.2f s wall %7.2f s cpu (%d runs)\n' "$mode" "$w" "$c" "$rounds"
  eval "wall_${mode//-/_}=$w cpu_${mode//-/_}=$c"
done
printf 'verify / no-verify: %.3f wall, %.3f cpu\n' "$(echo "$wall_verify / $wall_no_verify" | bc -l)" \
  "$(echo "$cpu_verify / $cpu_no_verify" | bc -l)"
rm -rf "$work"
