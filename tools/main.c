/* main.c: the zckpt command: global options and dispatch to subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli_dist.h"
#include "commands.h"

static const zck_cli_command zck_commands[] = {
#ifdef ZCK_HAVE_CMD_INSPECT
  {"inspect", "show the tensors of a .pt, safetensors or DeepSpeed checkpoint", zck_cmd_inspect},
#endif
#ifdef ZCK_HAVE_CMD_CONVERT
  {"convert", "convert a state dict between .pt/.bin and safetensors (sharded or not)", zck_cmd_convert},
#endif
#ifdef ZCK_HAVE_CMD_CONSOLIDATE
  {"consolidate", "DeepSpeed ZeRO-1/2/3 checkpoint -> safetensors, bit-exact with zero_to_fp32", zck_cmd_consolidate},
#endif
#ifdef ZCK_HAVE_CMD_RESHARD
  {"reshard", "DeepSpeed checkpoint -> another ZeRO stage and world size, all optimizer state", zck_cmd_reshard},
#endif
#ifdef ZCK_HAVE_CMD_TO_UNIVERSAL
  {"to-universal", "DeepSpeed checkpoint -> universal checkpoint (DeepSpeed layout or one HDF5 file)", zck_cmd_to_universal},
#endif
#ifdef ZCK_HAVE_CMD_VERIFY
  {"verify", "check a checkpoint's structure and checksums; exit 3 if damaged", zck_cmd_verify},
#endif
  {NULL, NULL, NULL},
};

static void zck_usage(FILE *f) {
  fprintf(f,
          "usage: zckpt [--help] [--version] <command> [<args>]\n"
          "\n"
          "Fast, exact, crash-safe tools for DeepSpeed ZeRO checkpoints.\n"
          "\n"
          "commands:\n");
  for (const zck_cli_command *c = zck_commands; c->name; c++) fprintf(f, "  %-12s %s\n", c->name, c->summary);
  fprintf(f,
          "\n"
          "Run 'zckpt <command> --help' for the options of a command.\n"
          "Exit status: 0 ok, 1 runtime error, 2 usage error, 3 damaged (verify).\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    zck_usage(stderr);
    return ZCK_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    zck_usage(stdout);
    return ZCK_EXIT_OK;
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
    printf("zckpt %s\n", zck_version());
    return ZCK_EXIT_OK;
  }
  for (const zck_cli_command *c = zck_commands; c->name; c++) {
    if (strcmp(c->name, cmd)) continue;
    return zck_cli_dist_run(c->name, c->run, argc - 1, argv + 1); /* plain run unless mpirun started it */
  }
  if (cmd[0] == '-') return zck_cli_usage_error(NULL, "unknown option '%s'", cmd);
  return zck_cli_usage_error(NULL, "unknown command '%s'", cmd);
}
