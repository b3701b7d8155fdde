#!/bin/sh
# mpirun_test.sh TEST_COMM_TCP: the collective suite as 3 ranks launched by Open MPI's
# mpirun, with rank and size from OMPI_COMM_WORLD_* and rank 0's address passed with -x
# (no MPI library is linked). Skipped (77) when mpirun is not installed (Debian:
# openmpi-bin).
bin=$1
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not installed (apt-get install openmpi-bin)"; exit 77; }
# test_comm_tcp --mpirun starts mpirun with a port it holds bound until mpirun is done
# (printing a free port and using it in a second process would race with other processes
# for it), under a 120 s ceiling: a hang fails the test instead of holding ctest
exec "$bin" --mpirun
