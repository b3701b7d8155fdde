/* cmd_consolidate.c: `zckpt consolidate CKPT OUT`. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>

#include "cli_dist.h"
#include "commands.h"

static const char zck__consolidate_help[] =
  "usage: zckpt consolidate [options] CHECKPOINT OUT\n"
  "\n"
  "Turns a DeepSpeed ZeRO-1/2/3 checkpoint into whole tensors, equal bit for bit to\n"
  "DeepSpeed's zero_to_fp32.py (a torch Distributed Checkpoint: to torch's\n"
  "dcp_to_torch_save). CHECKPOINT: the save root holding `latest`, a tag\n"
  "folder (global_stepN), a Hugging Face checkpoint-N/ folder, or a Trainer output_dir\n"
  "(its newest complete checkpoint-N: `latest` and its tag folder there, and a zckpt\n"
  "manifest, where there is one, intact; said on stderr), or a universal checkpoint made\n"
  "of one (ds_to_universal.py's or `zckpt to-universal`'s folder, or the folder holding\n"
  "latest_universal; the HDF5 container): the same output as from that checkpoint.\n"
  "OUT: a directory (model.safetensors, or model-0000i-of-0000N.safetensors +\n"
  "model.safetensors.index.json), or one *.safetensors or *.bin file. Reads only the fp32\n"
  "masters (partitions, fp32.pt files, datasets), frozen params and buffers, in place.\n"
  "\n"
  "options:\n"
  "  -t, --tag TAG            the tag folder to read instead of `latest` (not for\n"
  "                           universal checkpoints)\n"
  "  --dtype fp32|bf16|fp16   cast floating tensors (default: zero_to_fp32's dtypes:\n"
  "                           fp32 params, frozen params in their 16-bit dtype)\n"
  "  --max-shard-size SIZE    HF shard size (5GB, 500MB, 2GiB); default 5GB\n"
  "  --format safetensors|pt|both|torch-save|torch-safetensors\n"
  "                           pt: pytorch_model.bin; both: the two (default safetensors);\n"
  "                           torch-save (a torch Distributed Checkpoint only): OUT is the\n"
  "                           one file torch's dcp_to_torch_save writes, byte for byte: the\n"
  "                           whole state dict, optimizer state and param groups included;\n"
  "                           torch-safetensors (a DCP saved with safetensors storage,\n"
  "                           shard-*.safetensors): OUT is the folder torch's\n"
  "                           consolidate_safetensors_files writes, byte for byte\n"
  "                           (model-0000i-of-0000N.safetensors + model.safetensors.index.json)\n"
  "                           (the two take none of --tag, --dtype, --max-shard-size,\n"
  "                           --exclude-frozen, --keep-tied)\n"
  "  --fqn-to-index FILE      torch-safetensors: torch's fqn_to_index_mapping, a JSON file\n"
  "                           {name: i} or an index whose weight_map names each tensor's\n"
  "                           file (model-0000i-of-0000N.safetensors); default: the save's,\n"
  "                           read from the shard names (all in file 1 if it had none)\n"
  "  --exclude-frozen         leave frozen parameters out\n"
  "  (zero_to_fp32.py's --max_shard_size, --exclude_frozen_parameters and\n"
  "   --safe_serialization are accepted too)\n"
  "  --keep-tied              write tied aliases as tensors too (default: once, as\n"
  "                           save_pretrained; the alias is recorded in the metadata)\n"
  "  -j, --threads N          worker threads (default: all cores)\n"
  "  --overwrite              replace an existing output\n"
  "  --force                  read a zckpt-written checkpoint whose manifest is missing\n"
  "  --no-verify              skip the checksums of the bytes read (zip CRC-32s; the\n"
  "                           manifest's XXH3s); structure and rank checks still run\n"
  "  -q, --quiet              no progress bar, no summary line\n"
  "  -h, --help               this help\n";

/* --format torch-save: torch's dcp_to_torch_save(CHECKPOINT, OUT) (jobs/consolidate_torch_save.c). */
static int consolidate_torch_save(const char *in, const char *out_arg, zck_consolidate_opts *o, const char *model_only,
                                  bool quiet) {
  if (model_only)
    return zck_cli_usage_error("consolidate", "--format torch-save writes the whole state dict as torch does: %s does not apply",
                               model_only);
  char *picked = NULL, *out = NULL;
  int rc;
  if ((rc = zck_cli_pick_checkpoint(in, "consolidating", quiet || zck_cli_dist_quiet(), &picked))) return rc;
  if (picked) in = picked;
  if ((rc = zck_cli_resolve_out(out_arg, &out))) { free(picked); return rc; }
  zck_cli_set_output(out);
  zck_cli_progress bar;
  zck_cli_progress_init(&bar, "consolidate", 0, quiet);
  o->progress = zck_cli_progress_cb;
  o->progress_ctx = &bar;
  double started = zck_cli_now();
  zck_status s = zck_dcp_to_torch_save(in, out, o);
  zck_cli_progress_finish(&bar);
  struct stat st;
  zck_job_summary sum = {1, 1, s == ZCK_OK && stat(out, &st) == 0 ? (uint64_t)st.st_size : 0};
  free(out);
  free(picked);
  if (s == ZCK_OK) zck_cli_summary(out_arg, "file", &sum, started, quiet || zck_cli_dist_quiet());
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}

