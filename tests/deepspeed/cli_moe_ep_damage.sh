#!/bin/sh
# cli_moe_ep_damage.sh ZCKPT FIXTURES: deepspeed.moe with expert parallelism (tests/fixtures/deepspeed-moe/moe_ep2_s2,
# ep_size 2 on 2 ranks, made by DeepSpeed 0.19.8). Intact: inspect, verify and consolidate read it; to-universal is
# refused in one line naming ep_size 2 (ds_to_universal.py fails on it), nothing written; reshard at 4 ranks (EP size
# kept) reads back clean with the same masters, --to-ep-size 1 is refused in one line. Damaged copies, every job one line naming the file, non-zero exit,
# nothing at OUT:
#   missing  rank 1's expert file (layer_0_expert_1) removed: verify, consolidate, to-universal, reshard
#   flipped  a bit of that expert file's weight: verify names its zip record; consolidate and reshard read no
#            expert weight (the fp32 masters are the values: reshard writes the expert files from them)
#   master   a bit of rank 1's expert partition (its fp32 master): verify, consolidate and reshard name its CRC
set -u
BIN=$1
SRC=$2/deepspeed-moe/moe_ep2_s2/ckpt
G=global_step2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" inspect "$SRC" >"$T/out" 2>&1 || fail "intact inspect: $(cat "$T/out")"
grep -q "^moe.deepspeed_moe.experts.deepspeed_experts.1.weight " "$T/out" || fail "inspect: $(cat "$T/out")"
"$BIN" verify "$SRC" >"$T/out" 2>&1 && grep -q "checked: 5 files" "$T/out" || fail "intact verify: $(cat "$T/out")"
"$BIN" consolidate -q "$SRC" "$T/ok.safetensors" 2>"$T/err" || fail "intact consolidate: $(cat "$T/err")"
"$BIN" to-universal -q "$SRC" "$T/uv" 2>"$T/err" && fail "to-universal converted ep_size 2"
[ "$(wc -l <"$T/err")" = 1 ] && grep -q "ep_size 2" "$T/err" && [ ! -e "$T/uv" ] || fail "to-universal: $(cat "$T/err")"
"$BIN" reshard -q --to-world-size 4 --to-stage 1 "$SRC" "$T/w4" 2>"$T/err" || fail "reshard to 4 ranks: $(cat "$T/err")"
"$BIN" verify "$T/w4" >"$T/out" 2>&1 && grep -q "checked: 7 files" "$T/out" || fail "verify W 4: $(cat "$T/out")"
"$BIN" consolidate -q "$T/w4" "$T/w4.safetensors" 2>"$T/err" || fail "consolidate W 4: $(cat "$T/err")"
cmp -s "$T/ok.safetensors" "$T/w4.safetensors" || fail "consolidate at 4 ranks differs from the source's"
"$BIN" reshard -q --to-ep-size 1 --to-world-size 2 "$SRC" "$T/ep1" 2>"$T/err" && fail "reshard changed the EP size"
[ "$(wc -l <"$T/err")" = 1 ] && grep -q "keeps the EP size" "$T/err" && [ ! -e "$T/ep1" ] || fail "--to-ep-size: $(cat "$T/err")"

# $1 case, $2 what the message must name, $3 jobs; every job: exit != 0, one line naming it, no OUT
refused() {
  for job in $3; do
    rm -rf "$T/out.x"
    case $job in
      verify) "$BIN" verify "$T/$1" >"$T/err" 2>&1 && fail "$1: verify passed"
              grep -q "^damaged: .*$2" "$T/err" || fail "$1: verify: $(cat "$T/err")"; continue ;;
      consolidate) "$BIN" consolidate -q "$T/$1" "$T/out.x" 2>"$T/err" ;;
      to-universal) "$BIN" to-universal -q "$T/$1" "$T/out.x" 2>"$T/err" ;;
      reshard) "$BIN" reshard -q --to-world-size 4 "$T/$1" "$T/out.x" 2>"$T/err" ;;
    esac && fail "$1: $job passed"
    [ "$(wc -l <"$T/err")" = 1 ] && grep -q "$2" "$T/err" || fail "$1: $job: $(cat "$T/err")"
    [ ! -e "$T/out.x" ] || fail "$1: $job left its output"
  done
}
# flip(file, offset): one bit of a byte inside a record's data
flip() {
  b=$(od -An -tu1 -j"$2" -N1 "$1" | tr -d ' ') && printf "$(printf '\\%03o' $((b ^ 64)))" |
    dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}
E1=layer_0_expert_1_mp_rank_00_model_states.pt
cp -r "$SRC" "$T/missing" && rm "$T/missing/$G/$E1"
refused missing "incomplete MoE checkpoint: no layer_.*_expert_1_mp_rank_00_model_states.pt" \
  "verify consolidate to-universal reshard"
# the expert's weight is record data/0, at bytes 960..1216
cp -r "$SRC" "$T/flipped" && flip "$T/flipped/$G/$E1" 1000
cmp -s "$SRC/$G/$E1" "$T/flipped/$G/$E1" && fail "the flip did not happen"
refused flipped "$E1: zip record" "verify"
# rank 1's fp32 partition of the experts' group (its expert 1) is record data/7, at bytes 5056..5344
R1=zero_pp_rank_1_mp_rank_00_optim_states.pt
cp -r "$SRC" "$T/master" && flip "$T/master/$G/$R1" 5100
refused master "$R1.*CRC" "verify consolidate reshard"
exit 0
