#!/usr/bin/env bash
# cli_padded_header.sh: a safetensors file whose JSON header starts with spaces
# (safetensors loads it; files written by hand or by old writers pad so). The reader took
# it, but the jobs' file-type sniffing wanted '{' right after the length and called it "not
# a torch .pt/.bin, safetensors file or checkpoint directory". inspect, verify and convert
# now take it, and convert writes the same tensors as the unpadded file's.
set -u
bin="${ZCK_BIN:?ZCK_BIN must name the zckpt binary}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
# FILE HEADER: an 8-byte little-endian length, HEADER, then 16 bytes of data (4 float32)
mk() {
  local n=${#2}
  printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8)))" >"$1"
  printf '%s' "$2" >>"$1"
  printf '\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40' >>"$1"
}
json='{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}'
mk "$tmp/plain.safetensors" "$json"
mk "$tmp/padded.safetensors" "   $json     "
for f in plain padded; do
  "$bin" inspect "$tmp/$f.safetensors" >"$tmp/$f.inspect" 2>"$tmp/err" || bad "inspect $f: $(cat "$tmp/err")"
  "$bin" verify "$tmp/$f.safetensors" >"$tmp/$f.verify" 2>&1 || bad "verify $f: $(cat "$tmp/$f.verify")"
  "$bin" convert -q "$tmp/$f.safetensors" "$tmp/$f.out.safetensors" 2>"$tmp/err" || bad "convert $f: $(cat "$tmp/err")"
done
grep -q "^a " "$tmp/padded.inspect" || bad "inspect of the padded file does not list a"
cmp -s "$tmp/plain.out.safetensors" "$tmp/padded.out.safetensors" || bad "convert of the padded file differs from the plain one's"
[ "$fail" = 0 ] && echo "ok"
