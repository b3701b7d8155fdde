#!/usr/bin/env bash
# bench_tensors.sh: cost per tensor. For each count (default 10k and 100k parameters), a
# ZeRO checkpoint of that many small MoE-shaped tensors (make_big_ckpt --tensors; a few
# dozen bytes each, so the time is the per-tensor work, not bytes), then every job on it:
# inspect, verify, consolidate, reshard (and reading its own output back), to-universal in
# both layouts, verify and consolidate of the universal folder, inspect of the HDF5 container. Reports wall time and peak RSS of each
# (/usr/bin/time), and per job the ratio time(largest)/time(smallest): linear cost makes it
# the count ratio (10 for 10k -> 100k), quadratic cost its square. cpu (user + system seconds) is shown too: on a shared
# machine it is steadier than the wall time.
# to-universal --format ds is mostly the file system's cost (three files and a folder per
# parameter): files_floor (tests/bench/files_floor.c: the same folders and files, one
# write each, syncfs; nothing else) runs right before it, on one thread and on THREADS,
# and the job is also given as a ratio to that floor measured in the same run. Likewise the
# HDF5 container: h5_floor (tests/bench/h5_floor.c: libhdf5 alone making, then opening,
# the container's groups and datasets, laid out as it lays them out, with their dtype attribute) beside
# to-universal --format hdf5 and inspect of the container.
#
# REPS=N runs every row N times, rounds interleaved (floor, job, floor, job, ...) so the
# load of a shared machine hits a job and its floor alike, and reports the median of each
# row (wall, cpu, RSS) and the ratios of the medians. JOBS=universal runs only the two
# to-universal layouts and their floors; JOBS=hdf5 only the HDF5 container and its floor.
# Nothing is deleted between rounds (ext4 makes the
# next file creations pay for recent deletes for a while, and 300k-file folders take
# minutes to remove): a count's folder goes after its last round, unless KEEP=1 (then the
# caller removes WORKDIR/COUNT, e.g. in the background while the next count runs).
#
# usage: tests/bench/bench_tensors.sh [COUNTS] [WORKDIR]   COUNTS: "10000 100000" (default)
#        STAGE=3 (default) WORLD=2; ZCK_BUILD=build; THREADS=all cores; REPS=1; JOBS=all|universal|hdf5; KEEP=0
set -euo pipefail
cd "$(dirname "$0")/../.."
counts=${1:-"10000 100000"}
work=${2:-/tmp/zckpt-bench-tensors}
bin=${ZCK_BUILD:-build}/bin
stage=${STAGE:-3}
world=${WORLD:-2}
threads=${THREADS:-$(nproc)}
reps=${REPS:-1}
jobs=${JOBS:-all}
rm -rf "$work"; mkdir -p "$work"
: >"$work/results"
timed() { # count label cmd...: appends "count label wall_s peak_kb cpu_s" to results
  local n=$1 label=$2; shift 2
  /usr/bin/time -f "%e %M %U %S" -o "$work/time" "$@" >"$work/log.$n.$label" 2>&1 || {
    echo "$label ($n params) failed:"; tail -3 "$work/log.$n.$label"; echo "$n $label FAIL 0 0" >>"$work/results"; return 0; }
  read -r wall rss user sys <"$work/time"
  local cpu; cpu=$(echo "$user + $sys" | bc -l)
  echo "$n $label $wall $rss $cpu" >>"$work/results"
  printf '%7s %-14s %8.2f s wall %8.2f s cpu %9.1f MB\n' "$n" "$label" "$wall" "$cpu" "$(echo "$rss / 1024" | bc -l)"
}
echo "== $(date -u '+%F %H:%M') UTC, commit $(git rev-parse --short HEAD), $threads threads, $reps round(s), load $(cut -d' ' -f1-3 /proc/loadavg)"
for n in $counts; do
  d=$work/$n
  $bin/make_big_ckpt "$d/ckpt" --tensors "$n" --stage "$stage" --world "$world" 2>/dev/null
  q=(-q --threads "$threads")
  for rep in $(seq 1 "$reps"); do
    o=$d/r$rep
    mkdir -p "$o"
    if [ "$jobs" = all ]; then
      timed "$n" inspect $bin/zckpt inspect "$d/ckpt"
      timed "$n" verify $bin/zckpt verify -q --threads "$threads" "$d/ckpt"
      timed "$n" consolidate $bin/zckpt consolidate "${q[@]}" "$d/ckpt" "$o/st"
      timed "$n" reshard $bin/zckpt reshard "${q[@]}" "$d/ckpt" "$o/rs" --to-stage "$stage" --to-world-size $((world * 2))
      timed "$n" reshard_back $bin/zckpt reshard "${q[@]}" "$o/rs" "$o/rs2" --to-stage "$stage" --to-world-size "$world"
      # each starts with nothing of the bench's own waiting to be written (the floor's syncfs,
      # and the job's for a tree this big, would pay for it)
      sync; timed "$n" files_floor1 $bin/files_floor "$o/floor1" "$n" 1200 1
    fi
    if [ "$jobs" != hdf5 ]; then
      sync; timed "$n" files_floor $bin/files_floor "$o/floor" "$n" 1200 "$threads"
      sync; timed "$n" universal_ds $bin/zckpt to-universal "${q[@]}" --format ds "$d/ckpt" "$o/uv/u"
    fi
    if [ "$jobs" = all ]; then
      # reading that folder back (three files per param and a manifest listing each)
      timed "$n" verify_uv $bin/zckpt verify -q --threads "$threads" "$o/uv/u"
      timed "$n" consolidate_uv $bin/zckpt consolidate "${q[@]}" "$o/uv/u" "$o/uv.st"
    fi
    timed "$n" h5_floor_write $bin/h5_floor write "$o/floor.h5" "$n"
    timed "$n" universal_h5 $bin/zckpt to-universal "${q[@]}" --format hdf5 "$d/ckpt" "$o/u.h5"
    if [ "$jobs" = all ]; then
      # reading the container back: h5_floor_open opens every dataset; inspect describes the container (its
      # forked walk lists /params and opens none of its groups), so its ratio to that floor is below 1
      timed "$n" h5_floor_open $bin/h5_floor open "$o/floor.h5" "$n"
      timed "$n" inspect_h5 $bin/zckpt inspect "$o/u.h5"
    fi
  done
  [ "${KEEP:-0}" = 1 ] || rm -rf "$d"
