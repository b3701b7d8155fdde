/* cmd_verify.c: `zckpt verify PATH [--json] [--force]`. Exit 0 clean, 3 damaged, 1 could not
 * check (or a runtime error), 2 usage. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_dist.h"
#include "commands.h"
#include "zck.h" /* until it is merged into zck.h */

int zck_cmd_verify(int argc, char **argv);

static const char zck__verify_help[] =
  "usage: zckpt verify [options] PATH\n"
  "\n"
  "Checks that a checkpoint is whole and says where it is not: which file, which tensor,\n"
  "which bytes. PATH: a DeepSpeed checkpoint (root with `latest`, tag folder, or HF\n"
  "checkpoint-N/; a Trainer output_dir: its newest complete checkpoint-N, as consolidate\n"
  "takes it), a universal folder, zckpt's HDF5 universal container (its metadata,\n"
  "and every dataset decompressed), a safetensors file, index or folder, a torch .pt/.bin\n"
  "file, or any folder holding a zckpt-manifest.json.\n"
  "\n"
  "Always: the DeepSpeed file set (every rank present, world size, shapes add up), every\n"
  ".pt opened fully (zip directory, pickle, tensor geometry) with the CRC-32 of every zip\n"
  "record, safetensors headers and index. With a zckpt-manifest.json (written by zckpt):\n"
  "every file's size and XXH3, and each tensor's XXH3, so damage is pinned to a tensor.\n"
  "Every file is read once, files in parallel.\n"
  "\n"
  "options:\n"
  "  --json              machine-readable report on stdout\n"
  "  --force             check a folder zckpt marked incomplete (interrupted save) without\n"
  "                      counting the missing manifest as damage\n"
  "  -t, --tag TAG       DeepSpeed: the tag folder to check instead of `latest`\n"
  "  --structure-only    read no tensor data (no CRCs, no checksums)\n"
  "  --write-manifest    after a clean check of a folder without a manifest, record it in\n"
  "                      zckpt-manifest.json (checkpoints written by other tools): the\n"
  "                      files it checked, not the other files of the folder\n"
  "  -j, --threads N     worker threads (default: all cores)\n"
  "  -q, --quiet         no progress bar\n"
  "  -h, --help          this help\n"
  "\n"
  "exit status: 0 clean, 3 damaged, 1 could not check, 2 usage error.\n";

/* The report on stdout; a node-local source's view folder (mpirun) named as the user's path. */
static zck_status zck__verify_print(const zck_verify_report *r, int json) {
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  if (!m) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck_verify_report_print(r, json, m);
  if (fclose(m) != 0 && s == ZCK_OK) s = ZCK_ERR_NO_MEMORY;
  char *u = s == ZCK_OK ? zck_cli_dist_unview(text) : NULL;
  if (s == ZCK_OK && !u) s = ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK && (fputs(u, stdout) < 0 || fflush(stdout) != 0)) s = ZCK_ERR_IO;
  free(u);
  free(text);
  return s;
}

int zck_cmd_verify(int argc, char **argv) {
  static const struct option opts[] = {
    {"json", no_argument, 0, 'J'}, {"force", no_argument, 0, 'f'}, {"tag", required_argument, 0, 't'},
    {"structure-only", no_argument, 0, 's'}, {"write-manifest", no_argument, 0, 'w'},
    {"threads", required_argument, 0, 'j'}, {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};
  zck_verify_opts o = ZCK_VERIFY_OPTS_INIT;
  int json = 0, write_manifest = 0;
  bool quiet = false;
  int c, rc;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":hqt:j:", opts, NULL)) != -1) {
    switch (c) {
    case 'J': json = 1; break;
    case 'f': o.force = 1; break;
    case 't': o.tag = optarg; break;
    case 's': o.skip_data = 1; break;
    case 'w': write_manifest = 1; break;
    case 'j':
      if ((rc = zck_cli_opt_threads("verify", optarg, &o.threads))) return rc;
      break;
    case 'q': quiet = true; break;
    case 'h': fputs(zck__verify_help, stdout); return ZCK_EXIT_OK;
    default: return zck_cli_bad_option("verify", c, argc, argv, opts);
    }
  }
  if (argc - optind != 1) return zck_cli_usage_error("verify", "expected one PATH");
  for (int i = optind; i < argc; i++)
    if (!argv[i][0]) return zck_cli_usage_error("verify", "empty path argument");
  if (write_manifest && o.skip_data) return zck_cli_usage_error("verify", "--write-manifest needs the data check");
  zck_cli_progress bar;
  zck_cli_progress_init(&bar, "verify", 0, quiet || json);
  o.progress = zck_cli_progress_cb;
  o.progress_ctx = &bar;
  /* nothing there: the one error line every command gives, not a report of nothing checked
   * as well */
  struct stat path_st;
  if (lstat(argv[optind], &path_st) != 0 && errno == ENOENT)
    return zck_cli_error("%s: no such file or directory", argv[optind]);
  zck_verify_report *r = NULL;
  const char *src = argv[optind];
  if ((rc = zck_cli_dist_source(argv[optind], &src))) return rc; /* node-local files under mpirun */
  zck_status s = zck_verify(src, &o, &r);
  zck_cli_progress_finish(&bar);
  if (!r) return zck_cli_fail(s);
  int code = r->result == ZCK_VERIFY_CLEAN ? ZCK_EXIT_OK : r->result == ZCK_VERIFY_DAMAGED ? ZCK_EXIT_DAMAGED : ZCK_EXIT_ERROR;
  /* under mpirun every rank holds the same combined report: rank 0 prints it */
  if (!zck_cli_dist_quiet() && zck__verify_print(r, json) != ZCK_OK) code = zck_cli_fail(ZCK_ERR_IO);
  /* could not check: the report is on stdout; stderr gets the one line every zckpt
   * command gives for a runtime error (the first thing that could not be checked) */
  for (size_t i = 0; code == ZCK_EXIT_ERROR && r->result != ZCK_VERIFY_CLEAN && i < r->n_findings; i++) {
    if (r->findings[i].severity != ZCK_VERIFY_UNCHECKABLE) continue;
    zck_cli_error("%s", r->findings[i].message);
    break;
  }
  if (write_manifest && code == ZCK_EXIT_OK) {
    if (r->manifest) {
      if (!json && !zck_cli_dist_quiet()) printf("manifest: already present, not rewritten\n");
    } else if (r->single_file || !r->dir) { /* a file's folder may hold anything else */
      code = zck_cli_error("--write-manifest needs a folder, not a single file");
    } else {
      zck_cli_add_cleanup_dir(r->dir); /* the manifest's temporary file goes there */
      zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
      mo.threads = o.threads;
      zck_status ws = zck_verify_write_manifest(r, &mo); /* the files checked, nothing else */
      if (ws != ZCK_OK) code = zck_cli_fail(ws);
      else if (!json && !zck_cli_dist_quiet()) printf("manifest: written to %s/zckpt-manifest.json\n", r->dir);
    }
  }
  zck_verify_report_free(r);
  return code;
}
