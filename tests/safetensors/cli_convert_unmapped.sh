#!/usr/bin/env bash
# cli_convert_unmapped.sh: `zckpt convert` of an HF sharded checkpoint whose shard holds a
# tensor that the index's weight_map leaves out (the unmapped-tensor warning). transformers'
# from_pretrained and huggingface_hub's load_torch_model load every tensor of each shard the
# map names, so convert keeps it, and says so: one "zckpt: warning: ..." line per reader
# warning on stderr, -q included. The old code dropped the tensor with exit 0 and no word.
set -u
bin="${ZCK_BIN:?ZCK_BIN must name the zckpt binary}"
fx="${ZCK_FIXTURES:?ZCK_FIXTURES must name tests/fixtures}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
# the NAME DTYPE SHAPE BYTES rows of `zckpt inspect`, sorted: a tensor set to compare
table() { "$bin" inspect "$1" | awk 'NR > 1 && $1 != "metadata:" && $1 != "NAME" && NF >= 4 && $0 !~ /tensors,/' | sort; }

# 14 tensors of every dtype in 6 shards; then "f16_special" (in shard 5, beside others)
# taken out of the weight_map, its bytes left in the shard
"$bin" convert -q "$fx/torch/dtypes.pt" "$tmp/all.safetensors" || bad "making all.safetensors"
"$bin" convert -q --max-shard-size 100B "$tmp/all.safetensors" "$tmp/hf" || bad "making the shards"
index="$tmp/hf/model.safetensors.index.json"
grep -q '"f16_special": "model-00005-of-00006.safetensors",' "$index" || bad "the fixture's index is not as expected"
sed -i '/"f16_special"/d' "$index"
grep -q '"f16_special"' "$index" && bad "f16_special still in the index"
shard="$tmp/hf/model-00005-of-00006.safetensors"
want_warning="zckpt: warning: $shard: tensor f16_special is absent from the weight_map; kept, as transformers loads every tensor of a shard"

for out in out.safetensors out.pt out_hf; do
  for q in "" -q; do
    rm -rf "${tmp:?}/$out"
    "$bin" convert $q "$tmp/hf" "$tmp/$out" >"$tmp/stdout" 2>"$tmp/stderr"; rc=$?
    [ "$rc" = 0 ] || { bad "convert $q -> $out: exit $rc"; cat "$tmp/stderr"; continue; }
    [ -s "$tmp/stdout" ] && bad "convert $q -> $out: wrote on stdout"
    # exactly the unmapped-tensor line, once (total_size counts every tensor: no total_size line)
    n=$(grep -c '^zckpt: warning: ' "$tmp/stderr")
    [ "$n" = 1 ] || { bad "convert $q -> $out: $n warning lines, expected 1"; cat "$tmp/stderr"; }
    grep -qxF "$want_warning" "$tmp/stderr" || { bad "convert $q -> $out: no line '$want_warning'"; cat "$tmp/stderr"; }
    if [ -n "$q" ]; then
      [ "$(wc -l <"$tmp/stderr")" = 1 ] || { bad "convert -q -> $out: stderr is more than the warning"; cat "$tmp/stderr"; }
    else
      grep -q "^wrote $tmp/$out: 14 tensors" "$tmp/stderr" || { bad "convert -> $out: no summary of 14 tensors"; cat "$tmp/stderr"; }
    fi
    # every tensor of the shards, the unmapped one included, with its dtype, shape and size
    table "$tmp/all.safetensors" >"$tmp/want.txt"
    table "$tmp/$out" >"$tmp/got.txt"
    diff -u "$tmp/want.txt" "$tmp/got.txt" || bad "convert $q -> $out: tensor set differs from the checkpoint's"
  done
done
# a convert that fails after reading (its output folder cannot be made) says one line, the
# failure: no warning about an output never written
mkdir "$tmp/ro" && chmod 500 "$tmp/ro"
if [ "$(id -u)" = 0 ]; then ro="$tmp/file-not-dir"; : >"$ro"; else ro="$tmp/ro"; fi  # root writes anywhere
"$bin" convert -q "$tmp/hf" "$ro/sub/out.safetensors" >"$tmp/stdout" 2>"$tmp/stderr"; rc=$?
[ "$rc" != 0 ] || bad "convert into an impossible folder: exit 0"
[ "$(wc -l <"$tmp/stderr")" = 1 ] && grep -q '^zckpt: error: ' "$tmp/stderr" ||
  { bad "convert into an impossible folder: not one error line"; cat "$tmp/stderr"; }
chmod 700 "$tmp/ro"

# the kept tensor's bytes are the shard's: round trip back to one file, byte-identical
# (the safetensors writer orders tensors by dtype and name, whatever order they came in)
"$bin" convert -q "$tmp/out.pt" "$tmp/back.safetensors" 2>/dev/null || bad "out.pt -> back.safetensors"
cmp -s "$tmp/all.safetensors" "$tmp/out.safetensors" || bad "out.safetensors differs from all.safetensors"
cmp -s "$tmp/all.safetensors" "$tmp/back.safetensors" || bad "back.safetensors (through .pt) differs from all.safetensors"

# inspect and verify of the same checkpoint say the same warning and list the tensor
"$bin" inspect "$tmp/hf" >"$tmp/inspect.txt" 2>&1 || bad "inspect exit $?"
grep -q "^f16_special " "$tmp/inspect.txt" || bad "inspect does not list f16_special"
"$bin" verify "$tmp/hf" >"$tmp/verify.txt" 2>&1; rc=$?
[ "$rc" = 0 ] || bad "verify exit $rc"
grep -q "tensor f16_special is absent from the weight_map; kept" "$tmp/verify.txt" || bad "verify lacks the unmapped-tensor warning"

# a checkpoint without such a tensor: no warning at all
"$bin" convert -q --max-shard-size 100B "$tmp/all.safetensors" "$tmp/hf2" || bad "making hf2"
"$bin" convert -q "$tmp/hf2" "$tmp/clean.safetensors" 2>"$tmp/stderr" || bad "convert of hf2"
[ -s "$tmp/stderr" ] && { bad "convert of a clean checkpoint wrote on stderr"; cat "$tmp/stderr"; }

[ "$fail" = 0 ] && echo "ok"
[ "$fail" = 0 ]
