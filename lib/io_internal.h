/* io_internal.h: what the io*.c files share with each other and nobody else includes. */
#ifndef ZCK_IO_INTERNAL_H
#define ZCK_IO_INTERNAL_H

#include "io.h"
#include "dist.h"

#include <stdbool.h>

/* A rank other than 0 of a distributed job: it computes rank 0's names but creates,
 * commits and removes nothing (see io_outfile.c). */
static inline bool zck__follower(void) { return zck__dist_on() && zck__dist_rank() != 0; }

/* io_temp.c: "<dir>/.<name>.zck-tmp-<pid>" for a final path (rank 0's pid in a distributed
 * job), and the folder holding a path (trailing '/' ignored); NULL when out of memory. */
char *zck__tmp_sibling(const char *final_path);
char *zck__parent_dir(const char *path);
/* io_temp.c: the temporary trees of this process's open outdirs. A file created inside one
 * is durable once the outdir is: it needs no fsync or rename of its own. */
void zck__open_dirs_add(const char *tmp_path);
void zck__open_dirs_remove(const char *tmp_path);
bool zck__in_open_dir(const char *path);
/* io_temp.c: sweeps final_path's folder of the temporaries of dead writers (errors ignored). */
void zck__clean_stale_temps(const char *final_path);

#endif
