/* cmd_to_universal.c: `zckpt to-universal SRC OUT [--format ds|hdf5]`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zck.h"
#include "cli.h"
#include "cli_dist.h"

static const char zck__to_universal_help[] =
  "usage: zckpt to-universal [options] CHECKPOINT OUT\n"
  "\n"
  "Converts a DeepSpeed ZeRO-1/2/3 checkpoint with its optimizer state into a universal\n"
  "checkpoint, reading each rank file once, with no temporary tree.\n"
  "CHECKPOINT: the save root holding `latest`, a tag folder (global_stepN), or a Hugging\n"
  "Face checkpoint-N/ folder; or a torch Distributed Checkpoint (FSDP2, Accelerate, HF\n"
  "Trainer FSDP), taken as the ZeRO-3 checkpoint `zckpt reshard` makes of it (built in a\n"
  "hidden folder beside OUT, then removed).\n"
  "  --format ds (default): OUT is the folder DeepSpeed's ds_to_universal.py writes\n"
  "     (zero/<param>/fp32.pt, exp_avg.pt, exp_avg_sq.pt, step.pt, zero/optimizer_state.pt,\n"
  "     the model-states files), and OUT's parent gets `latest_universal`; load it with\n"
  "     \"checkpoint\": {\"load_universal\": true}.\n"
  "  --format hdf5: OUT is one HDF5 file, a dataset per parameter and state, chunked and\n"
  "     compressed with zstd (filter 32015); h5py reads it after `import hdf5plugin`.\n"
  "\n"
  "options:\n"
  "  --format ds|hdf5          output layout (default: hdf5 for an OUT named *.h5 or\n"
  "                            *.hdf5, else ds)\n"
  "  -t, --tag TAG             the tag folder to read instead of `latest`\n"
  "  --inject-missing-state    ds, stage 1/2: accept a checkpoint without\n"
  "                            universal_checkpoint_info (as ds_to_universal's\n"
  "                            --inject_missing_state; HF and plain DeepSpeed runs need it)\n"
  "  (ds_to_universal.py's --input_folder, --output_folder and --inject_missing_state\n"
  "   are accepted too)\n"
  "  --level N                 hdf5: zstd level 1..22 (default 3)\n"
  "  --chunk-size SIZE         hdf5: uncompressed chunk size (default 1MiB)\n"
  "  -j, --threads N           worker threads (default: all cores)\n"
  "  --overwrite               replace an existing output\n"
  "  --no-verify               skip the checksums of the bytes read (zip CRC-32s; the\n"
  "                            manifest's XXH3s); structure and rank checks still run\n"
  "  -q, --quiet               no progress bar, no summary line\n"
  "  -h, --help                this help\n";

static zck_status run_to_universal(const char *src, const char *out, void *opts) {
  return zck_to_universal(src, out, (zck_universal_opts *)opts);
}

int zck_cmd_to_universal(int argc, char **argv) {
  static const struct option opts[] = {
    {"format", required_argument, 0, 'f'}, {"tag", required_argument, 0, 't'},
    {"inject-missing-state", no_argument, 0, 'i'}, {"level", required_argument, 0, 'l'},
    /* ds_to_universal.py's spellings, as consolidate takes zero_to_fp32.py's */
    {"inject_missing_state", no_argument, 0, 'i'}, {"input_folder", required_argument, 0, 'I'},
    {"output_folder", required_argument, 0, 'O'},
    {"chunk-size", required_argument, 0, 'c'}, {"threads", required_argument, 0, 'j'},
    {"overwrite", no_argument, 0, 'o'}, {"no-verify", no_argument, 0, 'V'}, {"quiet", no_argument, 0, 'q'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};
  zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
  bool quiet = false, format_given = false;
  const char *in_opt = NULL, *out_opt = NULL; /* --input_folder, --output_folder */
  int c, rc;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":hqt:j:", opts, NULL)) != -1) {
    switch (c) {
    case 'f':
      format_given = true;
      if (!strcmp(optarg, "ds")) o.format = ZCK_UNIVERSAL_DS;
      else if (!strcmp(optarg, "hdf5") || !strcmp(optarg, "h5")) o.format = ZCK_UNIVERSAL_HDF5;
      else return zck_cli_usage_error("to-universal", "--format must be ds or hdf5, not '%s'", optarg);
      break;
    case 't': o.tag = optarg; break;
    case 'i': o.inject_missing_state = 1; break;
    case 'I': in_opt = optarg; break;
    case 'O': out_opt = optarg; break;
    case 'l': {
      char *end;
      long n = strtol(optarg, &end, 10);
      if (*end || n < 1 || n > 22) return zck_cli_usage_error("to-universal", "--level must be 1..22");
      o.level = (int)n;
      break;
    }
    case 'c':
      if (zck_parse_size(optarg, &o.chunk_bytes) != ZCK_OK || o.chunk_bytes == 0 || o.chunk_bytes > ((uint64_t)1 << 30))
        return zck_cli_usage_error("to-universal", "--chunk-size: cannot read '%s' (e.g. 1MiB, 4MB; at most 1GiB)", optarg);
      break;
    case 'j':
      if ((rc = zck_cli_opt_threads("to-universal", optarg, &o.threads))) return rc;
      break;
    case 'o': o.overwrite = 1; break;
    case 'V': o.no_verify = 1; break;
    case 'q': quiet = true; break;
    case 'h': fputs(zck__to_universal_help, stdout); return ZCK_EXIT_OK;
    default: return zck_cli_bad_option("to-universal", c, argc, argv, opts);
    }
  }
  if (argc - optind != 2 - (in_opt != NULL) - (out_opt != NULL))
    return zck_cli_usage_error("to-universal", "expected CHECKPOINT and OUT");
  for (int i = optind; i < argc; i++)
    if (!argv[i][0]) return zck_cli_usage_error("to-universal", "empty path argument");
  const char *src = in_opt ? in_opt : argv[optind++];
  const char *out = out_opt ? out_opt : argv[optind];
  if (!src[0] || !out[0]) return zck_cli_usage_error("to-universal", "empty path argument");
  /* an OUT named *.h5 / *.hdf5 is the one-file container unless --format says otherwise
   * (as consolidate and convert take the output kind from OUT's name) */
  size_t n = strlen(out);
  if (!format_given && ((n >= 3 && !strcmp(out + n - 3, ".h5")) || (n >= 5 && !strcmp(out + n - 5, ".hdf5"))))
    o.format = ZCK_UNIVERSAL_HDF5;
  /* --format ds given: a folder, whatever its name; else a name like another file's is refused */
  if (!format_given && o.format != ZCK_UNIVERSAL_HDF5 && (rc = zck_cli_check_folder_out("to-universal", out))) return rc;
  /* the HDF5 writer is one process (libhdf5 places each chunk in the file as it comes):
   * in a distributed job rank 0 writes it alone, the other ranks wait */
  if (o.format == ZCK_UNIVERSAL_HDF5 && zck_cli_dist_solo()) return ZCK_EXIT_OK;
  zck_cli_ckpt_job job = {"to-universal", "converting", o.tag, quiet, &o.progress, &o.progress_ctx, &o.summary, run_to_universal, &o};
  return zck_cli_run_from_checkpoint(&job, src, out);
}
