#!/usr/bin/env bash
# cli_verify_on_read.sh ZCKPT TRAIN FIXTURES: every job refuses damaged rank files with one
# line, exit 1 and no output, and passes the intact checkpoint.
#   - consolidate, reshard, to-universal on DeepSpeed's own ZeRO-3 files (no manifest) and
#     on zckpt-written ones (zckpt-train, with and without zckpt-manifest.json):
#     a bit flipped inside an fp32 record, rank 0's optimizer file copied over rank 1's,
#     the two swapped, and (zckpt-train, two saves) rank 1's optimizer file or every
#     optimizer file taken from the earlier save;
#   - convert: a bit flipped inside a tensor record of a .pt.
# --no-verify reads the flipped copies (the hashes are skipped) but never the swapped ones.
set -uo pipefail
zckpt="$1"; train="$2"; fx="$3"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fails=0; n=0

flip() { # FILE OFFSET: flip bit 2 of the byte at OFFSET
  local b
  b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "\\$(printf %03o $((b ^ 4)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# JOB SRC: the job's command line writing $tmp/out
run_job() {
  case "$1" in
  consolidate) "$zckpt" consolidate -q "${@:3}" "$2" "$tmp/out" ;;
  reshard) "$zckpt" reshard -q --to-stage 2 --to-world-size 1 "${@:3}" "$2" "$tmp/out" ;;
  to-universal) "$zckpt" to-universal -q "${@:3}" "$2" "$tmp/out" ;;
  convert) "$zckpt" convert -q "${@:3}" "$2" "$tmp/out.safetensors" ;;
  esac
}

refused() { # WHAT JOB SRC NEEDLE [ARGS]
  n=$((n + 1))
  rm -rf "$tmp/out" "$tmp/out.safetensors" "$tmp/latest_universal"
  run_job "$2" "$3" "${@:5}" >"$tmp/so" 2>"$tmp/se"; local rc=$?
  local lines; lines=$(wc -l <"$tmp/se")
  if [ $rc -ne 1 ] || [ "$lines" -ne 1 ] || ! grep -q '^zckpt: error: ' "$tmp/se" || [ -s "$tmp/so" ] ||
     [ -e "$tmp/out" ] || [ -e "$tmp/out.safetensors" ] || { [ -n "${4:-}" ] && ! grep -q -- "$4" "$tmp/se"; }; then
    echo "FAIL: $1: $2 $3: rc $rc, $lines stderr lines (want exit 1, one line${4:+ with '$4'}, no output):"
    cat "$tmp/se"; fails=$((fails + 1))
  fi
}

passes() { # WHAT JOB SRC [ARGS]
  n=$((n + 1))
  rm -rf "$tmp/out" "$tmp/out.safetensors" "$tmp/latest_universal"
  if ! run_job "$2" "$3" "${@:4}" >"$tmp/so" 2>"$tmp/se"; then
    echo "FAIL: $1: $2 $3 ${*:4}: refused:"; cat "$tmp/se"; fails=$((fails + 1))
  fi
}

# every damage class on a copy of checkpoint CK (tag folder TAG) for the three DeepSpeed jobs
# OPT0/OPT1: rank 0's / rank 1's optimizer file name; FP32: byte offset inside rank 1's fp32
# record; OLD: the tag folder of an earlier save of the same run (or empty)
campaign() { # NAME CK TAG OPT0 OPT1 FP32 OLD
  local name=$1 ck=$2 tag=$3 o0=$4 o1=$5 off=$6 old=${7:-}
  local d="$tmp/$name"
  for job in consolidate reshard to-universal; do
    passes "$name intact" $job "$ck"
    rm -rf "$d"; cp -r "$ck" "$d"; flip "$d/$tag/$o1" "$off"
    refused "$name fp32 bit flip" $job "$d" "$o1"
    passes "$name fp32 bit flip, --no-verify" $job "$d" --no-verify
    rm -rf "$d"; cp -r "$ck" "$d"; cp "$d/$tag/$o0" "$d/$tag/$o1"
    refused "$name rank 0 over rank 1" $job "$d" "$o1"
    refused "$name rank 0 over rank 1, --no-verify" $job "$d" "$o1" --no-verify
    rm -rf "$d"; cp -r "$ck" "$d"; mv "$d/$tag/$o0" "$d/x"; mv "$d/$tag/$o1" "$d/$tag/$o0"; mv "$d/x" "$d/$tag/$o1"
    refused "$name ranks 0 and 1 swapped" $job "$d" ""
    refused "$name ranks 0 and 1 swapped, --no-verify" $job "$d" "" --no-verify
    if [ -n "$old" ]; then
      rm -rf "$d"; cp -r "$ck" "$d"; cp "$old/$o1" "$d/$tag/$o1"
      refused "$name rank 1 from the earlier save" $job "$d" "$o1"
      rm -rf "$d"; cp -r "$ck" "$d"; cp "$old/$o0" "$d/$tag/$o0"; cp "$old/$o1" "$d/$tag/$o1"
      refused "$name every optimizer file from the earlier save" $job "$d" ""
      refused "$name every optimizer file from the earlier save, --no-verify" $job "$d" "" --no-verify
    fi
  done
}

