/* cli_output.c: what a subcommand checks about its input and OUT before any work, and the
 * run of a job that reads a checkpoint (a Trainer output_dir's newest, OUT resolved and
 * checked, progress, the summary line). */
#include "cli.h"
#include "cli_dist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int zck_cli_check_out_not_in(const char *in, const char *out, const char *tag) {
  zck_status s = zck_check_out_not_input(in, out, tag);
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}

int zck_cli_check_folder_out(const char *cmd, const char *out) {
  static const char *const file_suffixes[] = {
    "safetensors", "bin", "pt", "pth", "ckpt", "txt", "json", "h5", "hdf5", "gguf", "npz", "npy", "pkl", "pickle",
    "zip", "tar", "gz", "tgz", "zst", "xz", "onnx", "msgpack", "distcp", "log", "csv", "yaml", "yml", "md"};
  size_t n = strlen(out);
  if (n && out[n - 1] == '/') return ZCK_EXIT_OK;   /* "name.txt/": said to be a folder */
  size_t b = n;
  while (b && out[b - 1] != '/') b--;
  const char *dot = NULL;
  for (size_t i = b + 1; i < n; i++)  /* a leading dot is a hidden name, not a suffix */
    if (out[i] == '.') dot = out + i;
  if (!dot) return ZCK_EXIT_OK;
  size_t len = (size_t)(out + n - dot - 1);
  for (size_t i = 0; i < sizeof file_suffixes / sizeof *file_suffixes; i++)
    if (strlen(file_suffixes[i]) == len && !strncasecmp(dot + 1, file_suffixes[i], len))
      return zck_cli_usage_error(cmd, "OUT '%s' names a .%s file, but %s writes a folder there: give a folder name", out,
                                 file_suffixes[i], cmd);
  return ZCK_EXIT_OK;
}

int zck_cli_resolve_out(const char *out, char **resolved) {
  /* the library writes through a folder's link by itself; resolved here too so the
   * input checks and the interruption clean-up see the folder the job writes */
  zck_status s = zck_resolve_out(out, resolved);
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}


int zck_cli_pick_checkpoint(const char *in, const char *verb, bool quiet, char **picked) {
  struct stat st;
  char latest[PATH_MAX];
  *picked = NULL;
  snprintf(latest, sizeof latest, "%s/latest", in);
  if (stat(in, &st) != 0 || !S_ISDIR(st.st_mode) || lstat(latest, &st) == 0) return ZCK_EXIT_OK;
  char *skipped = NULL;
  zck_status s = zck_hf_last_checkpoint(in, picked, &skipped);
  if (s == ZCK_ERR_NOT_FOUND) { zck_clear_error(); return ZCK_EXIT_OK; }
  if (s != ZCK_OK) return zck_cli_fail(s);
  if (!quiet)
    fprintf(stderr, "zckpt: %s: %s %s, the newest complete checkpoint%s%s%s\n", in, verb, *picked,
            skipped ? " (" : "", skipped ? skipped : "", skipped ? ")" : "");
  free(skipped);
  return ZCK_EXIT_OK;
}

int zck_cli_run_from_checkpoint(const zck_cli_ckpt_job *j, const char *in, const char *out) {
  int rc;
  bool quiet_line = j->quiet || zck_cli_dist_quiet();
  char *picked = NULL; /* a Trainer output_dir: its newest complete checkpoint, as consolidate */
  if (!j->tag && (rc = zck_cli_pick_checkpoint(in, j->verb, quiet_line, &picked))) return rc;
  if (picked) in = picked;
  char *out_r = NULL;
  if ((rc = zck_cli_resolve_out(out, &out_r))) { free(picked); return rc; }
  if ((rc = zck_cli_check_out_not_in(in, out_r, j->tag))) { free(out_r); free(picked); return rc; }
  zck_cli_set_output(out_r);
  zck_cli_progress bar;
  zck_cli_progress_init(&bar, j->name, 0, j->quiet);
  *j->progress = zck_cli_progress_cb;
  *j->progress_ctx = &bar;
  zck_job_summary sum;
  *j->summary = quiet_line ? NULL : &sum; /* counting OUT's files is a walk of it: only for the line */
  double started = zck_cli_now();
  const char *src = in;
  if ((rc = zck_cli_dist_source(in, &src))) { free(out_r); free(picked); return rc; } /* node-local files under mpirun */
  zck_status s = j->run(src, out_r, j->opts);
  zck_cli_progress_finish(&bar);
  free(out_r);
  free(picked);
  if (s == ZCK_OK) zck_cli_summary(out, "parameter", &sum, started, quiet_line);
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}

