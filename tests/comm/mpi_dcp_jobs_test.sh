#!/usr/bin/env bash
# mpi_dcp_jobs_test.sh ZCKPT TEST_COMM_MPI: the torch Distributed Checkpoint jobs as
# distributed MPI jobs, as mpi_jobs_test.sh checks the DeepSpeed ones:
#  - consolidate of a DCP folder (3 .distcp files) at -np 2 and 3 equals a single-process
#    run byte for byte (an HF folder, and one bf16 file); with ZCK_DIST_TRACE=1 every rank
#    lists the items it reads: every rank reads some, no item is read by two;
#  - verify of a DCP folder at -np 2 prints the single-process report;
#  - reshard --to-format dcp of a DeepSpeed checkpoint at -np 2 writes the same .distcp
#    files as one process (the .metadata differs only by its fresh save_id: both folders
#    consolidate to the same bytes);
#  - reshard of a DCP folder to DeepSpeed, and to-universal of it (both formats), at -np 2
#    and 3 write the bytes of one process;
#  - an item damaged inside a .distcp file that rank 1 reads: one error line naming the
#    file, every rank exits 1, nothing written.
# Skipped (77) without mpirun or in a build without MPI.
set -uo pipefail
bin="$1" probe="$2"
fx="${ZCK_FIXTURES:?}"
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not installed (scripts/deps.sh)"; exit 77; }
"$probe" none; rc=$?
[ $rc = 77 ] || { [ $rc = 0 ] && { echo "SKIP: built without MPI"; exit 77; }; echo "FAIL: probe: $rc"; exit 1; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mp() { local np=$1; shift; timeout 300 mpirun --oversubscribe -np "$np" "$bin" "$@"; }
no_temps() { ! ls -A "$1" | grep -q 'zck-tmp\|zck-dcp' || fail "temporaries left in $1: $(ls -A "$1")"; }
n=0

# consolidate: the copy shared item by item
src="$fx/dcp/llama_untied_w3_fp32"
"$bin" consolidate -q "$src" "$tmp/c1" || fail "consolidate single"
"$bin" consolidate -q --dtype bf16 "$src" "$tmp/c1.safetensors" || fail "consolidate single file"
for np in 2 3; do
  ZCK_DIST_TRACE=1 mp $np consolidate -q "$src" "$tmp/c$np" 2>"$tmp/c$np.log" || fail "consolidate -np $np: $(cat "$tmp/c$np.log")"
  diff -r "$tmp/c1" "$tmp/c$np" >/dev/null || fail "consolidate -np $np differs: $(diff -r "$tmp/c1" "$tmp/c$np" | head -3)"
  for r in $(seq 0 $((np - 1))); do
    grep -q "^zckpt: rank $r: reads $src/__[0-9]_0.distcp: item " "$tmp/c$np.log" ||
      fail "consolidate -np $np: rank $r read no item: $(cat "$tmp/c$np.log")"
  done
  grep "^zckpt: rank [0-9]*: reads .*distcp: item " "$tmp/c$np.log" | sed 's/^zckpt: rank [0-9]*: //' | sort | uniq -d | grep -q . &&
    fail "consolidate -np $np: an item read by two ranks: $(cat "$tmp/c$np.log")"
  mkdir "$tmp/f$np"
  mp $np consolidate -q --dtype bf16 "$src" "$tmp/f$np/c.safetensors" || fail "consolidate -np $np one file"
  cmp "$tmp/c1.safetensors" "$tmp/f$np/c.safetensors" || fail "consolidate -np $np: one file differs"
  no_temps "$tmp/f$np"
  n=$((n + 1))
done

# verify: rank 0 prints the report of one process
"$bin" verify "$src" >"$tmp/v1.out" || fail "verify single"
mp 2 verify "$src" >"$tmp/v2.out" || fail "verify -np 2"
cmp "$tmp/v1.out" "$tmp/v2.out" || fail "verify -np 2: $(diff "$tmp/v1.out" "$tmp/v2.out")"
n=$((n + 1))

# DeepSpeed -> DCP: the same data files; the two folders hold the same state
ds="$fx/deepspeed/s3w2_bf16/ckpt"
"$bin" reshard -q --to-format dcp --to-world-size 3 "$ds" "$tmp/d1" || fail "reshard --to-format dcp single"
mp 2 reshard -q --to-format dcp --to-world-size 3 "$ds" "$tmp/d2" || fail "reshard --to-format dcp -np 2"
for f in "$tmp"/d1/*.distcp; do cmp "$f" "$tmp/d2/${f##*/}" || fail "reshard --to-format dcp -np 2: ${f##*/} differs"; done
"$bin" consolidate -q "$tmp/d1" "$tmp/d1.safetensors" && "$bin" consolidate -q "$tmp/d2" "$tmp/d2.safetensors" &&
  cmp "$tmp/d1.safetensors" "$tmp/d2.safetensors" || fail "reshard --to-format dcp -np 2: another state"
"$bin" verify -q "$tmp/d2" || fail "reshard --to-format dcp -np 2: verify"
n=$((n + 1))

# DCP -> DeepSpeed (reshard) and -> universal (to-universal, through a hidden DeepSpeed
# folder beside OUT that every rank reads once rank 0 has made it): the bytes of one process
"$bin" reshard -q --to-stage 2 --to-world-size 2 "$src" "$tmp/s1" || fail "reshard DCP single"
ZCK_DIST_TRACE=1 mp 2 reshard -q --to-stage 2 --to-world-size 2 "$src" "$tmp/s2" 2>"$tmp/s2.log" || fail "reshard DCP -np 2: $(cat "$tmp/s2.log")"
diff -r "$tmp/s1" "$tmp/s2" >/dev/null || fail "reshard DCP -np 2 differs: $(diff -r "$tmp/s1" "$tmp/s2" | head -3)"
for r in 0 1; do grep -q "^zckpt: rank $r: reads $src/__[0-9]_0.distcp: item " "$tmp/s2.log" || fail "reshard DCP -np 2: rank $r read no item"; done
for d in u1 u3 h1 h3; do mkdir "$tmp/$d"; done
"$bin" to-universal -q "$src" "$tmp/u1/u" || fail "to-universal DCP single"
mp 3 to-universal -q "$src" "$tmp/u3/u" 2>"$tmp/u3.log" || fail "to-universal DCP -np 3: $(cat "$tmp/u3.log")"
diff -r "$tmp/u1" "$tmp/u3" >/dev/null || fail "to-universal DCP -np 3 differs: $(diff -r "$tmp/u1" "$tmp/u3" | head -3)"
"$bin" to-universal -q --threads 1 "$src" "$tmp/h1/u.h5" || fail "to-universal DCP hdf5 single"
mp 2 to-universal -q --threads 1 "$src" "$tmp/h3/u.h5" 2>"$tmp/h3.log" || fail "to-universal DCP hdf5 -np 2: $(cat "$tmp/h3.log")"
cmp "$tmp/h1/u.h5" "$tmp/h3/u.h5" || fail "to-universal DCP hdf5 -np 2 differs"
no_temps "$tmp/u3"
no_temps "$tmp/h3"
n=$((n + 1))

# a damaged item that rank 1 reads: the first item rank 1 listed above, a byte inside its data
line=$(grep "^zckpt: rank 1: reads .*distcp: item " "$tmp/c2.log" | head -1)
file=$(echo "$line" | sed 's/^zckpt: rank 1: reads \(.*\.distcp\): item .*/\1/')
item_at=$(echo "$line" | sed 's/.* at byte \([0-9]*\) (at \([0-9]*\), .*/\1/')
rec_at=$(echo "$line" | sed 's/.* at byte \([0-9]*\) (at \([0-9]*\), .*/\2/')
[ -n "$file" ] && [ -n "$item_at" ] && [ -n "$rec_at" ] || fail "cannot read the trace line: $line"
cp -r "$src" "$tmp/bad"
bad="$tmp/bad/${file##*/}"
printf '\x55' | dd of="$bad" bs=1 seek=$((item_at + rec_at + 1)) conv=notrunc 2>/dev/null
ZCK_DIST_TRACE=1 mp 2 consolidate -q "$tmp/bad" "$tmp/o" >"$tmp/b.out" 2>"$tmp/b.log"; rc=$?
[ $rc = 1 ] && [ ! -e "$tmp/o" ] || fail "damaged: exit $rc: $(cat "$tmp/b.log")"
grep -q "^zckpt: rank 1: reads $bad: item " "$tmp/b.log" || fail "damaged: rank 1 did not read the file: $(cat "$tmp/b.log")"
[ "$(grep -c '^zckpt: error' "$tmp/b.log")" = 1 ] || fail "damaged: not one line: $(cat "$tmp/b.log")"
grep -q "^zckpt: error: $bad: .*CRC-32 mismatch" "$tmp/b.log" || fail "damaged: $(cat "$tmp/b.log")"
no_temps "$tmp"
n=$((n + 1))
echo "$n passed, 0 failed"