# 1. DeepSpeed's own files: ZeRO-3, 2 ranks, bf16 (rank 1's fp32_flat_groups[0] is record
#    data/6 at bytes 7424..9256 of the committed fixture; verify names it, checked below)
ds="$fx/deepspeed/s3w2_bf16/ckpt"
o0=bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt; o1=bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt
cp -r "$ds" "$tmp/probe"; flip "$tmp/probe/global_step2/$o1" 7524
"$zckpt" verify "$tmp/probe" >"$tmp/probe.txt" 2>&1
if ! grep -q 'tensor optimizer_state_dict.fp32_flat_groups.0' "$tmp/probe.txt"; then
  echo "FAIL: the fixture's fp32 record is not where this test flips"; fails=$((fails + 1))
fi
campaign ds "$ds" global_step2 $o0 $o1 7524

# 2. zckpt-written: zckpt-train, ZeRO-3 over 2 ranks, saves at steps 1 and 2
cat >"$tmp/ds.json" <<'JSON'
{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
 "zero_optimization": {"stage": 3}}
JSON
if ! "$train" --deepspeed "$tmp/ds.json" --output-dir "$tmp/run" --max-steps 2 --save-steps 1 --ranks 2 --bf16 \
     --quiet --n-layer 1 --n-embd 32 --n-head 2 --n-positions 32 >/dev/null 2>"$tmp/train.err"; then
  echo "FAIL: zckpt-train"; cat "$tmp/train.err"; exit 1
fi
zk="$tmp/run/checkpoint-2"; old="$tmp/run/checkpoint-1/global_step1"
off=$(grep "\"file\": \"$o1\", \"name\": \"optimizer_state_dict.fp32_flat_groups.0\"" "$zk/global_step2/zckpt-manifest.json" |
      sed 's/.*"offset": \([0-9]*\).*/\1/')
campaign zk "$zk" global_step2 $o0 $o1 $((off + 20)) "$old"
cp -r "$zk" "$tmp/src_nomanifest"; rm "$tmp/src_nomanifest/global_step2/zckpt-manifest.json"
campaign zk_nomanifest "$tmp/src_nomanifest" global_step2 $o0 $o1 $((off + 20)) "$old"

# zckpt-train --resume-from-checkpoint refuses the same damage before training
resume() { # WHAT CK: refused with exit 1
  n=$((n + 1))
  rm -rf "$tmp/run2"
  if "$train" --deepspeed "$tmp/ds.json" --output-dir "$tmp/run2" --max-steps 3 --save-steps 3 --ranks 2 --bf16 --quiet \
       --n-layer 1 --n-embd 32 --n-head 2 --n-positions 32 --resume-from-checkpoint "$2" >/dev/null 2>"$tmp/se"; then
    echo "FAIL: resume from $1: accepted"; fails=$((fails + 1))
  elif ! grep -q "$3" "$tmp/se"; then
    echo "FAIL: resume from $1: not for the damage:"; cat "$tmp/se"; fails=$((fails + 1))
  fi
}
rm -rf "$tmp/r"; cp -r "$zk" "$tmp/r"; flip "$tmp/r/global_step2/$o1" $((off + 20))
resume "a flipped fp32 bit" "$tmp/r" "XXH3-64 mismatch"
rm -f "$tmp/r/global_step2/zckpt-manifest.json"
resume "a flipped fp32 bit, no manifest" "$tmp/r" "CRC-32 mismatch"
rm -rf "$tmp/r"; cp -r "$zk" "$tmp/r"; cp "$old/$o1" "$tmp/r/global_step2/$o1"
resume "rank 1 of the earlier save" "$tmp/r" "rank files from different steps"

# reshard from a universal folder: a bit flipped in a parameter's fp32.pt (zckpt writes its
# one record, data/0 of fc1.weight's 253 floats, at byte 192)
"$zckpt" to-universal -q --inject-missing-state "$fx/deepspeed/s2w2_bf16/ckpt" "$tmp/uv"
passes "universal intact" reshard "$tmp/uv"
flip "$tmp/uv/zero/fc1.weight/fp32.pt" 692
refused "universal fp32 bit flip" reshard "$tmp/uv" "fc1.weight/fp32.pt: tensor record: CRC-32 mismatch"
passes "universal fp32 bit flip, --no-verify" reshard "$tmp/uv" --no-verify

# 3. convert: a bit flipped in a module record of a .pt (data/3, bytes 3648..5480)
cp "$fx/deepspeed/s2w2_bf16/ckpt/global_step2/mp_rank_00_model_states.pt" "$tmp/m.pt"
passes "convert intact" convert "$tmp/m.pt"
flip "$tmp/m.pt" 3748
refused "convert bit flip" convert "$tmp/m.pt" "m.pt"
passes "convert bit flip, --no-verify" convert "$tmp/m.pt" --no-verify

echo "$((n - fails)) passed, $fails failed"
[ $fails -eq 0 ]
