/* comm_proc.h: processes for the multi-process comm tests: a free port, and waiting for
 * children with a deadline (a hung child fails the test instead of hanging it). */
#ifndef ZCK_TEST_COMM_PROC_H
#define ZCK_TEST_COMM_PROC_H

#include <sys/types.h>

/* A free TCP port on 127.0.0.1, kept from other processes (a bound socket, open until
 * exit) but open to rank 0's listen (SO_REUSEADDR). */
int cp_free_port(void);
/* Seconds on a monotonic clock. */
double cp_now(void);
/* Waits for the n children; codes[i] = exit status, or 128 + signal. After timeout_s the
 * ones left are killed (code -1). Returns the number that did not exit 0. */
int cp_wait(const pid_t *pids, int n, double timeout_s, int *codes);

#endif
