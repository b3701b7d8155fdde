#!/bin/sh
# cli_h5_old.sh ZCKPT FIXTURES: a universal container written by an older zckpt still reads
# as it did. hdf5/zckpt-c9411c4-s2w2_bf16.h5 is `zckpt to-universal --format hdf5 -j 1` of
# deepspeed/s2w2_bf16/ckpt by zckpt at c9411c4 (HDF5 defaults then: chunk index nodes of 64
# entries, every dataset created before its data and written chunk by chunk). It verifies
# clean, inspects and reshards exactly as a container written now from the same source, and
# a damaged chunk in it is still refused.
set -u
BIN=$1
OLD=$2/hdf5/zckpt-c9411c4-s2w2_bf16.h5
SRC=$2/deepspeed/s2w2_bf16/ckpt
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$BIN" to-universal -q --format hdf5 "$SRC" "$T/new.h5" 2>"$T/err" || fail "to-universal: $(cat "$T/err")"
cp "$OLD" "$T/old.h5"
for v in old new; do
  "$BIN" verify "$T/$v.h5" >"$T/v.$v" 2>&1 || fail "$v container: verify exit $?: $(cat "$T/v.$v")"
  "$BIN" inspect "$T/$v.h5" 2>&1 | sed 1d >"$T/i.$v" || fail "$v container: inspect"
  "$BIN" reshard "$T/$v.h5" "$T/r.$v" --to-stage 3 --to-world-size 3 2>"$T/err" || fail "$v container: reshard: $(cat "$T/err")"
done
cmp "$T/i.old" "$T/i.new" || fail "inspect differs: $(diff "$T/i.old" "$T/i.new")"
diff -r "$T/r.old" "$T/r.new" >/dev/null || fail "the reshards of the old and the new container differ"
# 8 bytes overwritten at five offsets: each copy is refused in one line or reshards to the
# intact output (bytes nothing reads), and at least one is refused
caught=0
size=$(wc -c <"$T/old.h5")
for pct in 20 40 60 80 95; do
  off=$((size * pct / 100))
  cp "$T/old.h5" "$T/d.h5"
  printf '\245\132\245\132\245\132\245\132' | dd of="$T/d.h5" bs=1 seek="$off" conv=notrunc 2>/dev/null
  rm -rf "$T/r"
  if "$BIN" reshard "$T/d.h5" "$T/r" --to-stage 3 --to-world-size 3 >"$T/rout" 2>&1; then
    diff -r "$T/r.old" "$T/r" >/dev/null || fail "at $off: reshard of a damaged old container succeeded with another output"
  else
    [ "$(wc -l <"$T/rout")" = 1 ] || fail "at $off: not one line: $(cat "$T/rout")"
    caught=$((caught + 1))
  fi
done
[ "$caught" -ge 1 ] || fail "no damaged copy of the old container refused"
echo "ok ($caught of 5 damaged copies refused, the others read back exactly)"
