#!/usr/bin/env bash
# bench_dcp.sh: the torch Distributed Checkpoint jobs against torch's own tool and the I/O
# floor, side by side in one run:
#   - consolidate: `zckpt consolidate` vs torch's dcp_to_torch_save, on a DCP folder of a
#     ~PARAMS-param Llama-shaped model saved by torch itself (dcp.save of FSDP2-style row
#     shards at 2 ranks, fp32, model only: tests/bench/make_big_dcp.py; made once and kept
#     in WORKDIR);
#   - with mpirun: the same consolidate over 2 ranks (the copy shared, each rank reads its
#     share of the items);
#   - for scale, `zckpt consolidate` of the DeepSpeed checkpoint below (the same executor
#     and writer, read from ZeRO-3 rank files);
#   - conversions: `zckpt reshard --to-format dcp` of a DeepSpeed ZeRO-3 checkpoint of
#     ~CONV_PARAMS params (make_big_ckpt, bf16 + fp32 master + Adam, 4 ranks; made once),
#     and back, `zckpt reshard` of that DCP folder to DeepSpeed ZeRO-3, where this build
#     reads DCP sources for reshard (else said and skipped).
# Each job's floor is io_floor (tests/bench/io_floor.c) reading the bytes the job needs
# once, in place (consolidate: every model chunk; conversions: every optimizer-state byte),
# and writing as many bytes as the job wrote, into one file, fsync'd. Every job and its
# floor run REPS times interleaved (job, floor, next job...) so background load hits both
# alike; the medians are reported with ratio = median(job) / median(floor), "best" =
# min(job) / min(floor), and peak RSS (/usr/bin/time). The page cache is dropped before
# each run (as root; else the runs are warm and the script says so).
#
# usage: tests/bench/bench_dcp.sh [PARAMS] [WORKDIR]   PARAMS default 1e9 (4 GB of fp32)
#        CONV_PARAMS (default 2.5e8; 0 skips the conversions), REPS (default 3),
#        TORCH=0 skips dcp_to_torch_save (it holds the whole model in RAM: 4 GB at 1e9),
#        NP=0 skips the mpirun row; ZCK_BUILD, ZCK_PYTHON as in bench_consolidate.sh.
# Not run by ctest. Needs the interop Python (torch) to make the DCP folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
params=${1:-1e9}
work=${2:-/tmp/zckpt-bench-dcp}
conv=${CONV_PARAMS:-2.5e8}
bin=${ZCK_BUILD:-build}/bin
py=${ZCK_PYTHON:-$(scripts/interop_env.sh)}
threads=$(nproc)
reps=${REPS:-3}
dcp=$work/dcp-$params
ds=$work/ds-$conv
ds_dcp=$work/ds-$conv-as-dcp
mkdir -p "$work"
rm -rf "$work/out" "$work/floor.bin"
cache=${CACHE:-cold}
sync
if [ "$cache" = cold ] && ! echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then cache=warm; echo "note: cannot drop the page cache here: warm runs"; fi
drop() { sync; if [ "$cache" = cold ]; then echo 3 >/proc/sys/vm/drop_caches; else cat "$1"/* "$1"/*/* >/dev/null 2>&1 || true; fi; }

if [ ! -f "$dcp/.metadata" ]; then
  echo "== saving a DCP checkpoint of ~$params params with torch (dcp.save, 2 ranks)"
  rm -rf "$dcp"
  "$py" tests/bench/make_big_dcp.py "$dcp" --params "$params"
fi
if [ "$conv" != 0 ] && [ ! -f "$ds/latest" ]; then
  echo "== generating a DeepSpeed ZeRO-3 checkpoint of ~$conv params over 4 ranks"
  rm -rf "$ds"
  "$bin/make_big_ckpt" "$ds" --params "$conv" --world 4 --stage 3
fi
if [ "$conv" != 0 ] && [ ! -f "$ds_dcp/.metadata" ]; then   # the source of DCP -> DeepSpeed
  "$bin/zckpt" reshard -q --to-format dcp --to-world-size 2 "$ds" "$ds_dcp"
fi

