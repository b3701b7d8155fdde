#!/usr/bin/env bash
# compare_jobs.sh: runs every job of two zckpt binaries on every fixture and says where
# they differ: exit code, stdout, stderr (timings and the work folder masked) and every
# byte of what they wrote. For refactors that must not change behaviour.
#
#   scripts/compare_jobs.sh OLD_ZCKPT NEW_ZCKPT [FIXTURES_DIR] [WORK_DIR]
#
# Every file and folder is a source, except the generators and what lies inside a
# universal folder's zero/ (one .pt per parameter and state: the folder covers them); the
# jobs that take a checkpoint run on folders and .h5 files only. Besides the fixtures as
# they are, it makes (with OLD) universal folders and HDF5
# containers from a few DeepSpeed fixtures and runs the jobs on those too. Exit 0 when
# every run matched; the differing runs are listed, their outputs kept under WORK_DIR.
set -u
OLD=$(realpath "$1") NEW=$(realpath "$2")
FIX=$(realpath "${3:-$(dirname "$0")/../tests/fixtures}")
W=${4:-$(mktemp -d)}
mkdir -p "$W/res" "$W/derived"
OUTS="$W/out" OUT="$W/out/o"   # OUTS: all a run may write (to-universal adds latest_universal beside OUT)
runs=0 diffs=0

mask() { sed -e "s#$W#<W>#g" -e 's/ in [0-9][0-9.]* s$/ in <T> s/' -e 's/"seconds": *[0-9.e+-]*/"seconds": <T>/g'; }

# what a run wrote: every entry's type and path, every file's sha256
tree_of() {
  (cd "$OUTS" && find . -printf '%y %P\n' | sort && find . -type f -print0 | sort -z | xargs -0 -r sha256sum)
}

# one_run BIN SIDE ID ARGS...: runs BIN ARGS in a fresh OUT, keeps rc/out/err/tree
one_run() {
  local bin=$1 side=$2 id=$3
  shift 3
  rm -rf "$OUTS" && mkdir -p "$OUTS"
  (cd "$W" && timeout 300 "$bin" "$@" >"$W/res/$id.$side.out.raw" 2>"$W/res/$id.$side.err.raw" </dev/null)
  echo $? >"$W/res/$id.$side.rc"
  mask <"$W/res/$id.$side.out.raw" >"$W/res/$id.$side.out"
  mask <"$W/res/$id.$side.err.raw" >"$W/res/$id.$side.err"
  rm -f "$W/res/$id.$side.out.raw" "$W/res/$id.$side.err.raw"
  tree_of >"$W/res/$id.$side.tree"
}

# compare ID ARGS...: the job with both binaries
compare() {
  local id=$1
  shift
  one_run "$OLD" old "$id" "$@"
  one_run "$NEW" new "$id" "$@"
  runs=$((runs + 1))
  local f bad=
  for f in rc out err tree; do cmp -s "$W/res/$id.old.$f" "$W/res/$id.new.$f" || bad="$bad $f"; done
  if [ -n "$bad" ]; then
    diffs=$((diffs + 1))
    echo "DIFF [$bad ] $id: zckpt $*"
  else
    rm -f "$W/res/$id".*
  fi
}

# every job on one source path
jobs_on() {
  local p=$1 id
  id=$(echo "${p#"$FIX"/}" | tr '/ ' '__')
  compare "$id.inspect" inspect "$p"
  compare "$id.inspect-json" inspect --json "$p"
  compare "$id.verify" verify -q "$p"
  compare "$id.verify-json" verify -q --json "$p"
  compare "$id.convert-st" convert -q "$p" "$OUT.safetensors"
  [ -d "$p" ] || case "$p" in *.h5) ;; *) return ;; esac
  compare "$id.verify-struct" verify -q --structure-only "$p"
  compare "$id.convert-pt" convert -q "$p" "$OUT.pt"
  compare "$id.cons-dir" consolidate "$p" "$OUT"
  compare "$id.cons-file" consolidate -q "$p" "$OUT.safetensors"
  compare "$id.cons-bf16-shard" consolidate -q --dtype bf16 --max-shard-size 20KB "$p" "$OUT"
  compare "$id.cons-both" consolidate -q --format both --keep-tied "$p" "$OUT"
  compare "$id.cons-pt" consolidate -q --format pt --exclude-frozen "$p" "$OUT"
  compare "$id.cons-bin" consolidate -q "$p" "$OUT.bin"
  compare "$id.cons-tag" consolidate -q --tag nosuchtag "$p" "$OUT"
  compare "$id.reshard" reshard "$p" "$OUT"
  compare "$id.reshard-w1-s3" reshard -q --to-world-size 1 --to-stage 3 "$p" "$OUT"
  compare "$id.reshard-w3-s2" reshard -q --to-world-size 3 --to-stage 2 "$p" "$OUT"
  compare "$id.reshard-tag" reshard -q --tag nosuchtag "$p" "$OUT"
  compare "$id.touv-ds" to-universal "$p" "$OUT"
  compare "$id.touv-h5" to-universal -q --format hdf5 "$p" "$OUT.h5"
}

# universal folders and containers made from DeepSpeed fixtures (by OLD), as sources
for d in deepspeed/s1w2_bf16 deepspeed/s2w2_fp32_zeronumel deepspeed/s3w2_fp16 deepspeed/s0w2_fp32 \
         deepspeed/s3w4_fp32_3groups hf_peft/s2w2_lora_tied_bf16 hf_peft/s3w2_lora_untied_fp32 autotp/tp2_s1_fp32_tied; do
  [ -d "$FIX/$d" ] || continue
  n=$(echo "$d" | tr '/' '_')
  src="$FIX/$d"
  [ -d "$src/ckpt" ] && src="$src/ckpt"
  "$OLD" to-universal -q --inject-missing-state "$src" "$W/derived/$n.uv" >/dev/null 2>&1
  "$OLD" to-universal -q --format hdf5 "$src" "$W/derived/$n.h5" >/dev/null 2>&1
done

# a save root with the side files an HF Trainer leaves there (config.json,
# generation_config.json: consolidate takes them into an output folder), and its container
if [ -d "$FIX/deepspeed/s1w2_bf16/ckpt" ]; then
  mkdir "$W/derived/hfroot" && cp -rL "$FIX/deepspeed/s1w2_bf16/ckpt/." "$W/derived/hfroot/"   # a copy: fixtures stay as they are
  printf '{"model_type": "gpt2", "n_layer": 2}\n' >"$W/derived/hfroot/config.json"
  printf '{"bos_token_id": 0}\n' >"$W/derived/hfroot/generation_config.json"
  "$OLD" to-universal -q --format hdf5 "$W/derived/hfroot" "$W/derived/hfroot.h5" >/dev/null 2>&1
fi

while IFS= read -r -d '' p; do
  jobs_on "$p"
done < <(find "$FIX" "$W/derived" -mindepth 1 \( -path "$FIX/gen" -o -path '*/zero/*' \) -prune -o \
           \( -name '*.py' -o -name '*.md' \) -o -print0 | sort -z)

echo "$runs runs compared, $diffs differ (work: $W)"
[ "$diffs" = 0 ]
