#!/usr/bin/env bash
# cli_out_names.sh: an OUT named like a file (out.txt, model.json, ...) is never silently
# made a folder: consolidate writes one .safetensors/.bin/.pt file or a folder, and refuses
# any other file name (exit 2, one line, nothing written); reshard and to-universal (unless
# --format ds asks for a folder) refuse them too; a plain or dotted folder name still works.
set -u
bin=${ZCK_BIN:?}; ck=${ZCK_FIXTURES:?}/deepspeed/s2w2_bf16/ckpt
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
refused() { # WHAT OUT CMD...: exit 2, one stderr line naming OUT, nothing at OUT
  local what=$1 out=$2; shift 2
  "$@" 2>"$tmp/err" >/dev/null; local rc=$?
  [ $rc = 2 ] || { echo "FAIL: $what: exit $rc, expected 2"; fail=1; }
  [ "$(wc -l <"$tmp/err")" = 1 ] && grep -qF "$(basename "$out")" "$tmp/err" ||
    { echo "FAIL: $what: stderr is not one line naming OUT:"; cat "$tmp/err"; fail=1; }
  [ ! -e "$out" ] || { echo "FAIL: $what: $out was made"; fail=1; }
}
refused "consolidate to out.txt" "$tmp/out.txt" "$bin" consolidate -q "$ck" "$tmp/out.txt"
refused "consolidate to model.JSON" "$tmp/model.JSON" "$bin" consolidate -q "$ck" "$tmp/model.JSON"
refused "reshard to ckpt.zip" "$tmp/ckpt.zip" "$bin" reshard -q --to-world-size 1 "$ck" "$tmp/ckpt.zip"
refused "to-universal to u.json" "$tmp/u.json" "$bin" to-universal -q "$ck" "$tmp/u.json"
# an explicit --format ds asks for a folder, whatever its name
"$bin" to-universal -q --inject-missing-state --format ds "$ck" "$tmp/v.json" && [ -d "$tmp/v.json/zero" ] ||
  { echo "FAIL: to-universal --format ds to v.json is not a folder"; fail=1; }
# what OUT's name asks for
"$bin" consolidate -q "$ck" "$tmp/one.safetensors" && [ -f "$tmp/one.safetensors" ] ||
  { echo "FAIL: consolidate to one.safetensors is not one file"; fail=1; }
"$bin" consolidate -q "$ck" "$tmp/llama-3.1" && [ -f "$tmp/llama-3.1/model.safetensors" ] ||
  { echo "FAIL: consolidate to the folder llama-3.1"; fail=1; }
"$bin" consolidate -q "$ck" "$tmp/model.txt/" && [ -d "$tmp/model.txt" ] ||
  { echo "FAIL: an OUT ending in / is a folder whatever its name"; fail=1; }
[ $fail = 0 ] && echo "ok: OUT names"
exit $fail
