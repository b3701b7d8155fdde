#!/bin/sh
# autoep_damage.sh ZCKPT ZCK_DAMAGE: DeepSpeed AutoEP checkpoints (tests/fixtures/autoep) intact and damaged.
#
# Intact: inspect, verify, consolidate and to-universal exit 0. Damaged copies of the ZeRO-2 fixture's expert files
# (layer_<L>_expert_<E>_mp_rank_00_model_states.pt) and the ZeRO-3 fixture's rank files: every job exits
# non-zero with exactly one stderr line `zckpt: error: ...` naming the damaged file (verify: its report names it),
# consolidate leaves nothing at OUT, and the input is untouched. Classes:
#   copy     expert 1's file copied over expert 2's          swap   expert 1's and 2's files exchanged
#   other    expert 2's file from another run (the bf16 one's)   missing  expert 2's file removed
#   stale    expert 2's file from the same run's save at step 1 (fp32 and bf16): verify names it (its weights are
#            not the module copy of the masters); consolidate, to-universal and inspect read no expert weights
#            (their output does not depend on them, as ds_to_universal's does not), so they pass
#   z3-copy  ZeRO-3: rank 0's model file copied over rank 1's; at EP 2 x expert-data-parallel 2, rank 0's over rank 2's
#            (the same EP rank, another expert-data-parallel rank)
#   swap-layer  layer 0's and layer 1's expert-1 files exchanged (the same shapes, other keys)
#   copy-edp    EP 2 x expert-data-parallel 2 (4 ranks): expert 1's file copied over expert 2's
#   extra    an expert file of a layer ds_autoep_layers does not list (layer_5_expert_0); a ZeRO-2 save's expert
#            file in a ZeRO-3 checkpoint (whose experts are in the ZeRO shards): a stale file of another save
#   refuse   reshard (DeepSpeed or DCP) of an AutoEP checkpoint and of its HDF5 universal container: one line; reshard
#            into ZeRO-1 / ZeRO-3 of a damaged source (copy, z3-copy) names the file
#   zckpt-z3 zckpt's own ZeRO-3 AutoEP output (W 4): intact, then rank 1's model file over rank 3's (the same EP rank)
#   uv-*     the universal folder of an AutoEP checkpoint (zckpt to-universal; its manifest removed, as
#            ds_to_universal's has none): an expert folder missing, or w1's fp32.pt over w2's (the same numel at
#            ZeRO-3, where other params' files are flat): consolidate names the file, writes nothing
#   flip     one bit of an expert weight: verify names it (zip CRC); consolidate, to-universal and inspect never read the
#            module's 16-bit expert weights (they cast the fp32 masters), so they pass, as for any 16-bit weight
set -u
Z=$1 DAMAGE=$2
HERE=$(cd "$(dirname "$0")" && pwd)
FIX="$HERE/../fixtures/autoep"
W=$(mktemp -d) || exit 1
trap 'rm -rf "$W"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { fails=$((fails + 1)); echo "FAIL: $*"; }
sums() { (cd "$1" && find . -type f -exec cksum {} + | LC_ALL=C sort -k3); }

# jobs CASE DIR NAME EXPECT: runs the four jobs on DIR; EXPECT ok, or fail naming NAME
jobs() {
  for job in inspect verify consolidate to-universal; do
    out="$W/out.$1.$job"
    before=$(sums "$2")
    case $job in
      consolidate|to-universal) "$Z" "$job" "$2" "$out" >"$W/so" 2>"$W/se"; rc=$? ;;
      *) "$Z" "$job" "$2" >"$W/so" 2>"$W/se"; rc=$? ;;
    esac
    [ "$before" = "$(sums "$2")" ] || bad "$1 $job: the input changed"
    if [ "$4" = ok ] || { [ "$4" = verify-only ] && [ "$job" != verify ]; }; then
      [ $rc = 0 ] && ok || bad "$1 $job: exit $rc: $(cat "$W/se")"
      rm -rf "$out"
      continue
    fi
    [ $rc != 0 ] && ok || bad "$1 $job: exit 0 on a damaged checkpoint"
    [ ! -e "$out" ] && ok || bad "$1 $job: left $out"
    if [ "$job" = verify ]; then
      grep -q "$3" "$W/so" "$W/se" && ok || bad "$1 verify: no line names $3: $(cat "$W/so" "$W/se")"
    else
      [ "$(wc -l <"$W/se")" = 1 ] && grep -q "^zckpt: error: .*$3" "$W/se" && ok ||
        bad "$1 $job: not one error line naming $3: $(cat "$W/se")"
    fi
  done
}

