/* test_comm_env.c: zck_comm_env_options and zck_comm_env_local_rank over the launchers'
 * variables (torchrun, Open MPI, MPICH): what is read, and a one-line error naming the
 * variable and its value for everything malformed or inconsistent. */
#include "test.h"

#include "comm.h"

static const char *all_vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                 "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                 "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "ZCK_COMM_TIMEOUT_S"};

/* Clears every launcher variable, then sets "NAME=value" pairs. */
static void env(const char *const *kv) {
  for (size_t i = 0; i < sizeof all_vars / sizeof *all_vars; i++) unsetenv(all_vars[i]);
  for (; kv && *kv; kv++) {
    const char *eq = strchr(*kv, '=');
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(eq - *kv), *kv);
    setenv(name, eq + 1, 1);
  }
}

#define ENV(...) env((const char *const[]){__VA_ARGS__, NULL})

static void expect_error(const char *needle) {
  zck_comm_tcp_options o;
  bool found = true;
  ZT_ERR(zck_comm_env_options(&o, &found), ZCK_ERR_INVALID_ARG, needle);
  if (strchr(zck_last_error(), '\n')) ZT_FAIL("\"%s\" is more than one line", zck_last_error());
}

int main(void) {
  zck_comm_tcp_options o;
  bool found = true;

  /* nothing set: one process, nothing found */
  env(NULL);
  ZT_OK(zck_comm_env_options(&o, &found));
  ZT_ASSERT(!found && o.rank == 0 && o.size == 1 && o.timeout_s == 0);
  ZT_EQ_INT(zck_comm_env_local_rank(), -1);

  /* torchrun */
  ENV("RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "MASTER_ADDR=node7", "MASTER_PORT=29500");
  ZT_OK(zck_comm_env_options(&o, &found));
  ZT_ASSERT(found && o.rank == 3 && o.size == 4 && o.master_port == 29500);
  ZT_EQ_STR(o.master_addr, "node7");
  ZT_EQ_INT(zck_comm_env_local_rank(), 1);

  /* a one-rank world needs no address */
  ENV("RANK=0", "WORLD_SIZE=1");
  ZT_OK(zck_comm_env_options(&o, &found));
  ZT_ASSERT(found && o.rank == 0 && o.size == 1);
  ZT_EQ_STR(o.master_addr, "127.0.0.1");
  ZT_EQ_INT(zck_comm_env_local_rank(), -1);

  /* malformed numbers */
  ENV("RANK=abc", "WORLD_SIZE=4", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("RANK=abc: not a rank");
  ENV("RANK=", "WORLD_SIZE=4", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("RANK=: not a rank");
  ENV("RANK=-1", "WORLD_SIZE=4", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("RANK=-1: not a rank");
  ENV("RANK=1 ", "WORLD_SIZE=4", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("RANK=1 : not a rank");
  ENV("RANK=0", "WORLD_SIZE=0", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("WORLD_SIZE=0: not a world size");
  ENV("RANK=0", "WORLD_SIZE=99999999999999999999", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("WORLD_SIZE=99999999999999999999: not a world size");
  ENV("RANK=4", "WORLD_SIZE=4", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("RANK=4 is not below WORLD_SIZE=4");
  ENV("RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=4", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("LOCAL_RANK=4: not a local rank");
  ENV("RANK=1", "WORLD_SIZE=4", "LOCAL_RANK=x", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("LOCAL_RANK=x: not a local rank");
  ZT_EQ_INT(zck_comm_env_local_rank(), -1);

  /* half a pair */
  ENV("RANK=1", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("RANK=1 is set but WORLD_SIZE is not");
  ENV("WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=1");
  expect_error("WORLD_SIZE=2 is set but RANK is not");

  /* rank 0's address */
  ENV("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h");
  expect_error("MASTER_PORT (rank 0's port) is not set but WORLD_SIZE=2");
  ENV("RANK=1", "WORLD_SIZE=2", "MASTER_PORT=29500");
  expect_error("MASTER_ADDR (rank 0's host) is not set but WORLD_SIZE=2");
  ENV("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=", "MASTER_PORT=29500");
  expect_error("MASTER_ADDR (rank 0's host) is not set");
  ENV("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=0");
  expect_error("MASTER_PORT=0: not a port (1..65535)");
  ENV("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=65536");
  expect_error("MASTER_PORT=65536: not a port");
  ENV("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=29500x");
  expect_error("MASTER_PORT=29500x: not a port");
  ENV("RANK=0", "WORLD_SIZE=1", "MASTER_PORT=http");
  expect_error("MASTER_PORT=http: not a port");

  /* Open MPI's mpirun */
  ENV("OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=0", "MASTER_ADDR=10.0.0.1",
      "MASTER_PORT=1234");
  ZT_OK(zck_comm_env_options(&o, &found));
  ZT_ASSERT(found && o.rank == 2 && o.size == 3 && o.master_port == 1234);
  ZT_EQ_STR(o.master_addr, "10.0.0.1");
  ZT_EQ_INT(zck_comm_env_local_rank(), 0);
  ENV("OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3", "MASTER_ADDR=10.0.0.1");
  expect_error("MASTER_PORT (rank 0's port) is not set but OMPI_COMM_WORLD_SIZE=3 (under mpirun pass it with -x");
  ENV("OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=3", "MASTER_ADDR=a", "MASTER_PORT=1");
  expect_error("OMPI_COMM_WORLD_RANK=3 is not below OMPI_COMM_WORLD_SIZE=3");
  ENV("OMPI_COMM_WORLD_SIZE=3", "MASTER_ADDR=a", "MASTER_PORT=1");
  expect_error("OMPI_COMM_WORLD_SIZE=3 is set but OMPI_COMM_WORLD_RANK is not");

  /* MPICH / Intel MPI */
  ENV("PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=1", "MASTER_ADDR=a", "MASTER_PORT=2");
  ZT_OK(zck_comm_env_options(&o, &found));
  ZT_ASSERT(found && o.rank == 1 && o.size == 2 && o.master_port == 2);
  ZT_EQ_INT(zck_comm_env_local_rank(), 1);
  ENV("PMI_RANK=x1", "PMI_SIZE=2", "MASTER_ADDR=a", "MASTER_PORT=2");
  expect_error("PMI_RANK=x1: not a rank");

  /* torchrun's variables win over mpirun's (torchrun started under mpirun) */
  ENV("RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1",
      "OMPI_COMM_WORLD_LOCAL_RANK=0", "MASTER_ADDR=a", "MASTER_PORT=2");
  ZT_OK(zck_comm_env_options(&o, &found));
  ZT_ASSERT(o.rank == 1 && o.size == 2);
  ZT_EQ_INT(zck_comm_env_local_rank(), 1);

  /* timeout */
  ENV("ZCK_COMM_TIMEOUT_S=2.5");
  ZT_OK(zck_comm_env_options(&o, &found));
  ZT_ASSERT(!found && o.timeout_s == 2.5);
  ENV("ZCK_COMM_TIMEOUT_S=soon");
  expect_error("ZCK_COMM_TIMEOUT_S=soon: not a positive number of seconds");
  ENV("ZCK_COMM_TIMEOUT_S=-1");
  expect_error("ZCK_COMM_TIMEOUT_S=-1");
  env(NULL);
  return 0;
}
