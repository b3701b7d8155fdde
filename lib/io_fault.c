/* io_fault.c: fault injection (ZCK_FAULT="op:N[:errno]", zck__io_fault_set): the Nth read,
 * write, fsync, rename or open fails, so the full-disk, EIO and crash paths are tested
 * without root. See io.h. */
#include "io.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Atomic uint64_t zck__fault_count[ZCK_IO_OP_COUNT];
static uint64_t zck__fault_nth[ZCK_IO_OP_COUNT];
static int zck__fault_errno[ZCK_IO_OP_COUNT];
static atomic_int zck__fault_parsed;

static void zck__fault_parse_env(void) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&zck__fault_parsed, &expected, 1)) return;
  const char *spec = getenv("ZCK_FAULT");
  if (!spec || !*spec) return;
  static const char *names[ZCK_IO_OP_COUNT] = {"read", "write", "fsync", "rename", "open"};
  char op[16] = {0}, err[16] = {0};
  unsigned long long nth = 0;
  int got = sscanf(spec, "%15[a-z]:%llu:%15s", op, &nth, err);
  if (got < 2) return;
  int e = EIO;
  if (got == 3) {
    if (!strcmp(err, "ENOSPC")) e = ENOSPC;
    else if (!strcmp(err, "EIO")) e = EIO;
    else if (!strcmp(err, "EDQUOT")) e = EDQUOT;
    else if (!strcmp(err, "SHORT")) e = -1; /* a short write: half the bytes then ENOSPC */
    else if (!strcmp(err, "KILL")) e = -9;  /* simulate a crash: _exit(137) */
  }
  for (int i = 0; i < ZCK_IO_OP_COUNT; i++)
    if (!strcmp(op, names[i])) { zck__fault_nth[i] = nth; zck__fault_errno[i] = e; }
}

void zck__io_fault_set(zck__io_op op, uint64_t nth, int err) {
  atomic_store(&zck__fault_parsed, 1);
  zck__fault_nth[op] = nth;
  zck__fault_errno[op] = err;
  atomic_store(&zck__fault_count[op], 0);
}

int zck__io_fault(zck__io_op op) {
  zck__fault_parse_env();
  if (!zck__fault_nth[op]) return 0;
  uint64_t n = atomic_fetch_add(&zck__fault_count[op], 1) + 1;
  if (n != zck__fault_nth[op]) return 0;
  if (zck__fault_errno[op] == -9) _exit(137);
  return zck__fault_errno[op];
}