fresh() { rm -rf "$W/ck" && cp -r "$FIX/$1/ckpt" "$W/ck" && T="$W/ck/global_step2"; }
e() { echo "$T/layer_0_expert_$1_mp_rank_00_model_states.pt"; }

for c in ep2_s1_fp32 ep2_s3_sg600_fp32 ep2_s2_fp32 ep2_s2_bf16 ep2_s3_fp32 ep2_s3_bf16 qwen3_ep2_s2_bf16 ep2dp2_s2_fp32 ep2dp2_s3_fp32; do fresh $c; jobs "intact-$c" "$W/ck" - ok; done

fresh ep2_s2_fp32; cp "$(e 1)" "$(e 2)"; jobs copy "$W/ck" layer_0_expert_2 fail
fresh ep2_s2_fp32; mv "$(e 1)" "$W/t.pt"; mv "$(e 2)" "$(e 1)"; mv "$W/t.pt" "$(e 2)"; jobs swap "$W/ck" layer_0_expert_ fail
fresh ep2_s2_fp32; cp "$FIX/ep2_s2_bf16/ckpt/global_step2/layer_0_expert_2_mp_rank_00_model_states.pt" "$(e 2)"
jobs other "$W/ck" layer_0_expert_2 fail
for c in ep2_s2_fp32 ep2_s2_bf16; do
  fresh $c; cp "$FIX/$c/stale_step1/layer_0_expert_2_mp_rank_00_model_states.pt" "$(e 2)"
  jobs "stale-$c" "$W/ck" layer_0_expert_2 verify-only
done
fresh ep2_s2_fp32; rm "$(e 2)"; jobs missing "$W/ck" layer_0_expert_2 fail
fresh ep2_s3_fp32; cp "$T/zero_pp_rank_0_mp_rank_00_model_states.pt" "$T/zero_pp_rank_1_mp_rank_00_model_states.pt"
jobs z3-copy "$W/ck" zero_pp_rank_1_mp_rank_00_model_states fail
fresh ep2dp2_s3_fp32; cp "$T/zero_pp_rank_0_mp_rank_00_model_states.pt" "$T/zero_pp_rank_2_mp_rank_00_model_states.pt"
jobs z3-copy-edp "$W/ck" zero_pp_rank_2_mp_rank_00_model_states fail
fresh ep2_s2_fp32; L1="$T/layer_1_expert_1_mp_rank_00_model_states.pt"
mv "$(e 1)" "$W/t.pt"; mv "$L1" "$(e 1)"; mv "$W/t.pt" "$L1"; jobs swap-layer "$W/ck" "layer_[01]_expert_1" fail
fresh ep2dp2_s2_fp32; cp "$(e 1)" "$(e 2)"; jobs copy-edp "$W/ck" layer_0_expert_2 fail
fresh ep2_s2_fp32; cp "$(e 0)" "$T/layer_5_expert_0_mp_rank_00_model_states.pt"; jobs extra-layer "$W/ck" layer_5_expert_0 fail
fresh ep2_s3_fp32; cp "$FIX/ep2_s2_fp32/ckpt/global_step2/layer_0_expert_0_mp_rank_00_model_states.pt" "$(e 0)"
jobs extra-z3 "$W/ck" layer_0_expert_0 fail
fresh ep2_s2_fp32
"$DAMAGE" flip "$(e 2)" model.layers.0.mlp.experts.w1.2 >"$W/dlog" 2>&1 || bad "flip: zck_damage: $(cat "$W/dlog")"
jobs flip "$W/ck" layer_0_expert_2 verify-only

