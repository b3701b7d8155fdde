/* comm_agree.c: one outcome for every rank of a group (comm.h: zck_comm_agree), so that
 * rank processes that each did their part of a step all stop at the same point when one
 * of them failed. */
#include "comm.h"

#include "error.h"

#include <stdio.h>

static _Thread_local bool g_agreed;

bool zck_comm_agree_reached_all(void) { return g_agreed; }
void zck_comm_agree_reset(void) { g_agreed = false; }

zck_status zck_comm_agree(zck_comm *c, zck_status s) {
  char msg[1024] = "";
  if (s != ZCK_OK) snprintf(msg, sizeof msg, "%s", zck_last_error());
  int32_t first = s != ZCK_OK ? c->rank : c->size;
  zck_status cs = c->all_reduce(c, &first, &first, 1, ZCK_I32, ZCK_COMM_MIN);
  int32_t st = (int32_t)s;
  if (cs == ZCK_OK && first < c->size) cs = c->broadcast(c, &st, 1, ZCK_I32, first);
  if (cs == ZCK_OK && first < c->size) cs = c->broadcast(c, msg, sizeof msg, ZCK_U8, first);
  if (cs == ZCK_OK && first < c->size) g_agreed = true;
  if (s != ZCK_OK) return zck__fail(s, "%s", msg); /* ours first: the collective may have overwritten it */
  if (cs != ZCK_OK) return cs;
  if (first == c->size) return ZCK_OK;
  msg[sizeof msg - 1] = 0;
  return zck__fail((zck_status)st, "rank %d: %s", first, msg);
}
