#!/usr/bin/env bash
# cli_test.sh: the zckpt command's contract: exit codes (0 ok, 1 runtime error, 2 usage
# error), one-line "zckpt: error: FILE: what" messages on stderr, --help on stdout, and
# exact stdout for inspect of committed fixtures (golden/*.out).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
bin="${ZCK_BIN:?ZCK_BIN must name the zckpt binary}"
fx="${ZCK_FIXTURES:-$here/../fixtures}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail=0; n=0
check() { # name expected_rc cmd...
  local name="$1" want="$2"; shift 2
  n=$((n + 1))
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ "$rc" != "$want" ]; then echo "FAIL $name: exit $rc, expected $want"; cat "$tmp/err"; fail=$((fail + 1)); return 1; fi
  return 0
}
stderr_is_one_line() { # name pattern
  local lines; lines=$(wc -l <"$tmp/err")
  if [ "$lines" != 1 ] || ! grep -qE "$2" "$tmp/err"; then
    echo "FAIL $1: stderr should be one line matching /$2/:"; cat "$tmp/err"; fail=$((fail + 1))
  fi
}
golden() { # name: compare stdout with golden/name.out (paths relative to fixtures)
  local g="$here/golden/$1.out"
  sed "s|$fx|FIXTURES|g" "$tmp/out" >"$tmp/out.norm"
  if [ "${UPDATE:-0}" = 1 ]; then cp "$tmp/out.norm" "$g"; return; fi
  if ! diff -u "$g" "$tmp/out.norm"; then echo "FAIL $1: stdout differs from golden"; fail=$((fail + 1)); fi
}

check version 0 "$bin" --version && grep -qE '^zckpt [0-9]+\.[0-9]+\.[0-9]+$' "$tmp/out" || { echo "FAIL version output"; fail=$((fail+1)); }
check help 0 "$bin" --help && grep -q "^commands:" "$tmp/out" || { echo "FAIL help"; fail=$((fail+1)); }
check no-args 2 "$bin"
check unknown-command 2 "$bin" frobnicate && stderr_is_one_line unknown-command "unknown command 'frobnicate'.*--help"
check unknown-option 2 "$bin" --frob
for cmd in inspect convert consolidate reshard; do
  check "$cmd-help" 0 "$bin" "$cmd" --help && grep -q "^usage: zckpt $cmd" "$tmp/out" || { echo "FAIL $cmd --help"; fail=$((fail+1)); }
  check "$cmd-bad-option" 2 "$bin" "$cmd" --no-such-option && stderr_is_one_line "$cmd-bad-option" "^zckpt $cmd: unknown option"
  check "$cmd-no-args" 2 "$bin" "$cmd"
done
check convert-bad-dtype 2 "$bin" convert --dtype int3 a b && stderr_is_one_line convert-bad-dtype "dtype"
check convert-bad-size 2 "$bin" convert --max-shard-size 5XB a b && stderr_is_one_line convert-bad-size "max-shard-size"

# runtime errors: one line naming the file, exit 1, nothing written
check inspect-missing 1 "$bin" inspect "$tmp/nope.pt" && stderr_is_one_line inspect-missing "^zckpt: error: $tmp/nope.pt: "
check inspect-legacy 1 "$bin" inspect "$fx/torch/legacy.pt" && stderr_is_one_line inspect-legacy "legacy.pt: legacy torch serialization"
printf 'garbage that is no checkpoint' >"$tmp/garbage.safetensors"
check convert-garbage 1 "$bin" convert "$tmp/garbage.safetensors" "$tmp/out.pt" && stderr_is_one_line convert-garbage "garbage.safetensors"
[ ! -e "$tmp/out.pt" ] || { echo "FAIL convert-garbage left output"; fail=$((fail+1)); }
check consolidate-not-ckpt 1 "$bin" consolidate "$tmp" "$tmp/o" && stderr_is_one_line consolidate-not-ckpt "^zckpt: error: "
[ ! -e "$tmp/o" ] || { echo "FAIL consolidate-not-ckpt left output"; fail=$((fail+1)); }

check reshard-bad-stage 2 "$bin" reshard --to-stage 4 a b && stderr_is_one_line reshard-bad-stage "to-stage"
check reshard-bad-world 2 "$bin" reshard --to-world-size 0 a b && stderr_is_one_line reshard-bad-world "to-world-size"
check reshard-nothing 2 "$bin" reshard a b
if [ -d "$fx/deepspeed/s3w2_bf16/ckpt" ]; then
  check reshard-ok 0 "$bin" reshard -q --to-stage 1 --to-world-size 3 "$fx/deepspeed/s3w2_bf16/ckpt" "$tmp/r"
  check reshard-exists 1 "$bin" reshard -q --to-stage 1 "$fx/deepspeed/s3w2_bf16/ckpt" "$tmp/r" && stderr_is_one_line reshard-exists "exists"
  check reshard-inspect 0 "$bin" inspect "$tmp/r" && grep -q "ZeRO-1 checkpoint, tag global_step2, world size 3" "$tmp/out" || { echo "FAIL reshard-inspect"; fail=$((fail+1)); }
fi

# goldens: exact inspect output of committed fixtures
check inspect-torch 0 "$bin" inspect "$fx/torch/dtypes.pt" && golden inspect-torch
check inspect-torch-nested 0 "$bin" inspect "$fx/torch/nested.pt" && golden inspect-torch-nested
check inspect-safetensors-json 0 "$bin" inspect --json "$fx/safetensors/dtypes.safetensors" && golden inspect-safetensors-json
if [ -d "$fx/deepspeed/s2w2_bf16/ckpt" ]; then
  check inspect-deepspeed 0 "$bin" inspect "$fx/deepspeed/s2w2_bf16/ckpt" && golden inspect-deepspeed
fi

# round trip through the CLI: pt -> safetensors -> sharded dir -> pt, values equal
check conv1 0 "$bin" convert -q "$fx/torch/dtypes.pt" "$tmp/a.safetensors"
check conv2 0 "$bin" convert -q --max-shard-size 100B "$tmp/a.safetensors" "$tmp/hf"
check conv3 0 "$bin" convert -q "$tmp/hf" "$tmp/b.pt"
check conv-exists 1 "$bin" convert -q "$tmp/hf" "$tmp/b.pt" && stderr_is_one_line conv-exists "exists"
check inspect-a 0 "$bin" inspect "$tmp/a.safetensors"; sed 1d "$tmp/out" | grep -v "^metadata:" | sort >"$tmp/a.txt"
check inspect-b 0 "$bin" inspect "$tmp/b.pt"; sed 1d "$tmp/out" | sort >"$tmp/b.txt"
diff -q "$tmp/a.txt" "$tmp/b.txt" >/dev/null || { echo "FAIL round trip tables differ"; fail=$((fail+1)); }

echo "$((n - fail)) passed, $fail failed"
[ "$fail" = 0 ]