done
# one row per (count, job): the median of its rounds (wall, RSS and cpu each on its own)
awk '{ k = $1 " " $2; if (!(k in n)) order[++m] = k; i = ++n[k]; w[k, i] = $3; r[k, i] = $4; c[k, i] = $5 }
     function med(a, k, cnt,   v, i, j, t) {
       for (i = 1; i <= cnt; i++) v[i] = a[k, i]
       for (i = 2; i <= cnt; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
       return cnt % 2 ? v[(cnt + 1) / 2] : (v[cnt / 2] + v[cnt / 2 + 1]) / 2 }
     END { for (x = 1; x <= m; x++) { k = order[x]; print k, med(w, k, n[k]), med(r, k, n[k]), med(c, k, n[k]) } }' \
  "$work/results" >"$work/medians"
if [ "$reps" -gt 1 ]; then
  echo "== medians of $reps rounds (wall s, cpu s, max RSS MB)"
  awk '{ printf "%7s %-14s %8.2f s wall %8.2f s cpu %9.1f MB\n", $1, $2, $3, $5, $4 / 1024 }' "$work/medians"
fi
cp "$work/results" "$work/rounds"; cp "$work/medians" "$work/results"
echo "== per job, largest count / smallest: wall, cpu and max RSS ratios (linear cost: the count ratio)"
awk 'NR == FNR { if (!first) first = $1; last = $1; next }
     $1 == first { t0[$2] = $3; c0[$2] = $5; r0[$2] = $4 } $1 == last { t1[$2] = $3; c1[$2] = $5; r1[$2] = $4; order[++k] = $2 }
     END { for (i = 1; i <= k; i++) { j = order[i]
             if (t0[j] > 0 && c0[j] > 0 && t1[j] != "FAIL") printf "%-14s %8.1f wall %8.1f cpu %8.1f rss\n", j, t1[j] / t0[j], c1[j] / c0[j], r1[j] / r0[j]
             else printf "%-14s %8s\n", j, "-" } }' \
  "$work/results" "$work/results"
echo "== each job / its floor measured in the same run: wall and cpu ratios"
ratio() { # job floor
  awk -v job="$1" -v floor="$2" '$2 == floor { fw[$1] = $3; fc[$1] = $5 } $2 == job { uw[$1] = $3; uc[$1] = $5; order[++k] = $1 }
     END { for (i = 1; i <= k; i++) { n = order[i]
             if (fw[n] > 0 && fc[n] > 0 && uw[n] != "FAIL") printf "%7s %-14s / %-14s %6.2f wall %6.2f cpu\n", n, job, floor, uw[n] / fw[n], uc[n] / fc[n]
             else printf "%7s %-14s / %-14s %6s\n", n, job, floor, "-" } }' "$work/results"
}
[ "$jobs" != hdf5 ] && ratio universal_ds files_floor
ratio universal_h5 h5_floor_write
[ "$jobs" = all ] && ratio inspect_h5 h5_floor_open
true
