#!/bin/sh
# cli_stale_damage.sh ZCKPT FIXTURES: files each valid on their own that do not belong together, from real
# checkpoints saved twice by one run (fixtures/deepspeed-stale, make_stale_fixtures.py):
#   - a rank's optimizer file from the other tag (another step);
#   - two ranks' optimizer files swapped (renamed into each other's names);
#   - the model file(s) from the other tag (ZeRO-3: one rank's zero_pp_rank_N model file);
#   - a universal folder's zero/<param>/fp32.pt, or its whole param folder, from the other step's universal
#     folder, with zckpt's manifest and without (as ds_to_universal.py writes it);
#   - a DCP's .metadata from the other save (harmless: the same layout; the output is byte-identical), and a
#     .distcp of another layout (the run reloaded at another world size).
# Each file is shown to be the other tag's (cmp). Every job is refused: exit 1 (verify: 3), one line naming the
# file, no output, the input unchanged, an earlier output under the same name intact.
set -u
BIN=$1
FX=$2/deepspeed-stale
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

sums() { (cd "$1" && find . -type f | LC_ALL=C sort | xargs cksum); }

# refused SRC FILE WHAT KIND: every job on SRC fails naming FILE and saying WHAT; KIND ds or uv
refused() {
  src=$1 file=$2 what=$3 kind=$4
  before=$(sums "$src")
  rm -rf "$T/out" && mkdir "$T/out"
  echo "earlier" >"$T/out/earlier.safetensors"
  for job in consolidate reshard to-universal verify inspect; do
    [ "$kind" = uv ] && [ "$job" = to-universal ] && continue
    case $job in
      consolidate) set -- consolidate -q --overwrite "$src" "$T/out/earlier.safetensors" ;;
      reshard) set -- reshard -q "$src" "$T/out/rs" --to-stage 2 --to-world-size 1 ;;
      to-universal) set -- to-universal -q --inject-missing-state "$src" "$T/out/uv" ;;
      verify) set -- verify "$src" ;;
      inspect) set -- inspect "$src" ;;
    esac
    "$BIN" "$@" >"$T/o" 2>"$T/e"
    rc=$?
    if [ "$job" = verify ]; then
      [ "$rc" = 3 ] || fail "$src: verify exit $rc, expected 3 ($(cat "$T/o" "$T/e"))"
      msg=$(cat "$T/o")
    else
      [ "$rc" = 1 ] || fail "$src: $job exit $rc, expected 1 ($(cat "$T/e"))"
      msg=$(cat "$T/e")
      [ "$(wc -l <"$T/e")" = 1 ] || fail "$src: $job: not one line on stderr: $msg"
    fi
    echo "$msg" | grep -q "$file.*$what" || fail "$src: $job: '$msg' does not name $file and say '$what'"
    [ "$(cat "$T/out/earlier.safetensors")" = earlier ] || fail "$src: $job: an earlier output was replaced"
    [ "$(ls -A "$T/out")" = earlier.safetensors ] || fail "$src: $job: output left behind: $(ls -A "$T/out")"
  done
  [ "$before" = "$(sums "$src")" ] || fail "$src: the input changed"
}

# stale OLD NEW: NEW holds OLD's bytes and not the current tag's
stale() { cmp -s "$1" "$2" || fail "$2 is not a copy of $1"; }

for c in s1w2_bf16 s2w2_bf16 s3w2_bf16; do
  old=$FX/$c/ckpt/global_step1 new=$FX/$c/ckpt/global_step2
  o0=bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt o1=bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt
  if [ "$c" = s3w2_bf16 ]; then m=zero_pp_rank_1_mp_rank_00_model_states.pt; else m=mp_rank_00_model_states.pt; fi
  for f in $o1 $m; do ! cmp -s "$old/$f" "$new/$f" || fail "$c: $f is the same in both tags"; done
  # the intact tag goes through
  rm -rf "$T/ok" && cp -r "$new" "$T/ok"
  "$BIN" verify "$T/ok" >"$T/o" || fail "$c: intact tag: verify exit $? ($(cat "$T/o"))"
  rm -f "$T/ok.safetensors"; "$BIN" consolidate -q "$T/ok" "$T/ok.safetensors" || fail "$c: intact tag: consolidate exit $?"
  # a rank's optimizer file from the other tag: its Adam step is the other step's
  d=$T/$c.staleopt && rm -rf "$d" && cp -r "$new" "$d" && cp "$old/$o1" "$d/"
  stale "$old/$o1" "$d/$o1"
  refused "$d" "$d/$o1" "optimizer step 1 .*rank files from different steps" ds
  # two ranks' optimizer files swapped: torch.save names each archive after the file it wrote
  d=$T/$c.swap && rm -rf "$d" && cp -r "$new" "$d" && mv "$d/$o0" "$d/x" && mv "$d/$o1" "$d/$o0" && mv "$d/x" "$d/$o1"
  stale "$new/$o1" "$d/$o0"
  refused "$d" "$d/$o0" "holds rank 1's optimizer state" ds
  # the model file from the other tag: its global_steps
  d=$T/$c.stalemodel && rm -rf "$d" && cp -r "$new" "$d" && cp "$old/$m" "$d/"
  stale "$old/$m" "$d/$m"
  if [ "$c" = s3w2_bf16 ]; then refused "$d" "$d/$m" "global_steps 1, .*rank files from different steps" ds
  else refused "$d" "$d/$o0" "optimizer step 2 .*$m says global_steps 1" ds; fi
