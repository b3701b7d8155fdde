#!/bin/sh
# test_ds_interop.sh: DeepSpeed itself loads what zckpt's writer lays out.
# For pairs (fixture, target stage/world): reshard with ds_reshard_tool, load both the
# fixture (at its own geometry) and the output (at the target geometry) into fresh CPU
# engines (ds_load.py) and require identical dumps: every fp32 master, exp_avg,
# exp_avg_sq, 16-bit weight and buffer, the counters and the scheduler state.
# Run through tests/interop/find_python.sh, which sets ZCK_PYTHON. Exit 77 (skip) without
# the fixtures.
set -u
TOOL="$1"
HERE="$(cd "$(dirname "$0")" && pwd)"
FIX="${ZCK_FIXTURES:-$HERE/../../fixtures}/deepspeed"
PY="${ZCK_PYTHON:?run through tests/interop/find_python.sh}"
[ -f "$FIX/s2w2_bf16/expected.json" ] || { echo "SKIP: fixtures missing"; exit 77; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fail=0
# fixture stage world dtype extra -> target stage world [sub_group_size]
while read -r case st w dt extra tst tw sgs; do
  [ -d "$FIX/$case/ckpt" ] || { echo "skip $case (missing)"; continue; }
  case "$case-s$tst-w$tw" in ${ZCK_INTEROP_ONLY:-*}) ;; *) continue ;; esac
  out="$TMP/$case-s$tst-w$tw"
  if ! "$TOOL" "$FIX/$case/ckpt" "$out" "$tst" "$tw" $sgs; then echo "FAIL reshard $case"; fail=1; continue; fi
  textra="$extra"
  [ -n "$sgs" ] && textra="{\"sub_group_size\": $sgs}"
  "$PY" "$HERE/ds_load.py" "$FIX/$case/ckpt" "$st" "$w" "$dt" "$extra" "$TMP/$case.src.json" || { echo "FAIL load source $case"; fail=1; continue; }
  "$PY" "$HERE/ds_load.py" "$out" "$tst" "$tw" "$dt" "$textra" "$TMP/$case.dst.json" || {
    echo "FAIL DeepSpeed cannot load zckpt's stage-$tst W=$tw output of $case"; tail -20 "$TMP/$case.dst.json.log.rank0.log"; fail=1; continue; }
  if cmp -s "$TMP/$case.src.json" "$TMP/$case.dst.json"; then echo "ok $case -> stage $tst W=$tw"
  else echo "FAIL $case -> stage $tst W=$tw: loaded state differs"; diff "$TMP/$case.src.json" "$TMP/$case.dst.json" | head -20; fail=1; fi
done <<'PAIRS'
s2w2_bf16 2 2 bf16 {} 3 3
s3w2_bf16 3 2 bf16 {} 1 4
s1w3_fp32 1 3 fp32 {} 2 2
s3w3_fp32 3 3 fp32 {} 3 2 100
PAIRS
exit $fail
