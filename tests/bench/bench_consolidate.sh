#!/usr/bin/env bash
# bench_consolidate.sh: zckpt consolidate vs DeepSpeed's zero_to_fp32.py vs the I/O floor,
# on one synthetic checkpoint made in the same run (ZeRO-3, bf16, 8 ranks; default ~1B
# params). Reports wall time and peak RSS of each, and the ratios. Page cache is dropped
# before each timed step when permitted (root), so every tool reads from disk.
#
# usage: tests/bench/bench_consolidate.sh [PARAMS] [WORKDIR]   (needs a built ./build and,
#        for the DeepSpeed baseline, a Python with deepspeed: $ZCK_PYTHON or scripts/interop_env.sh)
#        CACHE=warm: page cache kept warm instead (every tool reads from memory; measures
#        CPU efficiency rather than the disk). KEEP=1: reuse WORKDIR/ckpt if present.
set -euo pipefail
cd "$(dirname "$0")/../.."
params=${1:-1e9}
work=${2:-/tmp/zckpt-bench}
bin=${ZCK_BUILD:-build}/bin
py=${ZCK_PYTHON:-$(scripts/interop_env.sh)}   # the pinned interop venv, made when missing
threads=$(nproc)
if [ "${KEEP:-0}" = 1 ] && [ -d "$work/ckpt" ]; then rm -rf "$work"/zckpt-out "$work"/ds-out; else rm -rf "$work"; mkdir -p "$work"; fi
drop() {
  sync
  if [ "${CACHE:-cold}" = warm ]; then cat "$work"/ckpt/*/*optim_states.pt >/dev/null; else echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; fi
}
timed() { # label cmd...: appends "label wall_s peak_kb" to results
  local label=$1; shift
  drop
  /usr/bin/time -f "%e %M" -o "$work/time.$label" "$@" >"$work/log.$label" 2>&1 || { echo "$label failed:"; tail -5 "$work/log.$label"; exit 1; }
  read -r wall rss <"$work/time.$label"
  echo "$label $wall $rss" >>"$work/results"
  printf '%-16s %9.2f s %10.1f MB\n' "$label" "$wall" "$(echo "$rss / 1024" | bc -l)"
}
if [ ! -d "$work/ckpt" ]; then
  echo "== generating a ZeRO-3 checkpoint of ~$params params over 8 ranks in $work/ckpt"
  $bin/make_big_ckpt "$work/ckpt" --params "$params" --world 8
fi
du -sh "$work/ckpt"
: >"$work/results"
# the floor is the best of a few copy chunk sizes (small chunks overlap reads and writes)
for chunk in 65536 262144 1048576; do
  FLOOR_CHUNK=$chunk timed "io_floor_$chunk" $bin/io_floor "$work/ckpt" "$work/floor.bin" "$threads"
  rm -f "$work/floor.bin"
done
awk '$1 ~ /^io_floor_/ { if (!best || $2 < best) { best = $2; rss = $3 } } END { print "io_floor", best, rss }' "$work/results" >>"$work/results"
timed zckpt $bin/zckpt consolidate -q --threads "$threads" "$work/ckpt" "$work/zckpt-out"
if "$py" -c "import deepspeed" 2>/dev/null; then
  z2f=$(DS_ACCELERATOR=cpu "$py" -c "import deepspeed.utils.zero_to_fp32 as m; print(m.__file__)" 2>/dev/null | tail -1)
  # run it the way users do: the copy DeepSpeed leaves in the checkpoint root
  cp "$z2f" "$work/ckpt/zero_to_fp32.py"
  rm -rf "$work/ds-out"
  timed zero_to_fp32 env DS_ACCELERATOR=cpu "$py" "$work/ckpt/zero_to_fp32.py" "$work/ckpt" "$work/ds-out" --safe_serialization
  echo "== checking the outputs are equal"
  "$py" - "$work" <<'PY'
import sys, json, os, torch
from safetensors.torch import load_file
w = sys.argv[1]
def load(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"): out.update(load_file(os.path.join(d, f)))
    return out
a, b = load(w + "/zckpt-out"), load(w + "/ds-out")
assert a.keys() == b.keys(), (len(a), len(b))
assert all(torch.equal(a[k], b[k]) for k in a), "values differ"
print(f"equal: {len(a)} tensors")
PY
fi
echo "== ratios"
awk '{t[$1]=$2; m[$1]=$3} END {
  if ("zero_to_fp32" in t) printf "zckpt is %.1fx faster than zero_to_fp32.py; peak RSS %.3f of its (%.0f MB vs %.0f MB)\n", t["zero_to_fp32"]/t["zckpt"], m["zckpt"]/m["zero_to_fp32"], m["zckpt"]/1024, m["zero_to_fp32"]/1024;
  printf "zckpt wall time is %.2fx the I/O floor\n", t["zckpt"]/t["io_floor"] }' "$work/results" | tee "$work/ratios"
