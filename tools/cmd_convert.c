/* cmd_convert.c: `zckpt convert IN OUT`: state dicts between torch and safetensors. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

static const char zck__convert_help[] =
  "usage: zckpt convert [options] IN OUT\n"
  "\n"
  "Converts a state dict of tensors. IN: a torch .pt/.bin file, a safetensors file, an\n"
  "HF index (*.safetensors.index.json) or directory. OUT: *.safetensors (one file),\n"
  "*.pt/*.bin (torch.save, loads with weights_only=True), or anything else: an HF\n"
  "directory (model.safetensors, or model-0000i-of-0000N.safetensors + index).\n"
  "\n"
  "options:\n"
  "  --dtype fp32|bf16|fp16   cast floating tensors (round to nearest even, as torch)\n"
  "  --max-shard-size SIZE    HF directory shards, HF units (5GB, 500MB, 2GiB); default 5GB\n"
  "  --format safetensors|hf|pt  force the output kind\n"
  "  -j, --threads N          worker threads (default: all cores)\n"
  "  --overwrite              replace an existing output\n"
  "  --no-verify              skip the zip CRC-32 checks of the tensor bytes read\n"
  "  -q, --quiet              no progress bar, no summary line (warnings stay)\n"
  "  -h, --help               this help\n";

int zck_cmd_convert(int argc, char **argv) {
  static const struct option opts[] = {
    {"dtype", required_argument, 0, 'd'}, {"max-shard-size", required_argument, 0, 's'},
    {"max_shard_size", required_argument, 0, 's'},
    {"format", required_argument, 0, 'f'}, {"threads", required_argument, 0, 'j'},
    {"overwrite", no_argument, 0, 'o'}, {"no-verify", no_argument, 0, 'V'}, {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};
  zck_convert_opts o = ZCK_CONVERT_OPTS_INIT;
  bool quiet = false;
  int c, rc;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":hqj:", opts, NULL)) != -1) {
    switch (c) {
    case 'd':
      if ((rc = zck_cli_opt_float_dtype("convert", optarg, &o.dtype))) return rc;
      break;
    case 's':
      if ((rc = zck_cli_opt_shard_size("convert", optarg, &o.max_shard_size))) return rc;
      break;
    case 'f':
      if (!strcmp(optarg, "safetensors")) o.format = ZCK_OUT_SAFETENSORS;
      else if (!strcmp(optarg, "hf")) o.format = ZCK_OUT_HF_DIR;
      else if (!strcmp(optarg, "pt")) o.format = ZCK_OUT_TORCH;
      else return zck_cli_usage_error("convert", "--format must be safetensors, hf or pt");
      break;
    case 'j':
      if ((rc = zck_cli_opt_threads("convert", optarg, &o.threads))) return rc;
      break;
    case 'o': o.overwrite = 1; break;
    case 'V': o.no_verify = 1; break;
    case 'q': quiet = true; break;
    case 'h': fputs(zck__convert_help, stdout); return ZCK_EXIT_OK;
    default: return zck_cli_bad_option("convert", c, argc, argv, opts);
    }
  }
  if (argc - optind != 2) return zck_cli_usage_error("convert", "expected IN and OUT");
  for (int i = optind; i < argc; i++)
    if (!argv[i][0]) return zck_cli_usage_error("convert", "empty path argument");
  char *out_r = NULL;
  if ((rc = zck_cli_resolve_out(argv[optind + 1], &out_r))) return rc;
  if ((rc = zck_cli_check_out_not_in(argv[optind], out_r, NULL))) { free(out_r); return rc; }
  zck_cli_set_output(out_r);
  zck_cli_progress bar;
  zck_cli_progress_init(&bar, "convert", 0, quiet);
  o.progress = zck_cli_progress_cb;
  o.progress_ctx = &bar;
  o.warning = zck_cli_warning; /* even with -q */
  zck_job_summary sum;
  o.summary = quiet ? NULL : &sum; /* counting OUT's files is a walk of it: only for the line */
  double started = zck_cli_now();
  zck_status s = zck_convert_file(argv[optind], out_r, &o);
  zck_cli_progress_finish(&bar);
  free(out_r);
  if (s == ZCK_OK) zck_cli_summary(argv[optind + 1], "tensor", &sum, started, quiet);
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}
