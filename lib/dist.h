/* dist.h: one offline job run by every rank of an MPI group (`mpirun -np N zckpt ...`).
 *
 * Every rank runs the same job code on the same arguments, so each builds the same
 * description of the source, the same target layout and the same copy plans. Three
 * things differ, and they are all decided here and in exec_dist.c:
 *   - the copy: each plan run (zck_exec_run) is cut into shares, one per rank, by source
 *     record (so a record, and its CRC check, belongs to one rank and every source byte is
 *     read once); a rank is only given records of files its node holds;
 *   - the file system: rank 0 alone creates, names, truncates, writes headers into,
 *     commits or removes the output (lib/io_outfile.c asks zck__dist_writes()); the other ranks
 *     open rank 0's temporary files when a copy starts and write only their share's bytes
 *     with pwrite;
 *   - the results: the CRCs a writer needs of what the copy wrote are combined across
 *     ranks, and rank 0 commits only after every rank has said its share is written and
 *     synced.
 *
 * Ranks agree through zck__dist_agree at each such point: all ranks exchange (point,
 * status); a failure anywhere fails every rank (the others with "another rank failed"),
 * so each unwinds, rank 0 removing the temporary output. zck__dist_finish, called by every
 * rank when its command returns, keeps agreeing until all ranks have returned, then hands
 * every rank the exit code and the one message of the lowest rank that failed on its own.
 */
#ifndef ZCK_DIST_H
#define ZCK_DIST_H

#include "comm.h"
#include "exec.h"

#include <stdbool.h>
#include <stddef.h>

/* Makes this process one rank of a distributed job over c (size > 1). Collective. */
zck_status zck__dist_begin(zck_comm *c);
/* Leaves it (after zck__dist_finish). */
void zck__dist_end(void);
/* True between begin and end, unless paused. */
bool zck__dist_on(void);
/* Paused, rank 0 runs as a single process (a job one process must do alone); the others
 * wait in zck__dist_finish. */
void zck__dist_pause(bool paused);
int zck__dist_rank(void);  /* 0 when off */
int zck__dist_size(void);  /* 1 when off */
zck_comm *zck__dist_comm(void);
/* Whether this process does file system side effects now: always when off; rank 0; any
 * rank while it runs its share of a copy. */
bool zck__dist_writes(void);
/* The pid that names temporaries (".NAME.zck-tmp-<pid>"): rank 0's on every rank. */
long zck__dist_tmp_pid(void);

/* Points of agreement (each rank must pass the same ones in the same order). STEP: a job
 * made of two, the first one's output committed by rank 0 before any rank reads it. */
enum { ZCK__DIST_COPY_START = 1, ZCK__DIST_COPY_DONE, ZCK__DIST_HASHED, ZCK__DIST_CHECKED, ZCK__DIST_COMMIT,
       ZCK__DIST_MANIFEST, ZCK__DIST_STEP, ZCK__DIST_END = 100 };
/* Every rank reports (point, local); ZCK_OK when all are at `point` and OK. Otherwise a
 * rank that failed itself returns its own status (its message kept); the others get
 * ZCK_ERR_INTERNAL "another rank failed" and are marked followers. Off: returns local. */
zck_status zck__dist_agree(int point, zck_status local);
/* True once this rank failed only because another did. */
bool zck__dist_follower(void);

/* The end of the command on every rank: rc is this rank's exit code and msg its error
 * line (or NULL). Waits until every rank has ended, then returns the exit code of the
 * lowest rank that failed on its own (0 if none) and copies its message into out
 * (out_size bytes). */
int zck__dist_finish(int rc, const char *msg, char *out, size_t out_size);

/* Node-local sources (jobs/dist_view.c). Each rank reads the source under its own root
 * (the user's path, or its view of a checkpoint whose files are spread over the nodes'
 * local disks); a file's key is its path below the root, the same on every rank. */
void zck__dist_set_root(const char *root);
/* name without the root (and the slashes after it); name itself outside the root. */
const char *zck__dist_key(const char *name);
/* A stub: a file of the view this rank's node does not hold, with the metadata bytes its
 * holder sent; holes[2i], holes[2i+1] are byte ranges it lacks. */
zck_status zck__dist_add_stub(const char *path, const uint64_t *holes, size_t n_holes);
void zck__dist_clear_stubs(void);
/* Whether this rank's node holds the file (it is no stub). */
bool zck__dist_holds(const char *name);
/* A read of [off, off + n) of the open file fd: fails, naming it, when the bytes are on
 * another node (a hole of a stub). */
zck_status zck__dist_check_read(int fd, const char *name, uint64_t off, uint64_t n);
bool zck__dist_has_stubs(void);
/* Collective (defined in jobs/dist_view.c: it reads zip directories). Compares what the
 * ranks see under root: *view is NULL when every rank sees the same files (or no
 * distributed job runs); else a private folder of the whole tree to read instead of root
 * (links to this node's files, and stubs of the others' files holding only what describes
 * them: zip directories, headers, pickles, small records). Free with zck__dist_view_close. */
zck_status zck__dist_view_open(const char *root, char **view);
/* Removes the view folder (NULL is fine) and forgets its stubs. */
void zck__dist_view_close(char *view);

/* io_outfile.c's side of a rank > 0: output files rank 0 creates, opened here once it has. */
/* Registers fd (a placeholder) for the temporary file path rank 0 makes. */
void zck__dist_outfile_add(int fd, const char *path);
/* Forgets fd (closed by the caller). */
void zck__dist_outfile_remove(int fd);
/* Opens every registered file not yet open onto its placeholder fd. */
zck_status zck__dist_outfiles_open(void);
/* fdatasync of every open registered file (a share written, before it is reported). */
zck_status zck__dist_outfiles_sync(void);

/* Writes another rank made through a callback store: a writer that records what its
 * write function got (a CRC per range) registers how to record a range written elsewhere. */
typedef void (*zck__dist_noted_fn)(void *store_ctx, uint64_t elem_off, uint64_t count, uint32_t crc);
void zck__dist_register_noted(zck_store_write_fn write_fn, zck__dist_noted_fn noted);
zck__dist_noted_fn zck__dist_noted_for(zck_store_write_fn write_fn);

/* exec.c's runner of one process, and the shared run zck_exec_run hands over to when on. */
zck_status zck__exec_run_here(const zck_exec_job *jobs, size_t n_jobs, const zck_exec_opts *opts);
zck_status zck__exec_run_dist(const zck_exec_job *jobs, size_t n_jobs, const zck_exec_opts *opts);
/* Marks the run of this rank's share of a copy (its writes are allowed). */
void zck__dist_set_in_copy(bool on);

#endif
