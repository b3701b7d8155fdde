/* cmd_reshard.c: `zckpt reshard SRC OUT --to-stage S --to-world-size W` (SRC a DeepSpeed,
 * universal or torch Distributed Checkpoint), and `--to-format dcp` for the torch
 * Distributed Checkpoint FSDP2 would save. */
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_dist.h"
#include "commands.h"

static const char zck__reshard_help[] =
  "usage: zckpt reshard [options] SRC OUT --to-stage {1,2,3} --to-world-size W\n"
  "       zckpt reshard [options] DCP OUT --to-format deepspeed\n"
  "       zckpt reshard [options] SRC OUT --to-format dcp|dcp-accelerate [--to-world-size W]\n"
  "\n"
  "Rewrites a DeepSpeed checkpoint for another ZeRO stage and GPU count, with all\n"
  "optimizer state (fp32 master weights, exp_avg, exp_avg_sq, step), scheduler, counters\n"
  "and param groups, so that plain DeepSpeed resumes from it with engine.load_checkpoint\n"
  "(no load_universal needed). SRC: a save root with `latest`, a tag folder, an HF\n"
  "checkpoint-N/ folder (its other files are carried over; rng_state_<r>.pth of ranks\n"
  "beyond the new world size are dropped), a universal folder (ds_to_universal.py or\n"
  "`zckpt to-universal`: the folder, or the folder holding latest_universal), or a\n"
  "universal container written by `zckpt to-universal --format hdf5`. A folder with both\n"
  "`latest` and `latest_universal` is read as the DeepSpeed checkpoint. OUT: a new save\n"
  "root. Refused before anything is written: a source without optimizer state, a\n"
  "universal checkpoint missing a state, param groups the target cannot hold.\n"
  "\n"
  "SRC may also be a torch Distributed Checkpoint (FSDP2's dcp.save of get_state_dict,\n"
  "Accelerate's or HF Trainer's FSDP checkpoint): OUT is then what DeepSpeed saves at\n"
  "--to-stage (default 3) and --to-world-size (default: the ranks that saved it), with\n"
  "the fp32 weights, Adam's exp_avg, exp_avg_sq and step, and the param groups; tied\n"
  "weights become one param and its alias, unsharded tensors buffers. It has no scheduler\n"
  "state (load it with load_lr_scheduler_states=False into a run that has a scheduler),\n"
  "unless SRC is an HF Trainer FSDP checkpoint-N: its scheduler.pt is then the scheduler's\n"
  "state, and its other files are carried over as from a DeepSpeed checkpoint-N.\n"
  "\n"
  "With --to-format dcp, OUT is a torch Distributed Checkpoint (.metadata,\n"
  "__<r>_0.distcp) as FSDP2 saves dcp.save({\"model\": ..., \"optim\": ...}) from\n"
  "get_state_dict at W ranks: fp32 weights, Adam's exp_avg, exp_avg_sq and step, and the\n"
  "param groups' settings, keyed by FQN; load it with dcp.load and set_state_dict.\n"
  "With --to-format dcp-accelerate, OUT holds the same items as Accelerate's save_state\n"
  "and the HF Trainer save an FSDP model (FSDP1 or FSDP2, SHARDED_STATE_DICT):\n"
  "pytorch_model_fsdp_0/ ({\"model\": ...}) and optimizer_0/ ({\"optimizer\": ...}), for\n"
  "accelerator.load_state(OUT) (a DeepSpeed source does not say which loader is yours).\n"
  "From an HF Trainer DeepSpeed checkpoint-N, its other files come along (trainer_state\n"
  ".json, scheduler.pt, rng_state_<r>.pth of ranks below W): OUT is then a checkpoint-N\n"
  "the Trainer's FSDP run resumes from (resume_from_checkpoint=OUT).\n"
  "SRC: any of the above; --to-stage, --to-tp-size and --sub-group-size do not apply.\n"
  "\n"
  "options:\n"
  "  --to-format F            deepspeed (default), dcp or dcp-accelerate\n"
  "  --to-stage S             target ZeRO stage (default: the source's; a DCP's: 3)\n"
  "  --to-dtype D             DCP source: fp32 or bf16, the 16-bit dtype of the DeepSpeed\n"
  "                           run (default: the DCP's weights' dtype; FSDP2 mixed precision\n"
  "                           saves fp32 weights, so a bf16 run needs bf16 here)\n"
  "  --to-world-size W        target data-parallel world size (default: the source's)\n"
  "  --to-tp-size T           1 (default) writes plain ZeRO; T > 1 writes DeepSpeed AutoTP\n"
  "                           files (every mp_rank_0t) for its AutoTP engine at TP size T and\n"
  "                           the new DP size, split by DeepSpeed 0.19.8's rules; a T other\n"
  "                           than an AutoTP source's own reads the model config\n"
  "  --model-config FILE      config.json for --to-tp-size (default: config.json in SRC's\n"
  "                           checkpoint folder, where Hugging Face's Trainer saves it)\n"
  "  --to-ep-size E           DeepSpeed AutoEP source: the target's expert-parallel size\n"
  "                           (default: the source's); written in AutoEP's own layout at the\n"
  "                           target stage (ZeRO-1/2 expert files, ZeRO-3 shards) for\n"
  "                           load_checkpoint\n"
  "  --sub-group-size N       ZeRO-3 target: sub_group_size of the target run (default:\n"
  "                           the source's, else 1e9); less than 1e18\n"
  "  --to-offload O           keep (default), none or nvme: where the optimizer state\n"
  "                           goes. nvme (ZeRO-3 targets; keep does it for an NVMe-offloaded\n"
  "                           source): the sub-groups DeepSpeed swaps at the target world\n"
  "                           size as swap files in offloaded_tensors/rank<RR>/, for a run\n"
  "                           with the source's NVMe config; none: all in the rank files\n"
  "  --swap-min-bytes N       NVMe target: the smallest fp32 partition DeepSpeed swaps,\n"
  "                           max(MIN_AIO_BYTES, aio.block_size) of the run (default: found\n"
  "                           from what the source swapped; refused where that is unsure)\n"
  "  -t, --tag TAG            DeepSpeed source: the tag instead of `latest`\n"
  "  -j, --threads N          worker threads (default: all cores)\n"
  "  --overwrite              replace an existing OUT\n"
  "  --force                  read a zckpt-written SRC whose manifest is missing\n"
  "  --no-verify              skip the checksums of the bytes read (zip CRC-32s; the\n"
  "                           manifest's XXH3s); structure and rank checks still run\n"
  "  -q, --quiet              no progress bar, no summary line\n"
  "  -h, --help               this help\n";

