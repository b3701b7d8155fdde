/* comm_suite.h: the collective cases the MPI backend is checked on, their inputs, and the
 * local (threads) backend's results for them, which the MPI results must equal bit for bit. */
#ifndef ZCK_TEST_COMM_SUITE_H
#define ZCK_TEST_COMM_SUITE_H

#include "comm.h"

#include <stdbool.h>
#include <stddef.h>

enum { CS_ALL_REDUCE, CS_REDUCE_SCATTER, CS_ALL_GATHER, CS_BROADCAST, CS_BARRIER };

typedef struct cs_case {
  int kind;
  zck_dtype dt;
  zck_comm_op op;
  size_t count;  /* all_reduce/broadcast: count; reduce_scatter: recv_count; all_gather: send_count */
  int root;
  bool inplace;
} cs_case;

/* The cases for a world of W ranks; `big`: include buffers of several MB. *n set. malloc'd. */
cs_case *cs_cases(int W, bool big, size_t *n);
const char *cs_describe(const cs_case *c, char *buf, size_t n);

/* Bytes of a rank's buffer (input and output share it in the in-place forms: their size is
 * the larger one) and of the whole result (every rank's output concatenated for
 * reduce_scatter, one rank's output otherwise: the others are equal). */
size_t cs_buf_bytes(const cs_case *c, int W);
size_t cs_result_bytes(const cs_case *c, int W);

/* Runs case c on handle comm (any backend) with this rank's generated input; *out points
 * into the rank's buffer at its output (malloc'd buffer returned in *buf). */
zck_status cs_run(zck_comm *comm, const cs_case *c, int case_no, void **buf, const void **out, size_t *out_bytes);

/* The local backend's whole result for case c with W ranks (malloc'd, cs_result_bytes). */
void *cs_expected(const cs_case *c, int case_no, int W);

/* The gather collective on handle comm (any backend that has one), called by every rank:
 * several count patterns (zeros, root's own share, uneven; with `big`, several MB per rank),
 * roots 0 and W-1, bytes and floats. Root's recv must be every rank's input in rank order,
 * bit for bit; a rank other than root must leave its recv untouched. Returns this rank's
 * failures (printed to stderr). */
int cs_check_gather(zck_comm *comm, bool big);

/* Rank r's input elements [first, first+n) of case c (the generator behind cs_run). */
void cs_input(const cs_case *c, int case_no, int rank, void *dst, size_t first, size_t n);

/* Where rank r's output lies in the whole result. */
size_t cs_result_offset(const cs_case *c, int rank);

#endif
