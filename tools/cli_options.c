/* cli_options.c: the option values several subcommands share, parsed one way. */
#include "cli.h"

#include <stdlib.h>

int zck_cli_opt_threads(const char *cmd, const char *arg, unsigned *out) {
  char *end;
  long n = strtol(arg, &end, 10);
  if (end == arg || *end || n < 1 || n > 256) return zck_cli_usage_error(cmd, "--threads must be 1..256, not '%s'", arg);
  *out = (unsigned)n;
  return ZCK_EXIT_OK;
}

int zck_cli_opt_float_dtype(const char *cmd, const char *arg, zck_dtype *out) {
  zck_dtype t = zck_dtype_parse(arg);
  if (t != ZCK_F32 && t != ZCK_BF16 && t != ZCK_F16)
    return zck_cli_usage_error(cmd, "--dtype must be fp32, bf16 or fp16, not '%s'", arg);
  *out = t;
  return ZCK_EXIT_OK;
}

int zck_cli_opt_shard_size(const char *cmd, const char *arg, uint64_t *out) {
  if (zck_parse_size(arg, out) != ZCK_OK || *out == 0)
    return zck_cli_usage_error(cmd, "--max-shard-size: cannot read '%s' (e.g. 5GB, 500MB, 2GiB)", arg);
  return ZCK_EXIT_OK;
}

