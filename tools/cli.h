/* cli.h: shared habits of every zckpt subcommand.
 * Exit codes: 0 ok, 1 runtime error, 2 usage error (3 is verify's "damaged").
 * Messages are one line on stderr: "zckpt: error: FILE: what is wrong". */
#ifndef ZCK_CLI_H
#define ZCK_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "zck.h"

#include <getopt.h>

enum { ZCK_EXIT_OK = 0, ZCK_EXIT_ERROR = 1, ZCK_EXIT_USAGE = 2, ZCK_EXIT_DAMAGED = 3 };

typedef struct zck_cli_command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv); /* argv[0] is the command name */
} zck_cli_command;

/* Prints "zckpt: error: <msg>" and returns ZCK_EXIT_ERROR. */
int zck_cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A zck_warning_cb (ctx unused): prints "zckpt: warning: <message>", one line cleaned as
 * errors are; the job goes on. A job's warnings about its input stay with -q (which quiets
 * progress and the summary line), as verify's findings do: they say what the output alone
 * would not show. */
void zck_cli_warning(void *ctx, const char *message);
/* Prints the library's last error as a runtime error. */
int zck_cli_fail(zck_status s);
/* Prints "zckpt CMD: <msg> (see 'zckpt CMD --help')" and returns ZCK_EXIT_USAGE. */
int zck_cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An option getopt_long rejected: c is what it returned (':' a missing value, with an
 * optstring starting with ':'; '?' an unknown option). Prints the usage error, with the
 * closest long option of opts as a "did you mean". */
int zck_cli_bad_option(const char *cmd, int c, int argc, char **argv, const struct option *opts);
/* Refuses an OUT that is, holds or lies inside the input (zck_check_out_not_input), before
 * any work. Returns ZCK_EXIT_OK or prints a runtime error and returns ZCK_EXIT_ERROR. */
int zck_cli_check_out_not_in(const char *in, const char *out, const char *tag);
/* A job that writes a folder at OUT refuses (usage error, exit 2) an OUT whose name ends in
 * a suffix of a file kind (out.txt, model.json, weights.h5, ...): it would silently become
 * a folder of that name. */
int zck_cli_check_folder_out(const char *cmd, const char *out);
/* IN a Hugging Face Trainer output_dir (a folder without `latest`, checkpoint-N folders
 * inside): its newest complete checkpoint-N (zck_hf_last_checkpoint), said on stderr
 * unless quiet ("zckpt: IN: VERB PICKED, the newest complete checkpoint"); *picked: its
 * path (free it). Anything else stays as given (*picked NULL) for the job to judge. For
 * the jobs that read a DeepSpeed checkpoint (consolidate, reshard, to-universal), not
 * inspect: an output_dir's own files are what inspect describes. */
int zck_cli_pick_checkpoint(const char *in, const char *verb, bool quiet, char **picked);
/* OUT as the job should get it: a symlink to a folder (model/ -> /disk/model) is written
 * through, at its target, and stays a link (the jobs rename their output over OUT itself,
 * which would replace the link); a dangling one is refused. Sets *resolved (free it) or
 * prints a runtime error and returns 1. */
int zck_cli_resolve_out(const char *out, char **resolved);
/* Interruption (SIGINT, SIGTERM, SIGHUP): main() blocks them in every thread and one
 * thread waits for them; it then removes this process's temporary entries
 * (".NAME.zck-tmp-<pid>") from the folders registered here, puts back an earlier output
 * that a commit had moved aside, prints one line and exits 128+signal. */
void zck_cli_start_signal_thread(void);
void zck_cli_set_output(const char *out);     /* the command's OUT (its folder is cleaned) */
void zck_cli_add_cleanup_dir(const char *dir); /* another folder that may hold our temporaries */
/* Shared option values. Each returns ZCK_EXIT_OK, or prints the usage error for `cmd` and
 * returns ZCK_EXIT_USAGE, so a case reads: if ((rc = zck_cli_opt_threads(...))) return rc; */
int zck_cli_opt_threads(const char *cmd, const char *arg, unsigned *out);          /* 1..256 */
int zck_cli_opt_float_dtype(const char *cmd, const char *arg, zck_dtype *out);    /* fp32|bf16|fp16 */
int zck_cli_opt_shard_size(const char *cmd, const char *arg, uint64_t *out);      /* HF units, > 0 */

/* Progress shown only when stderr is a terminal and not quiet. */
typedef struct zck_cli_progress {
  bool enabled;
  const char *label;
  uint64_t total, done;
  double last_draw;
} zck_cli_progress;
void zck_cli_progress_init(zck_cli_progress *p, const char *label, uint64_t total, bool quiet);
void zck_cli_progress_update(void *p, uint64_t done_bytes);
/* A zck_progress_cb drawing the bar (total known only once the job starts). */
int zck_cli_progress_cb(void *p, uint64_t done_bytes, uint64_t total_bytes);
void zck_cli_progress_finish(zck_cli_progress *p);
/* Seconds on a monotonic clock, for the summary's duration. */
double zck_cli_now(void);
/* The one line on stderr after a job succeeded (not when quiet):
 * "wrote OUT: 148 tensors, 4.0 GB in 9.3 s"; what: "tensor" or "parameter". */
void zck_cli_summary(const char *out, const char *what, const zck_job_summary *sum, double started, bool quiet);
/* What a job that turns a DeepSpeed checkpoint into another folder (reshard, to-universal)
 * is handed by zck_cli_run_from_checkpoint: its options' progress and summary fields
 * (filled in), and the job itself on the source and the resolved OUT. */
typedef struct zck_cli_ckpt_job {
  const char *name;          /* "reshard": the progress bar's and the messages' command */
  const char *verb;          /* "resharding": said when a Trainer output_dir's checkpoint is picked */
  const char *tag;           /* --tag: a given tag means IN is a checkpoint, never an output_dir */
  bool quiet;
  zck_progress_cb *progress; /* the job's options' fields */
  void **progress_ctx;
  zck_job_summary **summary;
  zck_status (*run)(const char *src, const char *out, void *opts);
  void *opts;
} zck_cli_ckpt_job;
/* The common run of such a job, from IN and OUT as given: IN an output_dir becomes its
 * newest complete checkpoint, OUT is resolved and must not lie inside IN, the progress
 * bar, the node-local source under mpirun, then the summary line. Returns the exit code. */
int zck_cli_run_from_checkpoint(const zck_cli_ckpt_job *j, const char *in, const char *out);
/* Prints a shape as [a, b, c]. */
void zck_cli_format_shape(char *buf, size_t n, const int64_t *shape, int ndim);

#endif
