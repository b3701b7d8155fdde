#!/bin/sh
# mpirun_test.sh TEST_COMM_TCP: the collective suite as 3 ranks launched by Open MPI's
# mpirun, with rank and size from OMPI_COMM_WORLD_* and rank 0's address passed with -x
# (no MPI library is linked). Skipped (77) when mpirun is not installed (Debian:
# openmpi-bin).
bin=$1
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not installed (apt-get install openmpi-bin)"; exit 77; }
port=$("$bin" --free-port) || exit 1
# a 120 s ceiling: a hang fails the test instead of holding ctest
exec timeout 120 mpirun --allow-run-as-root --oversubscribe -np 3 \
  -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" -x ZCK_COMM_TIMEOUT_S=60 \
  "$bin" --env