/* --format torch-safetensors: torch's consolidate_safetensors_files(CHECKPOINT, OUT, mapping)
 * (jobs/consolidate_torch_st.c). */
static int consolidate_torch_st(const char *in, const char *out_arg, const char *fqn_to_index, zck_consolidate_opts *o,
                                const char *model_only, bool quiet) {
  if (model_only)
    return zck_cli_usage_error("consolidate", "--format torch-safetensors writes what torch writes: %s does not apply",
                               model_only);
  char *out = NULL;
  int rc;
  if ((rc = zck_cli_check_folder_out("consolidate", out_arg))) return rc;
  if ((rc = zck_cli_resolve_out(out_arg, &out))) return rc;
  if ((rc = zck_cli_check_out_not_in(in, out, NULL))) { free(out); return rc; }
  zck_cli_set_output(out);
  zck_cli_progress bar;
  zck_cli_progress_init(&bar, "consolidate", 0, quiet);
  o->progress = zck_cli_progress_cb;
  o->progress_ctx = &bar;
  zck_job_summary sum;
  o->summary = quiet || zck_cli_dist_quiet() ? NULL : &sum;
  double started = zck_cli_now();
  zck_status s = zck_dcp_consolidate_safetensors(in, out, fqn_to_index, o);
  zck_cli_progress_finish(&bar);
  free(out);
  if (s == ZCK_OK) zck_cli_summary(out_arg, "tensor", &sum, started, quiet || zck_cli_dist_quiet());
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}

