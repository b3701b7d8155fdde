/* verify_internal.h: the report under construction, shared by verify.c (the checks) and
 * verify_report.c (findings, printing). */
#ifndef ZCK_VERIFY_INTERNAL_H
#define ZCK_VERIFY_INTERNAL_H

#include "error.h"
#include "zck_verify_api.h"

#include <stdbool.h>

typedef struct zck__vreport {
  zck_verify_report pub;       /* first: the public view */
  zck_verify_finding *v;       /* strings owned (check names are static) */
  size_t n, cap;
  char *path, *kind, *detail, *manifest, *dir;
  zck_status first_unchecked;  /* status of the first UNCHECKABLE finding */
} zck__vreport;

zck__vreport *zck__vreport_new(const char *path);
/* Appends a finding; the message is formatted, file/tensor copied (may be NULL). Returns
 * false only without memory (the finding is lost; the result still counts it). */
bool zck__vreport_add(zck__vreport *r, zck_verify_severity sev, const char *check, const char *file,
                      const char *tensor, int64_t offset, uint64_t length, const char *fmt, ...) ZCK__PRINTF(8, 9);
/* Same, unless a finding with the same message exists (warnings repeated by two readers). */
bool zck__vreport_add_unique(zck__vreport *r, zck_verify_severity sev, const char *check, const char *msg);
void zck__vreport_set(char **field, const char *value);
/* Sets pub (result, findings) and returns the status zck_verify returns. */
zck_status zck__vreport_finish(zck__vreport *r);

#endif