done

# universal folders of the two tags (zckpt's, with its manifest; without it, as ds_to_universal.py writes them)
ck=$FX/s2w2_bf16/ckpt
for t in 1 2; do
  "$BIN" to-universal -q --inject-missing-state "$ck/global_step$t" "$T/uv$t" || fail "to-universal of global_step$t: $?"
done
for manifest in keep drop; do
  ok=$T/uvok.$manifest && rm -rf "$ok" && cp -r "$T/uv2" "$ok"
  [ $manifest = drop ] && rm "$ok/zckpt-manifest.json"
  "$BIN" verify "$ok" >"$T/o" || fail "universal ($manifest manifest) intact: verify exit $? ($(cat "$T/o"))"
  "$BIN" consolidate -q "$ok" "$T/uvok.$manifest.safetensors" || fail "universal intact: consolidate exit $?"
  p=zero/fc1.weight
  d=$T/uvfp.$manifest && rm -rf "$d" && cp -r "$ok" "$d" && cp "$T/uv1/$p/fp32.pt" "$d/$p/"
  stale "$T/uv1/$p/fp32.pt" "$d/$p/fp32.pt"
  ! cmp -s "$T/uv2/$p/fp32.pt" "$d/$p/fp32.pt" || fail "fp32.pt is the same at both steps"
  if [ $manifest = keep ]; then refused "$d" "$d/$p/fp32.pt" "differ from zckpt-manifest.json" uv
  else refused "$d" "$d/$p/fp32.pt" "is not the fp32 master of its copy in .*mp_rank_00_model_states.pt" uv; fi
  # the whole param folder (fp32, exp_avg, exp_avg_sq, step) from the other step: its step.pt
  d=$T/uvdir.$manifest && rm -rf "$d" && cp -r "$ok" "$d" && cp "$T/uv1/$p/"* "$d/$p/"
  stale "$T/uv1/$p/step.pt" "$d/$p/step.pt"
  if [ $manifest = keep ]; then
    "$BIN" verify "$d" >"$T/o"; [ $? = 3 ] || fail "$d: verify did not find the param folder of another step"
  else refused "$d" "$d/$p/step.pt" "step 1, but .* has 2" uv; fi
done

# DCP: .metadata from the other save of the run. It records the layout alone (chunk offsets, sizes, the items'
# byte ranges), the same at both steps; its save_id is no part of the .distcp files. Harmless: the same output.
D=$FX/dcp_w2_fp32
d=$T/dcpmeta && rm -rf "$d" && cp -r "$D/step2" "$d" && cp "$D/step1/.metadata" "$d/"
stale "$D/step1/.metadata" "$d/.metadata"
! cmp -s "$D/step2/.metadata" "$d/.metadata" || fail "the two saves' .metadata are the same"
"$BIN" consolidate -q "$D/step2" "$T/dcp.safetensors" || fail "dcp intact: consolidate exit $?"
"$BIN" consolidate -q "$d" "$T/dcpmeta.safetensors" || fail "dcp with the other .metadata: consolidate exit $?"
cmp "$T/dcp.safetensors" "$T/dcpmeta.safetensors" || fail "dcp: the other save's .metadata changed the output"
# a .distcp of another layout (the run reloaded at 3 ranks): its items are not where .metadata says
L=$2/dcp/llama_tied_w2_fp32
d=$T/dcplayout && rm -rf "$d" && cp -r "$L" "$d" && cp "${L}_reloaded_w3/__1_0.distcp" "$d/"
stale "${L}_reloaded_w3/__1_0.distcp" "$d/__1_0.distcp"
"$BIN" consolidate -q "$d" "$T/dcplayout.safetensors" 2>"$T/e"
[ $? = 1 ] && grep -q "$d/__1_0.distcp" "$T/e" && [ "$(wc -l <"$T/e")" = 1 ] || fail "dcp: the other layout's .distcp: $(cat "$T/e")"
[ ! -e "$T/dcplayout.safetensors" ] || fail "dcp: output left behind"
echo "ok"
