/* cli_dist.h: a command run by every rank of an mpirun / srun job (cli_dist.c). */
#ifndef ZCK_CLI_DIST_H
#define ZCK_CLI_DIST_H

#include <stdbool.h>

#include "cli.h"

/* Runs the command: as it is outside an MPI launch (or with one rank); as one rank of a
 * distributed job in an MPI build (consolidate, reshard, to-universal, verify), the ranks agreeing
 * on the exit code and on the one error line rank 0 prints; refused with one line in a
 * build without MPI, or for a command that does not run distributed. */
int zck_cli_dist_run(const char *name, int (*run)(int, char **), int argc, char **argv);
/* While a distributed command runs: keeps its error line for the agreement instead of
 * printing it (true), else false. */
bool zck_cli_dist_take_error(const char *line);
/* From now on a signal ends the process with rc, silently (the command is over). */
void zck_cli_signals_after(int rc);
/* A command that one process must do alone (the HDF5 writer): false outside a distributed
 * job; there true on the ranks other than 0, which then return at once, and false on rank
 * 0, which runs the command as a single process. */
bool zck_cli_dist_solo(void);
/* The source path the job reads: in itself, or in a distributed job whose ranks see
 * different files under it (node-local disks), this rank's view of the whole checkpoint
 * (zck_dist_view_open; removed at the end). Returns ZCK_EXIT_OK or prints the error. */
int zck_cli_dist_source(const char *in, const char **src);
/* text with this rank's view folder named as the path the user gave (malloc'd; NULL
 * without memory). */
char *zck_cli_dist_unview(const char *text);
/* From the interruption handler: removes this rank's view folder, if any. */
void zck_cli_dist_interrupted(void);
/* True on the ranks other than 0 of a distributed command (usage errors are rank 0's). */
bool zck_cli_dist_quiet(void);

#endif
