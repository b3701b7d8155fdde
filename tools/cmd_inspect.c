/* cmd_inspect.c: `zckpt inspect PATH [--json]`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "commands.h"

static const char zck__inspect_help[] =
  "usage: zckpt inspect [--json] PATH\n"
  "\n"
  "Shows what PATH holds: a torch .pt/.bin file, a safetensors file, an HF index or\n"
  "checkpoint directory, a DeepSpeed checkpoint (root with `latest`, a tag folder, or an\n"
  "HF checkpoint-N/ folder), a universal folder (or the folder holding latest_universal),\n"
  "zckpt's HDF5 universal container or a torch Distributed Checkpoint: tensors with name,\n"
  "dtype, shape and bytes, and the other values summarised. A Trainer output_dir (holding\n"
  "checkpoint-N/ folders) stands for its newest complete checkpoint, as for consolidate and\n"
  "verify; stderr says which.\n"
  "\n"
  "options:\n"
  "  --json         machine-readable output\n"
  "  -h, --help     this help\n";

int zck_cmd_inspect(int argc, char **argv) {
  static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  zck_inspect_opts o = ZCK_INSPECT_OPTS_INIT;
  int c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (c) {
    case 'j': o.json = 1; break;
    case 'h': fputs(zck__inspect_help, stdout); return ZCK_EXIT_OK;
    default: return zck_cli_bad_option("inspect", c, argc, argv, opts);
    }
  }
  if (argc - optind != 1) return zck_cli_usage_error("inspect", "expected one PATH");
  for (int i = optind; i < argc; i++)
    if (!argv[i][0]) return zck_cli_usage_error("inspect", "empty path argument");
  /* a Trainer output_dir: its newest complete checkpoint-N, the one consolidate and verify
   * take (not a model.safetensors saved beside them), said on stderr */
  char *picked = NULL;
  int rc = zck_cli_pick_checkpoint(argv[optind], "inspecting", false, &picked);
  if (rc) return rc;
  zck_status s = zck_inspect(picked ? picked : argv[optind], &o, stdout);
  free(picked);
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}