int zck_cmd_consolidate(int argc, char **argv) {
  static const struct option opts[] = {
    {"tag", required_argument, 0, 't'}, {"dtype", required_argument, 0, 'd'},
    {"max-shard-size", required_argument, 0, 's'}, {"format", required_argument, 0, 'f'},
    {"exclude-frozen", no_argument, 0, 'x'}, {"keep-tied", no_argument, 0, 'k'},
    {"threads", required_argument, 0, 'j'}, {"overwrite", no_argument, 0, 'o'}, {"force", no_argument, 0, 'F'},
    {"no-verify", no_argument, 0, 'V'}, {"fqn-to-index", required_argument, 0, 'I'},
    {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'},
    /* DeepSpeed zero_to_fp32.py's spellings (safetensors is what a folder OUT gets anyway) */
    {"max_shard_size", required_argument, 0, 's'}, {"exclude_frozen_parameters", no_argument, 0, 'x'},
    {"safe_serialization", no_argument, 0, 'S'}, {0, 0, 0, 0}};
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  bool quiet = false;
  const char *format = NULL;
  bool torch_save = false, torch_st = false;
  const char *fqn_to_index = NULL;
  const char *model_only = NULL;   /* an option that shapes the model output, which torch-save does not take */
  int c, rc;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":hqt:j:", opts, NULL)) != -1) {
    switch (c) {
    case 't': o.tag = optarg; model_only = "--tag"; break;
    case 'd':
      model_only = "--dtype";
      if ((rc = zck_cli_opt_float_dtype("consolidate", optarg, &o.dtype))) return rc;
      break;
    case 's':
      model_only = "--max-shard-size";
      if ((rc = zck_cli_opt_shard_size("consolidate", optarg, &o.max_shard_size))) return rc;
      break;
    case 'f':
      format = optarg;
      if (!strcmp(optarg, "safetensors")) { o.safetensors = 1; o.torch_bin = 0; }
      else if (!strcmp(optarg, "pt")) { o.safetensors = 0; o.torch_bin = 1; }
      else if (!strcmp(optarg, "both")) { o.safetensors = 1; o.torch_bin = 1; }
      else if (!strcmp(optarg, "torch-save")) torch_save = true;
      else if (!strcmp(optarg, "torch-safetensors")) torch_st = true;
      else return zck_cli_usage_error("consolidate", "--format must be safetensors, pt, both, torch-save or torch-safetensors");
      break;
    case 'x': o.exclude_frozen = 1; model_only = "--exclude-frozen"; break;
    case 'S': break;
    case 'k': o.keep_tied = 1; model_only = "--keep-tied"; break;
    case 'j':
      if ((rc = zck_cli_opt_threads("consolidate", optarg, &o.threads))) return rc;
      break;
    case 'o': o.overwrite = 1; break;
    case 'F': o.force = 1; break;
    case 'V': o.no_verify = 1; break;
    case 'I': fqn_to_index = optarg; break;
    case 'q': quiet = true; break;
    case 'h': fputs(zck__consolidate_help, stdout); return ZCK_EXIT_OK;
    default: return zck_cli_bad_option("consolidate", c, argc, argv, opts);
    }
  }
  if (argc - optind != 2) return zck_cli_usage_error("consolidate", "expected CHECKPOINT and OUT");
  for (int i = optind; i < argc; i++)
    if (!argv[i][0]) return zck_cli_usage_error("consolidate", "empty path argument");
  if (fqn_to_index && !torch_st)
    return zck_cli_usage_error("consolidate", "--fqn-to-index is torch's mapping: it goes with --format torch-safetensors");
  if (torch_save) return consolidate_torch_save(argv[optind], argv[optind + 1], &o, model_only, quiet);
  if (torch_st) return consolidate_torch_st(argv[optind], argv[optind + 1], fqn_to_index, &o, model_only, quiet);
  const char *in = argv[optind];
  char *picked = NULL;
  if (!o.tag && (rc = zck_cli_pick_checkpoint(in, "consolidating", quiet || zck_cli_dist_quiet(), &picked))) return rc;
  if (picked) in = picked;
  char *out = NULL;
  if ((rc = zck_cli_resolve_out(argv[optind + 1], &out))) { free(picked); return rc; }
  /* an OUT file's name says its format: a --format asking for something else would be ignored */
  size_t n = strlen(out);
  bool st_file = n >= 12 && !strcmp(out + n - 12, ".safetensors");
  bool pt_file = (n >= 3 && !strcmp(out + n - 3, ".pt")) || (n >= 4 && !strcmp(out + n - 4, ".bin")) ||
                 (n >= 4 && !strcmp(out + n - 4, ".pth"));
  /* OUT is one .safetensors / .bin / .pt / .pth file, or a folder */
  if (!st_file && !pt_file && (rc = zck_cli_check_folder_out("consolidate", argv[optind + 1]))) {
    free(out);
    free(picked);
    return rc;
  }
  if (format && ((st_file && o.torch_bin) || (pt_file && o.safetensors))) {
    free(out);
    free(picked);
    return zck_cli_usage_error("consolidate", "--format %s does not fit OUT '%s' (one %s file); give a folder as OUT", format,
                               argv[optind + 1], st_file ? "safetensors" : "torch");
  }
  if ((rc = zck_cli_check_out_not_in(in, out, o.tag))) { free(out); free(picked); return rc; }
  zck_cli_set_output(out);
  zck_cli_progress bar;
  zck_cli_progress_init(&bar, "consolidate", 0, quiet);
  o.progress = zck_cli_progress_cb;
  o.progress_ctx = &bar;
  zck_job_summary sum;
  o.summary = quiet || zck_cli_dist_quiet() ? NULL : &sum; /* counting OUT's files is a walk of it: only for the line */
  double started = zck_cli_now();
  const char *src = in;
  if ((rc = zck_cli_dist_source(in, &src))) { free(out); return rc; } /* node-local files under mpirun */
  zck_status s = zck_consolidate(src, out, &o);
  zck_cli_progress_finish(&bar);
  free(out); /* the signal thread keeps its own copy */
  free(picked);
  if (s == ZCK_OK) zck_cli_summary(argv[optind + 1], "tensor", &sum, started, quiet || zck_cli_dist_quiet());
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}
