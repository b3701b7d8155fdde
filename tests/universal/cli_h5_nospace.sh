#!/bin/sh
# cli_h5_nospace.sh ZCKPT FIXTURES: `zckpt to-universal --format hdf5` onto a full disk. A
# small tmpfs is filled at every phase of the write (dataset metadata, chunk writes, the
# final flush and close); each run must end with one error line naming the output, exit 1,
# and leave nothing behind (no crash in libhdf5's clean-up, no temporary file). Skipped
# (77) where mounting a tmpfs is not permitted. HDF5's own writes go through its sec2
# driver, out of reach of ZCK_FAULT, hence a real full disk.
set -u
BIN=$1
SRC=$2/deepspeed/s2w2_bf16/ckpt
T=$(mktemp -d)
M=$T/mnt
mkdir "$M"
cleanup() { umount "$M" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mount -t tmpfs -o size=64k tmpfs "$M" 2>/dev/null || { echo "cannot mount a tmpfs: skipped"; exit 77; }
umount "$M"

"$BIN" to-universal "$SRC" "$T/full.h5" --format hdf5 2>"$T/err" || fail "reference: $(cat "$T/err")"
kb=$(( $(wc -c <"$T/full.h5") / 1024 ))

# run SIZE_KB EXPECT(ok|fail) [ARGS...]
run() {
  size=$1; want=$2; shift 2
  mount -t tmpfs -o size=${size}k tmpfs "$M" || fail "mount ${size}k"
  "$BIN" to-universal "$SRC" "$M/u.h5" --format hdf5 "$@" >"$T/out" 2>"$T/err"
  rc=$?
  left=$(ls -A "$M")
  umount "$M"
  if [ "$want" = ok ]; then
    [ "$rc" = 0 ] || fail "${size}k: exit $rc: $(cat "$T/err")"
    return
  fi
  [ "$rc" = 1 ] || fail "${size}k $*: exit $rc, expected 1; stderr: $(cat "$T/err")"
  [ "$(wc -l <"$T/err")" = 1 ] || fail "${size}k $*: not one line on stderr: $(cat "$T/err")"
  grep -q "^zckpt: error: $M/u.h5.*No space left on device" "$T/err" ||
    fail "${size}k $*: unexpected message: $(cat "$T/err")"
  [ -z "$left" ] || fail "${size}k $*: left behind: $left"
}

for k in 8 12 16 24 32 $((kb / 4)) $((kb / 2)) $((kb * 3 / 4)) $((kb - 8)) $((kb - 2)) $((kb - 1)); do
  [ "$k" -ge 8 ] && [ "$k" -lt "$kb" ] && run $k fail
done
# small chunks: the disk fills in the middle of a dataset's chunks
for k in $((kb / 3)) $((kb / 2)) $((kb * 2 / 3)); do run $k fail --chunk-size 4KiB; done
run $((kb + 8)) ok
exit 0