static bool zck__parse_u64(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  /* digits, an optional fraction and exponent (1e9, as DeepSpeed configs write it); strtod
   * alone would also take " 2", "0x2" and "infinity" */
  if (!s || !isdigit((unsigned char)*s) || strpbrk(s, "xXpP")) return false;
  double d = strtod(s, &end); /* accepts 1e9 as DeepSpeed configs write it */
  if (*end || d < 1 || d > (double)max || d != (double)(uint64_t)d) return false;
  *out = (uint64_t)d;
  return true;
}

static zck_status run_reshard(const char *src, const char *out, void *opts) {
  return zck_reshard(src, out, (zck_reshard_opts *)opts);
}

int zck_cmd_reshard(int argc, char **argv) {
  static const struct option opts[] = {
    {"to-stage", required_argument, 0, 's'}, {"to-world-size", required_argument, 0, 'w'},
    {"sub-group-size", required_argument, 0, 'g'}, {"tag", required_argument, 0, 't'},
    {"threads", required_argument, 0, 'j'}, {"overwrite", no_argument, 0, 'o'}, {"force", no_argument, 0, 'F'},
    {"no-verify", no_argument, 0, 'V'}, {"to-tp-size", required_argument, 0, 'T'},
    {"model-config", required_argument, 0, 'M'}, {"to-format", required_argument, 0, 'f'},
    {"to-dtype", required_argument, 0, 'D'}, {"to-offload", required_argument, 0, 'O'},
    {"swap-min-bytes", required_argument, 0, 'S'}, {"to-ep-size", required_argument, 0, 'E'},
    {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  bool quiet = false;
  uint64_t v;
  int c, rc;
  bool format_named = false;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":hqt:j:", opts, NULL)) != -1) {
    switch (c) {
    case 's':
      if (!zck__parse_u64(optarg, 3, &v)) return zck_cli_usage_error("reshard", "--to-stage must be 1, 2 or 3");
      o.to_stage = (int)v;
      break;
    case 'w':
      if (!zck__parse_u64(optarg, 1u << 20, &v)) return zck_cli_usage_error("reshard", "--to-world-size must be a positive integer");
      o.to_world_size = (uint32_t)v;
      break;
    case 'g':
      if (!zck__parse_u64(optarg, UINT64_MAX / 2, &v)) return zck_cli_usage_error("reshard", "--sub-group-size must be a positive integer");
      o.sub_group_size = v;
      break;
    case 'T':
      if (!zck__parse_u64(optarg, 4096, &v)) return zck_cli_usage_error("reshard", "--to-tp-size must be a positive integer");
      o.to_tp_size = (uint32_t)v;
      break;
    case 'E':
      if (!zck__parse_u64(optarg, 1u << 20, &v)) return zck_cli_usage_error("reshard", "--to-ep-size must be a positive integer");
      o.to_ep_size = (uint32_t)v;
      break;
    case 'M': o.model_config = optarg; break;
    case 'f':
      format_named = true;
      if (!strcmp(optarg, "dcp")) o.to_format = ZCK_RESHARD_TO_DCP;
      else if (!strcmp(optarg, "dcp-accelerate")) o.to_format = ZCK_RESHARD_TO_DCP_ACCELERATE;
      else if (!strcmp(optarg, "deepspeed")) o.to_format = ZCK_RESHARD_TO_DEEPSPEED;
      else return zck_cli_usage_error("reshard", "--to-format must be deepspeed, dcp or dcp-accelerate");
      break;
    case 'D':
      o.to_dtype = zck_dtype_parse(optarg);
      if (o.to_dtype != ZCK_F32 && o.to_dtype != ZCK_BF16 && o.to_dtype != ZCK_F16)
        return zck_cli_usage_error("reshard", "--to-dtype must be fp32, bf16 or fp16, not '%s'", optarg);
      break;
    case 'O':
      if (!strcmp(optarg, "keep")) o.to_offload = ZCK_RESHARD_OFFLOAD_KEEP;
      else if (!strcmp(optarg, "none")) o.to_offload = ZCK_RESHARD_OFFLOAD_NONE;
      else if (!strcmp(optarg, "nvme")) o.to_offload = ZCK_RESHARD_OFFLOAD_NVME;
      else return zck_cli_usage_error("reshard", "--to-offload must be keep, none or nvme");
      break;
    case 'S':
      if (!zck__parse_u64(optarg, UINT64_MAX / 2, &v)) return zck_cli_usage_error("reshard", "--swap-min-bytes must be a positive integer");
      o.swap_min_bytes = v;
      break;
    case 't': o.tag = optarg; break;
    case 'j':
      if ((rc = zck_cli_opt_threads("reshard", optarg, &o.threads))) return rc;
      break;
    case 'o': o.overwrite = 1; break;
    case 'F': o.force = 1; break;
    case 'V': o.no_verify = 1; break;
    case 'q': quiet = true; break;
    case 'h': fputs(zck__reshard_help, stdout); return ZCK_EXIT_OK;
    default: return zck_cli_bad_option("reshard", c, argc, argv, opts);
    }
  }
  if (argc - optind != 2) return zck_cli_usage_error("reshard", "expected SRC and OUT");
  for (int i = optind; i < argc; i++)
    if (!argv[i][0]) return zck_cli_usage_error("reshard", "empty path argument");
  /* a DeepSpeed source resharded to itself is a mistake worth a hint; a named format is a
   * change of its own (a DCP to DeepSpeed takes the defaults: stage 3, the DCP's ranks) */
  if (!o.to_stage && !o.to_world_size && !o.to_tp_size && !o.to_ep_size && !o.to_dtype && !format_named)
    return zck_cli_usage_error("reshard", "give --to-stage and/or --to-world-size (or --to-format for another format)");
  if (o.to_stage && o.to_format != ZCK_RESHARD_TO_DEEPSPEED)
    return zck_cli_usage_error("reshard", "--to-stage: a DCP checkpoint has no ZeRO stage");
  zck_cli_ckpt_job job = {"reshard", "resharding", o.tag, quiet, &o.progress, &o.progress_ctx, &o.summary, run_reshard, &o};
  if ((rc = zck_cli_check_folder_out("reshard", argv[optind + 1]))) return rc;
  return zck_cli_run_from_checkpoint(&job, argv[optind], argv[optind + 1]);
}