# the jobs that do not write AutoEP's layout yet refuse it
for c in ep2_s2_fp32 ep2_s3_fp32; do
  rm -f "$W/uc.h5"
  "$Z" to-universal -q --format hdf5 "$FIX/$c/ckpt" "$W/uc.h5" || bad "$c: to-universal --format hdf5 failed"
  for src in "$FIX/$c/ckpt" "$W/uc.h5"; do
    for job in "reshard --to-world-size 1" "reshard --to-format dcp"; do
      # shellcheck disable=SC2086
      "$Z" $job "$src" "$W/out.w" >"$W/so" 2>"$W/se"; rc=$?
      [ $rc = 1 ] && [ "$(wc -l <"$W/se")" = 1 ] && grep -q "AutoEP" "$W/se" && [ ! -e "$W/out.w" ] && ok ||
        bad "$c $job ${src##*/}: exit $rc, not one AutoEP line or output left: $(cat "$W/se")"
      rm -rf "$W/out.w"
    done
  done
done

# reshard into each AutoEP stage refuses a damaged source naming the file, writes nothing; zckpt's own ZeRO-3 output
# with a rank's model file copied over another's is named by every job
refused() {  # NAME DIR FILE ARGS...: reshard ARGS DIR refused in one line naming FILE, nothing written
  n=$1 d=$2 f=$3; shift 3
  rm -rf "$W/out.r"
  "$Z" reshard "$@" "$d" "$W/out.r" >"$W/so" 2>"$W/se"; rc=$?
  [ $rc = 1 ] && [ "$(wc -l <"$W/se")" = 1 ] && grep -q "^zckpt: error: .*$f" "$W/se" && [ ! -e "$W/out.r" ] && ok ||
    bad "$n reshard $*: exit $rc, not one line naming $f or output left: $(cat "$W/se")"
}
for t in 1 3; do
  fresh ep2_s2_fp32; cp "$(e 1)" "$(e 2)"; refused "copy" "$W/ck" layer_0_expert_2 --to-stage $t
  fresh ep2_s3_fp32; cp "$T/zero_pp_rank_0_mp_rank_00_model_states.pt" "$T/zero_pp_rank_1_mp_rank_00_model_states.pt"
  refused "z3-copy" "$W/ck" zero_pp_rank_1_mp_rank_00_model_states --to-stage $t
done
rm -rf "$W/z3"
"$Z" reshard -q --to-stage 3 --to-world-size 4 "$FIX/ep2_s2_fp32/ckpt" "$W/z3" || bad "reshard to ZeRO-3 at W 4 failed"
jobs "zckpt-z3" "$W/z3" - ok
Z3="$W/z3/global_step2"
cp "$Z3/zero_pp_rank_1_mp_rank_00_model_states.pt" "$Z3/zero_pp_rank_3_mp_rank_00_model_states.pt"
jobs "zckpt-z3-copy" "$W/z3" zero_pp_rank_3_mp_rank_00_model_states fail

# the universal folder read back: each expert file is whole and checked against its full shape
for t in missing shape; do
  rm -rf "$W/uc" "$W/latest_universal" "$W/out.uv"
  "$Z" to-universal -q "$FIX/ep2_s3_fp32/ckpt" "$W/uc" || bad "uv-$t: to-universal failed"
  rm -f "$W/uc/zckpt-manifest.json"
  X="$W/uc/zero/model.layers.0.mlp.experts"
  case $t in
    missing) rm -r "$X.w2" ;;
    shape) cp "$X.w1/fp32.pt" "$X.w2/fp32.pt" ;;
  esac
  "$Z" consolidate "$W/uc" "$W/out.uv" >"$W/so" 2>"$W/se"; rc=$?
  [ $rc = 1 ] && [ "$(wc -l <"$W/se")" = 1 ] && grep -q "model.layers.0.mlp.experts.w2" "$W/se" && [ ! -e "$W/out.uv" ] && ok ||
    bad "uv-$t: exit $rc, not one line naming experts.w2 or output left: $(cat "$W/se")"
done

echo "$passes passed, $fails failed"
[ $fails = 0 ]
