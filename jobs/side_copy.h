/* side_copy.h: a source's other files taken into a job's output as they are, each checked as far as its format
 * allows (side_copy.c). */
#ifndef ZCK_SIDE_COPY_H
#define ZCK_SIDE_COPY_H

#include "io.h"

/* Copies a source's other file from into to (created; the whole file or nothing), checked as its format allows in
 * the same pass (a zip's record CRCs, a safetensors header and sizes, JSON syntax): DAMAGED (one line naming from)
 * and nothing at `to` when it fails. A file of no format with a check of its own is copied as it is. */
zck_status zck__copy_side_file(const char *from, const char *to);
/* The n bytes of text are one JSON value as Python's json module writes it (NaN, Infinity and -Infinity included),
 * in UTF-8; else DAMAGED: "NAME: not JSON: what at byte N". */
zck_status zck__json_check(const char *name, const void *text, size_t n);

#endif
