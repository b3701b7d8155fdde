#!/usr/bin/env bash
# mpi_test.sh TEST_COMM_MPI: the MPI backend under Open MPI's mpirun on this host.
#  - the collective suite at -np 2, 3, 4 (--oversubscribe: more ranks than cores) gives the
#    local backend's bits;
#  - a rank killed with SIGKILL from outside (its pid, written by the rank): mpirun ends the
#    job, exits non-zero, and the survivors print exactly one line naming the dead rank;
#  - a rank that hangs: the waiting rank prints one line after ZCK_COMM_TIMEOUT_S and
#    MPI_Abort ends the job;
#  - a malformed ZCK_COMM_TIMEOUT_S is refused.
# Skipped (77) without mpirun or in a build without MPI (scripts/deps.sh installs both).
set -uo pipefail
bin="$1"
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not installed (scripts/deps.sh)"; exit 77; }
"$bin" none; rc=$?
[ $rc = 77 ] || { [ $rc = 0 ] && { echo "SKIP: built without MPI (checked that it says so)"; exit 77; }; echo "FAIL: none: $rc"; exit 1; }
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# mpirun's SIGKILL follows its SIGTERM after 1 s by default: on a loaded machine a rank
# might not run its SIGTERM handler (the one line naming a dead peer) that soon (mpirun
# waits the whole delay: 2 s, not more)
export OMPI_MCA_odls_base_sigkill_timeout=2
# LeakSanitizer (the sanitizer build) would report Open MPI's own allocations at exit
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
run() { timeout 300 mpirun --oversubscribe "$@"; }
n=0

for W in 2 3 4; do
  run -np $W "$bin" suite >"$tmp/s.log" 2>&1 || fail "suite -np $W: $(tail -5 "$tmp/s.log")"
  grep -q "W=$W: .* equal to the local backend" "$tmp/s.log" || fail "suite -np $W: $(tail -3 "$tmp/s.log")"
  n=$((n + 1))
done

run -np 1 "$bin" env >"$tmp/e.log" 2>&1 || fail "env: $(tail -5 "$tmp/e.log")"
n=$((n + 1))

# a dead peer: kill -9 of the real rank process
for W in 2 3; do
  rm -f "$tmp/pid"
  run -np $W "$bin" die "$tmp" >"$tmp/d.out" 2>"$tmp/d.log" &
  job=$!
  for i in $(seq 600); do [ -s "$tmp/pid" ] && break; sleep 0.05; done
  [ -s "$tmp/pid" ] || fail "die -np $W: rank 1 wrote no pid: $(cat "$tmp/d.log")"
  pid=$(cat "$tmp/pid")
  sleep 0.3
  kill -9 "$pid" || fail "die -np $W: cannot kill $pid"
  wait $job; rc=$?
  [ $rc != 0 ] && [ $rc != 124 ] || fail "die -np $W: mpirun exit $rc: $(cat "$tmp/d.log")"
  lines=$(grep -c "rank 1 (pid $pid) died" "$tmp/d.log")
  [ "$lines" = 1 ] || fail "die -np $W: $lines lines name rank 1: $(cat "$tmp/d.log")"
  grep -Eq "^test_comm_mpi: error: rank [02]: rank 1 \(pid $pid\) died; mpirun stopped the job$" "$tmp/d.log" ||
    fail "die -np $W: $(cat "$tmp/d.log")"
  pgrep -f -- "$bin die $tmp" >/dev/null && fail "die -np $W: ranks left: $(pgrep -af -- "$bin die")"
  n=$((n + 1))
done

# a hung peer
ZCK_COMM_TIMEOUT_S=1 run -np 2 "$bin" hang >"$tmp/h.out" 2>"$tmp/h.log"; rc=$?
[ $rc != 0 ] && [ $rc != 124 ] || fail "hang: mpirun exit $rc: $(cat "$tmp/h.log")"
grep -q "^test_comm_mpi: error: rank 0: mpi comm: barrier: the other ranks did not arrive within 1 s (ZCK_COMM_TIMEOUT_S): aborting the job$" \
  "$tmp/h.log" || fail "hang: $(cat "$tmp/h.log")"
[ "$(grep -c "did not arrive" "$tmp/h.log")" = 1 ] || fail "hang: not one line: $(cat "$tmp/h.log")"
pgrep -f -- "$bin hang" >/dev/null && fail "hang: ranks left: $(pgrep -af -- "$bin hang")"
n=$((n + 1))
echo "$n passed, 0 failed"
