#!/usr/bin/env bash
# cli_habits.sh: the command as DeepSpeed and Hugging Face users type it: -t/--tag
# (zero_to_fp32's spelling) and -j/--threads in every command; one summary line on stderr
# after a job succeeds ("wrote OUT: N tensors, X KB in T s"), silenced by -q; consolidate
# of a Trainer output_dir (reshard and to-universal too) takes its newest complete
# checkpoint-N and says which.
set -u
bin="${ZCK_BIN:?ZCK_BIN must name the zckpt binary}"
here="$(cd "$(dirname "$0")" && pwd)"
fx="${ZCK_FIXTURES:-$here/../fixtures}"
ck="$fx/deepspeed/s3w2_bf16/ckpt"
[ -d "$ck" ] || { echo "SKIP: no fixture $ck"; exit 77; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
run() { # expected_rc cmd...: stdout in $tmp/out, stderr in $tmp/err
  local want="$1"; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  [ "$rc" = "$want" ] || { bad "exit $rc, expected $want: $*"; cat "$tmp/err"; return 1; }
}
bytes_of() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
human() { # bytes as the summary writes them (powers of 1000, one decimal)
  awk -v b="$1" 'BEGIN { if (b < 1000) { printf "%d bytes", b; exit }
    split("KB MB GB TB PB", u, " "); v = b / 1000; i = 1
    while (v >= 999.95 && i < 5) { v /= 1000; i++ } printf "%.1f %s", v, u[i] }'
}
summary_is() { # OUT N WHAT: stderr is exactly the summary line for OUT
  local want line; want="wrote $1: $2 $3, $(human "$(bytes_of "$1")") in "
  line="$(cat "$tmp/err")"
  if [ "$(wc -l <"$tmp/err")" != 1 ] || [[ "$line" != "$want"* ]] || ! [[ "${line#"$want"}" =~ ^[0-9]+\.[0-9]\ s$ ]]; then
    bad "summary of $1: expected one line '$want<T> s', got:"; cat "$tmp/err"
  fi
}
quiet_is_silent() { [ ! -s "$tmp/err" ] || { bad "-q: stderr not empty: $*"; cat "$tmp/err"; }; }

# ---- -t is --tag, -j is --threads (zero_to_fp32.py: -t/--tag)
run 0 "$bin" consolidate -q --tag global_step2 --threads 2 "$ck" "$tmp/long.safetensors"
run 0 "$bin" consolidate -q -t global_step2 -j 2 "$ck" "$tmp/short.safetensors" &&
  { cmp -s "$tmp/long.safetensors" "$tmp/short.safetensors" || bad "-t/-j output differs from --tag/--threads"; }
run 1 "$bin" consolidate -q -t global_step9 "$ck" "$tmp/none.safetensors" &&
  { grep -q "global_step9" "$tmp/err" && [ "$(wc -l <"$tmp/err")" = 1 ] || { bad "-t global_step9: error should name the tag"; cat "$tmp/err"; }; }
[ ! -e "$tmp/none.safetensors" ] || bad "-t global_step9 left output"
run 2 "$bin" consolidate -q -j 0 "$ck" "$tmp/j0.safetensors" && grep -q -- "threads" "$tmp/err" || bad "-j 0 is not refused as threads"
run 0 "$bin" reshard -q -t global_step2 -j 1 --to-world-size 3 "$ck" "$tmp/r3"
run 0 "$bin" to-universal -q -t global_step2 -j 1 "$ck" "$tmp/u"
run 0 "$bin" verify -q -t global_step2 -j 1 "$ck"
run 1 "$bin" verify -q -t global_step9 "$ck"
run 0 "$bin" convert -q -j 1 "$tmp/short.safetensors" "$tmp/short.pt"
run 0 "$bin" verify --json -q "$ck" && grep -q '"result"' "$tmp/out" || bad "verify --json"

# ---- one summary line on success, none with -q, none on failure
run 0 "$bin" consolidate "$ck" "$tmp/one.safetensors" &&
  summary_is "$tmp/one.safetensors" "$("$bin" inspect "$tmp/one.safetensors" | sed -n 's/^\([0-9]*\) tensors,.*/\1/p')" tensors
run 0 "$bin" consolidate --max-shard-size 2KB "$ck" "$tmp/hf" && summary_is "$tmp/hf" 11 tensors
run 0 "$bin" consolidate --format both "$ck" "$tmp/both" && summary_is "$tmp/both" 11 tensors
run 0 "$bin" reshard --to-world-size 3 --to-stage 2 "$ck" "$tmp/r" && summary_is "$tmp/r" 10 parameters
run 0 "$bin" to-universal "$ck" "$tmp/uv" && summary_is "$tmp/uv" 10 parameters
run 0 "$bin" to-universal --format hdf5 "$ck" "$tmp/uv.h5" && summary_is "$tmp/uv.h5" 10 parameters
run 0 "$bin" convert "$tmp/one.safetensors" "$tmp/one.pt" && summary_is "$tmp/one.pt" 11 tensors
run 0 "$bin" consolidate -q "$ck" "$tmp/q.safetensors" && quiet_is_silent consolidate
run 0 "$bin" reshard --quiet --to-world-size 1 "$ck" "$tmp/rq" && quiet_is_silent reshard
run 0 "$bin" to-universal -q "$ck" "$tmp/uq" && quiet_is_silent to-universal
run 0 "$bin" convert -q "$tmp/one.safetensors" "$tmp/q.pt" && quiet_is_silent convert
run 1 "$bin" consolidate "$ck" "$tmp/one.safetensors" && ! grep -q '^wrote' "$tmp/err" || bad "a failed job printed a summary"

