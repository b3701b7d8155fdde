/* api_out.c: io.h's helpers that the public API offers (zck.h), for the zckpt command
 * and other programs that prepare an OUT the way the jobs write it. */
#include "io.h"
#include "zck.h"

zck_status zck_resolve_out(const char *path, char **resolved) { return zck__resolve_out(path, resolved); }
