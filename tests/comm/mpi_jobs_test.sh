#!/usr/bin/env bash
# mpi_jobs_test.sh ZCKPT TEST_COMM_MPI: the offline jobs as distributed MPI jobs
# (`mpirun -np N zckpt consolidate|reshard|to-universal|verify ...`) on this host:
#  - the output equals a single-process run's, byte for byte (cmp / diff -r), at -np 2, 3, 4;
#  - the copy is shared: with ZCK_DIST_TRACE=1 every rank lists the source records it
#    reads, and at -np 4 over 4 rank files every rank reads some;
#  - a damaged rank file that only a rank other than 0 reads: one error line naming it,
#    every rank exits 1, nothing left behind (no OUT, no temporary), an earlier OUT intact;
#  - a command that does not run distributed, and a usage error, say so once.
# Skipped (77) without mpirun or in a build without MPI (scripts/deps.sh installs both).
set -uo pipefail
bin="$1" probe="$2"
fx="${ZCK_FIXTURES:?}/deepspeed"
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not installed (scripts/deps.sh)"; exit 77; }
"$probe" none; rc=$?
[ $rc = 77 ] || { [ $rc = 0 ] && { echo "SKIP: built without MPI"; exit 77; }; echo "FAIL: probe: $rc"; exit 1; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# LeakSanitizer (the sanitizer build) would report Open MPI's own allocations at exit
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mp() { local np=$1; shift; timeout 300 mpirun --oversubscribe -np "$np" "$bin" "$@"; }
n=0
same() { # what single dist
  diff -r "$2" "$3" >/dev/null || fail "$1: differs from the single-process run: $(diff -r "$2" "$3" | head -3)"
  n=$((n + 1))
}
errs() { grep -c '^zckpt' "$1"; }
no_temps() { # folder
  ! ls -A "$1" | grep -q 'zck-tmp' || fail "temporaries left in $1: $(ls -A "$1")"
}

# consolidate: a folder of safetensors + .bin (zip CRCs combined across ranks), and one file
src="$fx/s2w4_fp32_3groups/ckpt"
"$bin" consolidate -q --format both "$src" "$tmp/c1" || fail "consolidate single"
"$bin" consolidate -q --dtype bf16 "$src" "$tmp/c1.safetensors" || fail "consolidate single file"
for np in 2 3 4; do
  mp $np consolidate -q --format both "$src" "$tmp/c$np" || fail "consolidate -np $np"
  same "consolidate -np $np" "$tmp/c1" "$tmp/c$np"
  mkdir "$tmp/f$np"
  ZCK_DIST_TRACE=1 mp $np consolidate -q --dtype bf16 "$src" "$tmp/f$np/c.safetensors" 2>"$tmp/f$np.log" ||
    fail "consolidate -np $np one file: $(cat "$tmp/f$np.log")"
  cmp "$tmp/c1.safetensors" "$tmp/f$np/c.safetensors" || fail "consolidate -np $np: one file differs"
  no_temps "$tmp/f$np"
  # every rank reads a share, and each record is read by one rank
  for r in $(seq 0 $((np - 1))); do
    grep -q "^zckpt: rank $r: reads " "$tmp/f$np.log" || fail "consolidate -np $np: rank $r read nothing: $(cat "$tmp/f$np.log")"
  done
  # (only the `reads` lines: two ranks' closing `read N bytes, T s` lines may well be equal)
  grep '^zckpt: rank [0-9]*: reads ' "$tmp/f$np.log" | sed 's/^zckpt: rank [0-9]*: //' | sort | uniq -d | grep -q . &&
    fail "consolidate -np $np: a record read by two ranks: $(cat "$tmp/f$np.log")"
  n=$((n + 1))
done

# reshard (the DeepSpeed writer's storage CRCs gathered from every rank)
src3="$fx/s3w4_fp32_3groups/ckpt"
"$bin" reshard -q --to-stage 2 --to-world-size 3 "$src3" "$tmp/r1" || fail "reshard single"
for np in 2 4; do
  ZCK_DIST_TRACE=1 mp $np reshard -q --to-stage 2 --to-world-size 3 "$src3" "$tmp/r$np" 2>"$tmp/r$np.log" ||
    fail "reshard -np $np: $(cat "$tmp/r$np.log")"
  same "reshard -np $np" "$tmp/r1" "$tmp/r$np"
  # the output bytes rank 0 did not write are hashed for its manifest by one rank each,
  # not all read back by rank 0 (nor by every rank)
  for f in zero_pp_rank_0_mp_rank_00_optim_states.pt zero_pp_rank_1_mp_rank_00_optim_states.pt \
           zero_pp_rank_2_mp_rank_00_optim_states.pt mp_rank_00_model_states.pt; do
    [ "$(grep -c "reads .*\.r$np\.zck-tmp-.*/$f (whole" "$tmp/r$np.log")" = 1 ] ||
      fail "reshard -np $np: $f not hashed by exactly one rank: $(cat "$tmp/r$np.log")"
  done
  grep -q "^zckpt: rank [1-9]: reads .*\.r$np\.zck-tmp-" "$tmp/r$np.log" || fail "reshard -np $np: rank 0 hashed every output file"
done

# to-universal: the DeepSpeed layout shared out; HDF5 written by rank 0 alone (libhdf5
# places chunks as they come: --threads 1 makes the file the same bytes run to run)
for d in u1 u3 h1 h3; do mkdir "$tmp/$d"; done
"$bin" to-universal -q --inject-missing-state "$src" "$tmp/u1/u" || fail "to-universal single"
mp 3 to-universal -q --inject-missing-state "$src" "$tmp/u3/u" || fail "to-universal -np 3"
same "to-universal -np 3" "$tmp/u1" "$tmp/u3"
"$bin" to-universal -q --threads 1 "$src3" "$tmp/h1/u.h5" || fail "to-universal hdf5 single"
mp 3 to-universal -q --threads 1 "$src3" "$tmp/h3/u.h5" || fail "to-universal hdf5 -np 3"
cmp "$tmp/h1/u.h5" "$tmp/h3/u.h5" || fail "to-universal hdf5 -np 3 differs"
n=$((n + 1))
# reshard from the universal folder and from the HDF5 container, shared
"$bin" reshard -q --to-stage 1 --to-world-size 2 "$tmp/u1/u" "$tmp/ru1" || fail "reshard universal single"
mp 3 reshard -q --to-stage 1 --to-world-size 2 "$tmp/u1/u" "$tmp/ru3" || fail "reshard universal -np 3"
same "reshard from universal -np 3" "$tmp/ru1" "$tmp/ru3"
"$bin" reshard -q --to-world-size 2 "$tmp/h1/u.h5" "$tmp/rh1" || fail "reshard hdf5 single"
mp 2 reshard -q --to-world-size 2 "$tmp/h1/u.h5" "$tmp/rh2" || fail "reshard hdf5 -np 2"
same "reshard from hdf5 -np 2" "$tmp/rh1" "$tmp/rh2"

# verify: each file read by one rank, rank 0 prints the report of one process (clean, and
# damaged: exit 3, the same findings), --json too
"$bin" verify "$tmp/r1" >"$tmp/v1.out"; rc=$?
[ $rc = 0 ] || fail "verify single: $rc"
"$bin" verify --json "$src" >"$tmp/vj1.out" || fail "verify --json single"
for np in 2 4; do
  mp $np verify "$tmp/r1" >"$tmp/v$np.out" || fail "verify -np $np"
  cmp "$tmp/v1.out" "$tmp/v$np.out" || fail "verify -np $np: $(diff "$tmp/v1.out" "$tmp/v$np.out")"
  mp $np verify --json "$src" >"$tmp/vj$np.out" || fail "verify --json -np $np"
  cmp "$tmp/vj1.out" "$tmp/vj$np.out" || fail "verify --json -np $np: $(diff "$tmp/vj1.out" "$tmp/vj$np.out")"
  n=$((n + 1))
done
cp -r "$tmp/r1" "$tmp/rbad"
printf '\x55' | dd of="$(ls "$tmp"/rbad/global_step*/zero_pp_rank_2_mp_rank_00_optim_states.pt)" bs=1 seek=3000 conv=notrunc 2>/dev/null
"$bin" verify "$tmp/rbad" >"$tmp/vb1.out"; rc=$?
[ $rc = 3 ] || fail "verify damaged single: $rc"
mp 3 verify "$tmp/rbad" >"$tmp/vb3.out" 2>"$tmp/vb3.err"; rc=$?
[ $rc = 3 ] && cmp "$tmp/vb1.out" "$tmp/vb3.out" || fail "verify damaged -np 3: $rc: $(diff "$tmp/vb1.out" "$tmp/vb3.out")"
! grep -q '^zckpt' "$tmp/vb3.err" || fail "verify damaged -np 3: $(cat "$tmp/vb3.err")"
n=$((n + 1))

# node-local disks (DeepSpeed's use_node_local_storage), simulated on one host: node A holds
# rank files 0 and 1, node B 2 and 3, both the model states and `latest`. On a cluster the
# path is the same on every node; here MPMD gives each rank its node's folder. The ranks
# see different files, build views (links + stubs) and each reads only its node's files.
for nd in A B; do
  mkdir -p "$tmp/n$nd/ckpt/global_step2"
  cp "$src/latest" "$tmp/n$nd/ckpt/"
  cp "$src"/global_step2/mp_rank_00_model_states.pt "$tmp/n$nd/ckpt/global_step2/"
done
cp "$src"/global_step2/zero_pp_rank_[01]_* "$tmp/nA/ckpt/global_step2/"
cp "$src"/global_step2/zero_pp_rank_[23]_* "$tmp/nB/ckpt/global_step2/"
mkdir "$tmp/tmpdir"
nl() { # ranks-on-A ranks-on-B command args-before-CKPT -- args-after-CKPT
  local a=$1 b=$2 cmd=$3; shift 3
  local pre=() post=()
  while [ "$1" != -- ]; do pre+=("$1"); shift; done; shift
  post=("$@")
  TMPDIR="$tmp/tmpdir" timeout 300 mpirun --oversubscribe -np "$a" "$bin" "$cmd" "${pre[@]}" "$tmp/nA/ckpt" "${post[@]}" : \
    -np "$b" "$bin" "$cmd" "${pre[@]}" "$tmp/nB/ckpt" "${post[@]}"
}
"$bin" consolidate -q "$src" "$tmp/nl1" || fail "node-local: single"
for ab in "2 1" "2 2"; do
  set -- $ab
  ZCK_DIST_TRACE=1 nl $1 $2 consolidate -q -- "$tmp/nl$1$2" 2>"$tmp/nl$1$2.log" || fail "node-local $ab: $(cat "$tmp/nl$1$2.log")"
  same "node-local consolidate $ab" "$tmp/nl1" "$tmp/nl$1$2"
  grep -E "^zckpt: rank [01]: reads .*zero_pp_rank_[23]_" "$tmp/nl$1$2.log" && fail "node-local $ab: node A read B's file"
  grep -E "^zckpt: rank [23]: reads .*zero_pp_rank_[01]_" "$tmp/nl$1$2.log" && fail "node-local $ab: node B read A's file"
  for r in $(seq 0 $(($1 + $2 - 1))); do
    grep -q "^zckpt: rank $r: reads " "$tmp/nl$1$2.log" || fail "node-local $ab: rank $r read nothing: $(cat "$tmp/nl$1$2.log")"
  done
done
"$bin" reshard -q --to-stage 3 --to-world-size 2 "$src" "$tmp/nr1" || fail "node-local reshard single"
nl 2 2 reshard -q --to-stage 3 --to-world-size 2 -- "$tmp/nr4" || fail "node-local reshard"
same "node-local reshard" "$tmp/nr1" "$tmp/nr4"
"$bin" verify "$src" | sed "s|^$src:|CKPT:|" >"$tmp/nv1.out"
nl 2 2 verify -- | sed "s|^$tmp/nA/ckpt:|CKPT:|" >"$tmp/nv4.out" || fail "node-local verify"
cmp "$tmp/nv1.out" "$tmp/nv4.out" || fail "node-local verify: $(diff "$tmp/nv1.out" "$tmp/nv4.out")"
# node B's ranks die without running a handler (the fault injector's _exit in the middle
# of their reads, as SIGKILL or the OOM killer): mpirun ends the others; rank 0 removes its
# temporaries and says so once; the dead ranks' views stay until the next job on the node
# removes them (named as zckpt temporaries, their writers gone)
TMPDIR="$tmp/tmpdir" timeout 300 mpirun --oversubscribe -np 2 "$bin" consolidate -q "$tmp/nA/ckpt" "$tmp/nlk" : \
  -np 2 env ZCK_FAULT=read:20:KILL "$bin" consolidate -q "$tmp/nB/ckpt" "$tmp/nlk" >/dev/null 2>"$tmp/nlk.log" && fail "node-local kill: exit 0"
[ ! -e "$tmp/nlk" ] || fail "node-local kill: output written"
no_temps "$tmp"
[ "$(errs "$tmp/nlk.log")" = 1 ] && grep -q "^zckpt: error: $tmp/nlk: interrupted by SIGTERM; nothing written" "$tmp/nlk.log" ||
  fail "node-local kill: $(cat "$tmp/nlk.log")"
ls -A "$tmp/tmpdir" | grep -q '^\.zckpt-nodelocal\.zck-tmp-' || fail "node-local kill: no view left, the ranks did not die mid-job"
nl 2 2 verify -- >/dev/null || fail "node-local verify after a kill"
[ -z "$(ls -A "$tmp/tmpdir")" ] || fail "node-local: views of killed ranks left: $(ls -A "$tmp/tmpdir")"
no_temps "$tmp"
# a damaged file on node B: the line names it as B's ranks see it
fB="$tmp/nB/ckpt/global_step2/zero_pp_rank_3_mp_rank_00_optim_states.pt"
printf '\x55' | dd of="$fB" bs=1 seek=6400 conv=notrunc 2>/dev/null
nl 2 2 consolidate -q -- "$tmp/nlbad" 2>"$tmp/nlb.log"; rc=$?
[ $rc = 1 ] && [ ! -e "$tmp/nlbad" ] && [ "$(errs "$tmp/nlb.log")" = 1 ] || fail "node-local damaged: exit $rc: $(cat "$tmp/nlb.log")"
grep -q "^zckpt: error: $fB: record data/9 .*CRC-32 mismatch" "$tmp/nlb.log" || fail "node-local damaged: $(cat "$tmp/nlb.log")"
[ -z "$(ls -A "$tmp/tmpdir")" ] || fail "node-local: views left: $(ls -A "$tmp/tmpdir")"
no_temps "$tmp"
n=$((n + 1))

# a damaged rank file only rank 2 reads: one line naming it, all ranks exit 1, nothing written
cp -r "$src" "$tmp/bad"
f="$(ls "$tmp"/bad/global_step*/zero_pp_rank_2_mp_rank_00_optim_states.pt)"
printf '\x55' | dd of="$f" bs=1 seek=6400 conv=notrunc 2>/dev/null
mkdir "$tmp/o" && echo earlier >"$tmp/o/keep"
ZCK_DIST_TRACE=1 mp 4 consolidate -q --overwrite "$tmp/bad" "$tmp/o" >"$tmp/b.out" 2>"$tmp/b.log"; rc=$?
[ $rc = 1 ] || fail "damaged: exit $rc: $(cat "$tmp/b.log")"
grep -q "^zckpt: rank [123]: reads $f" "$tmp/b.log" || fail "damaged: rank 0 read the file: $(cat "$tmp/b.log")"
[ "$(grep '^zckpt: error' "$tmp/b.log" | wc -l)" = 1 ] || fail "damaged: not one line: $(cat "$tmp/b.log")"
grep -q "^zckpt: error: $f: record data/9 .*CRC-32 mismatch" "$tmp/b.log" || fail "damaged: $(cat "$tmp/b.log")"
[ "$(ls -A "$tmp/o")" = keep ] && [ "$(cat "$tmp/o/keep")" = earlier ] || fail "damaged: earlier output changed"
no_temps "$tmp"
mp 3 consolidate -q "$tmp/bad" "$tmp/o2" 2>"$tmp/b2.log"; rc=$?
[ $rc = 1 ] && [ ! -e "$tmp/o2" ] && [ "$(errs "$tmp/b2.log")" = 1 ] || fail "damaged -np 3: exit $rc: $(cat "$tmp/b2.log")"
no_temps "$tmp"
n=$((n + 1))

# one line for a usage error and for a command that does not run distributed
mp 2 consolidate --no-such-option 2>"$tmp/u.log"; rc=$?
[ $rc = 2 ] && [ "$(errs "$tmp/u.log")" = 1 ] || fail "usage: exit $rc: $(cat "$tmp/u.log")"
mp 2 convert "$tmp/c1/model.safetensors" "$tmp/x.bin" 2>"$tmp/v.log"; rc=$?
[ $rc = 1 ] && [ ! -e "$tmp/x.bin" ] && [ "$(errs "$tmp/v.log")" = 1 ] || fail "convert: exit $rc: $(cat "$tmp/v.log")"
grep -q "^zckpt: error: convert does not run on several ranks" "$tmp/v.log" || fail "convert: $(cat "$tmp/v.log")"
# the line comes from rank 0 while mpirun may already be ending the others: said once,
# never lost, never followed by an "interrupted" (a race: several tries at -np 4)
for try in 1 2 3 4 5; do
  mp 4 inspect "$tmp/c1/model.safetensors" >/dev/null 2>"$tmp/v.log"; rc=$?
  [ $rc = 1 ] && [ "$(errs "$tmp/v.log")" = 1 ] || fail "inspect -np 4, try $try: exit $rc: $(cat "$tmp/v.log")"
done
n=$((n + 1))
echo "$n passed, 0 failed"