# ---- consolidate of a Trainer output_dir: the newest complete checkpoint-N
od="$tmp/output_dir"; mkdir -p "$od" "$tmp/elsewhere"
cp -r "$ck" "$od/checkpoint-2"; cp -r "$ck" "$od/checkpoint-10"
cp -r "$ck" "$tmp/elsewhere/ck12"; ln -s "$tmp/elsewhere/ck12" "$od/checkpoint-12"   # a link to a folder counts
cp -r "$ck" "$od/checkpoint-20"; : >"$od/checkpoint-20/global_step2/.zckpt-partial"   # zckpt still writing it
cp -r "$ck" "$od/checkpoint-25"; printf 'global_step25' >"$od/checkpoint-25/latest"     # names a missing tag
mkdir -p "$od/checkpoint-30/global_step30"                                               # killed before `latest`
cp -r "$ck" "$od/checkpoint-99x"; cp -r "$ck" "$od/xcheckpoint-98"; : >"$od/checkpoint-97"  # not candidates
run 0 "$bin" consolidate "$od" "$tmp/od.safetensors" &&
  { [ "$(wc -l <"$tmp/err")" = 2 ] && head -1 "$tmp/err" | grep -qF "consolidating $od/checkpoint-12, the newest complete checkpoint (checkpoint-30 is incomplete: no \`latest\`" ||
      { bad "output_dir: expected checkpoint-12 picked, checkpoint-30 named incomplete"; cat "$tmp/err"; }
    cmp -s "$tmp/od.safetensors" "$tmp/one.safetensors" || bad "output_dir: not the checkpoint's tensors"; }
run 0 "$bin" consolidate -q "$od" "$tmp/odq.safetensors" && quiet_is_silent output_dir
# reshard and to-universal take it too (they refused the output_dir), and say so
run 0 "$bin" reshard --to-world-size 3 "$od" "$tmp/od-r3" &&
  { head -1 "$tmp/err" | grep -qF "zckpt: $od: resharding $od/checkpoint-12, the newest complete checkpoint" ||
      { bad "reshard output_dir: checkpoint-12 not said"; cat "$tmp/err"; }
    diff -r "$tmp/od-r3" "$tmp/r3" >/dev/null || bad "reshard output_dir: not the reshard of checkpoint-12"; }
run 0 "$bin" to-universal "$od" "$tmp/od-u" &&
  { head -1 "$tmp/err" | grep -qF "zckpt: $od: converting $od/checkpoint-12, the newest complete checkpoint" ||
      { bad "to-universal output_dir: checkpoint-12 not said"; cat "$tmp/err"; }
    diff -r "$tmp/od-u" "$tmp/u" >/dev/null || bad "to-universal output_dir: not the folder of checkpoint-12"; }
run 0 "$bin" reshard -q --to-world-size 3 "$od" "$tmp/od-rq" && quiet_is_silent reshard output_dir
# verify of the output_dir checks the checkpoint consolidate takes (it checked every .pt below
# it one by one: a checkpoint-N missing a rank file was "clean" while consolidate refused it)
run 0 "$bin" verify "$od" && grep -qF "checked $od/checkpoint-12, the newest complete checkpoint" "$tmp/out" ||
  { bad "verify output_dir: expected checkpoint-12 checked"; cat "$tmp/out"; }
r1="$tmp/elsewhere/ck12/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
mv "$r1" "$tmp/r1.pt"
run 3 "$bin" verify "$od" && grep -q "^damaged: $od/checkpoint-12/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt: missing" "$tmp/out" ||
  { bad "verify output_dir: the missing rank file of checkpoint-12 not named"; cat "$tmp/out"; }
run 1 "$bin" consolidate "$od" "$tmp/od-missing.safetensors" || true
mv "$tmp/r1.pt" "$r1"
rm -rf "$od/checkpoint-2" "$od/checkpoint-10" "$od/checkpoint-12"
run 3 "$bin" verify "$od" && grep -q "^damaged: $od: no complete checkpoint-N folder (checkpoint-30 is incomplete" "$tmp/out" ||
  { bad "verify output_dir without a complete checkpoint"; cat "$tmp/out"; }
# a Trainer run without DeepSpeed (no `latest` anywhere): still checked file by file
mkdir -p "$tmp/plain_od/checkpoint-4" && cp "$tmp/one.safetensors" "$tmp/plain_od/checkpoint-4/model.safetensors"
run 0 "$bin" verify "$tmp/plain_od" && grep -q "^checked: 1 files" "$tmp/out" || { bad "verify of a plain output_dir"; cat "$tmp/out"; }
run 1 "$bin" consolidate "$od" "$tmp/none2.safetensors" &&
  { [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "^zckpt: error: $od: no complete checkpoint-N folder (checkpoint-30 is incomplete" "$tmp/err" ||
      { bad "output_dir without a complete checkpoint"; cat "$tmp/err"; }; }
[ ! -e "$tmp/none2.safetensors" ] || bad "output_dir without a complete checkpoint: output written"

[ "$fail" = 0 ] && echo "cli habits: all checks passed"
exit "$fail"
