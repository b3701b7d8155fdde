#!/usr/bin/env bash
# cli_output_dir.sh: one rule for a Trainer output_dir in every command: inspect, verify and
# consolidate all take its newest complete checkpoint-N (not a model.safetensors saved
# beside the checkpoints), and stderr names the one taken.
set -u
bin=${ZCK_BIN:?}; ck=${ZCK_FIXTURES:?}/deepspeed/s2w2_bf16/ckpt
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
od="$tmp/output_dir"; mkdir "$od"
cp -r "$ck" "$od/checkpoint-2"; cp -r "$ck" "$od/checkpoint-4"
"$bin" convert -q "$ZCK_FIXTURES/safetensors/$(ls "$ZCK_FIXTURES/safetensors" | grep -m1 '\.safetensors$')" "$od/model.safetensors" ||
  { echo "FAIL: could not place a model.safetensors beside the checkpoints"; exit 1; }
"$bin" inspect "$od" >"$tmp/i.out" 2>"$tmp/i.err" || { echo "FAIL: inspect of the output_dir failed:"; cat "$tmp/i.err"; fail=1; }
head -1 "$tmp/i.out" | grep -q "^$od/checkpoint-4: DeepSpeed ZeRO-2 checkpoint" ||
  { echo "FAIL: inspect did not describe checkpoint-4:"; head -2 "$tmp/i.out"; fail=1; }
grep -q "inspecting $od/checkpoint-4, the newest complete checkpoint" "$tmp/i.err" ||
  { echo "FAIL: inspect did not say which checkpoint it took:"; cat "$tmp/i.err"; fail=1; }
"$bin" inspect --json "$od" 2>/dev/null | grep -q '"format":[[:space:]]*"deepspeed"' ||
  { echo "FAIL: inspect --json of the output_dir is not the DeepSpeed checkpoint"; fail=1; }
"$bin" verify "$od" >"$tmp/v.out" 2>&1 && grep -q "checked $od/checkpoint-4" "$tmp/v.out" ||
  { echo "FAIL: verify did not check checkpoint-4:"; cat "$tmp/v.out"; fail=1; }
"$bin" consolidate "$od" "$tmp/m" 2>"$tmp/c.err" && grep -q "consolidating $od/checkpoint-4" "$tmp/c.err" ||
  { echo "FAIL: consolidate did not take checkpoint-4:"; cat "$tmp/c.err"; fail=1; }
[ $fail = 0 ] && echo "ok: one output_dir rule"
exit $fail