# run LABEL REP SRC cmd...: one timed run writing $work/out, appended to $work/runs as
#   "LABEL REP wall_s peak_kb bytes_written cpu_s"
run() {
  local label=$1 rep=$2 src=$3; shift 3
  rm -rf "$work/out" "$work/floor.bin"; drop "$src"
  /usr/bin/time -f "%e %M %U %S" -o "$work/time" "$@" >"$work/log.$label" 2>&1 || { echo "$label failed:"; tail -5 "$work/log.$label"; exit 1; }
  local wall rss user sys bytes cpu
  read -r wall rss user sys <"$work/time"
  if [ -e "$work/out" ]; then bytes=$(find "$work/out" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.0f", s}')
  else bytes=$(stat -c %s "$work/floor.bin"); fi
  cpu=$(echo "$user + $sys" | bc -l)
  echo "$label $rep $wall $rss $bytes $cpu" >>"$work/runs"
  printf '  %-24s run %d %7.2f s %7.2f s cpu %8.1f MB %7.3f GB\n' "$label" "$rep" "$wall" "$cpu" "$(echo "$rss / 1024" | bc -l)" \
    "$(echo "$bytes / 10^9" | bc -l)"
  last_bytes=$bytes
}
# job LABEL REP SRC PARTS cmd...: the job, then its floor writing as many bytes
job() {
  local label=$1 rep=$2 src=$3 parts=$4; shift 4
  run "$label" "$rep" "$src" "$@"
  run "floor_$label" "$rep" "$src" env FLOOR_PARTS="$parts" "$bin/io_floor" "$src" "$work/floor.bin" "$threads" "$last_bytes"
}

reads_dcp=0
if [ "$conv" != 0 ]; then
  "$bin/zckpt" reshard -q --to-stage 3 --to-world-size 2 "$ds_dcp" "$work/out" >"$work/log.probe" 2>&1 && reads_dcp=1 ||
    echo "note: this build does not reshard a DCP folder to DeepSpeed ($(head -1 "$work/log.probe")): that row is left out"
  rm -rf "$work/out"
fi
np=${NP:-2}
command -v mpirun >/dev/null || np=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

echo "== $(du -sh "$dcp" | cut -f1) DCP folder ($params params)${conv:+, $(du -sh "$ds" 2>/dev/null | cut -f1) DeepSpeed checkpoint ($conv params)}; $threads threads, $reps runs each ($cache cache), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
: >"$work/runs"
for rep in $(seq 1 "$reps"); do
  job zckpt_consolidate "$rep" "$dcp" model "$bin/zckpt" consolidate -q --threads "$threads" "$dcp" "$work/out"
  if [ "$np" != 0 ]; then
    job zckpt_consolidate_np$np "$rep" "$dcp" model mpirun -np "$np" "$bin/zckpt" consolidate -q --threads 1 "$dcp" "$work/out"
  fi
  if [ "${TORCH:-1}" != 0 ]; then
    job dcp_to_torch_save "$rep" "$dcp" model "$py" -c \
      'import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(sys.argv[1], sys.argv[2])' "$dcp" "$work/out"
  fi
  if [ "$conv" != 0 ]; then
    # the same job on a DeepSpeed source, for scale: the same executor and writer
    job zckpt_consolidate_ds "$rep" "$ds" fp32 "$bin/zckpt" consolidate -q --threads "$threads" "$ds" "$work/out"
    job zckpt_reshard_ds_to_dcp "$rep" "$ds" all "$bin/zckpt" reshard -q --to-format dcp --to-world-size 2 --threads "$threads" "$ds" "$work/out"
    if [ $reads_dcp = 1 ]; then
      job zckpt_reshard_dcp_to_ds "$rep" "$ds_dcp" all "$bin/zckpt" reshard -q --to-stage 3 --to-world-size 2 --threads "$threads" "$ds_dcp" "$work/out"
    fi
  fi
done
rm -rf "$work/out" "$work/floor.bin"

if [ "${TORCH:-1}" != 0 ] && [ "${CHECK:-1}" != 0 ]; then
  echo "== checking zckpt consolidate = dcp_to_torch_save, tensor by tensor"
  "$bin/zckpt" consolidate -q "$dcp" "$work/out.safetensors"
  "$py" -c 'import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save as f; f(sys.argv[1], sys.argv[2])' "$dcp" "$work/out.pt"
  "$py" - "$work" <<'PY'
import sys, torch
from safetensors import safe_open
w = sys.argv[1]
ref = torch.load(w + "/out.pt", mmap=True, weights_only=True)["model"]   # as dcp.save({"model": ...}) nested it
with safe_open(w + "/out.safetensors", "pt") as f:
    assert set(f.keys()) == set(ref), (len(f.keys()), len(ref))
    for k in f.keys():
        assert torch.equal(f.get_tensor(k), ref[k]), k
print(f"equal: {len(ref)} tensors")
PY
  rm -f "$work/out.safetensors" "$work/out.pt"
fi

echo "== medians (floor: read what the job needs once, write what it wrote, one file, fsync)"
awk '
  function pick(label, col, which,   n, i, j, t, v) {
    n = 0
    for (i = 1; i <= nr; i++) if (lab[i] == label) v[++n] = val[i, col]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    if (!n) return 0
    if (which < 0) return v[1]
    if (which > 0) return v[n]
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
  }
  { nr++; lab[nr] = $1; for (c = 3; c <= 6; c++) val[nr, c] = $c; if (!($1 in seen)) { seen[$1] = 1; if ($1 !~ /^floor_/) order[++nj] = $1 } }
  END {
    printf "%-24s %7s %13s %7s %7s %6s %6s %8s %7s\n", "job", "wall s", "(spread)", "floor s", "ratio", "best", "cpu s", "peak MB", "GB out"
    for (i = 1; i <= nj; i++) {
      k = order[i]; t = pick(k, 3, 0); f = pick("floor_" k, 3, 0); wall[k] = t; rss[k] = pick(k, 4, 0)
      printf "%-24s %7.2f %6.2f..%-6.2f %7.2f %6.2fx %5.2fx %6.2f %8.1f %7.3f\n", k, t, pick(k, 3, -1), pick(k, 3, 1), f, t / f,
        pick(k, 3, -1) / pick("floor_" k, 3, -1), pick(k, 6, 0), rss[k] / 1024, pick(k, 5, 0) / 1e9
    }
    if (("dcp_to_torch_save" in wall) && ("zckpt_consolidate" in wall))
      printf "zckpt consolidate is %.1fx faster than dcp_to_torch_save, %.4f of its peak RSS (%.0f MB vs %.0f MB)\n",
        wall["dcp_to_torch_save"] / wall["zckpt_consolidate"], rss["zckpt_consolidate"] / rss["dcp_to_torch_save"],
        rss["zckpt_consolidate"] / 1024, rss["dcp_to_torch_save"] / 1024
  }' "$work/runs" | tee "$work/summary"
