/* commands.h: the subcommands of zckpt, one file each (cmd_<name>.c). */
#ifndef ZCK_COMMANDS_H
#define ZCK_COMMANDS_H

#include "cli.h"

int zck_cmd_inspect(int argc, char **argv);
int zck_cmd_convert(int argc, char **argv);
int zck_cmd_consolidate(int argc, char **argv);
int zck_cmd_reshard(int argc, char **argv);
int zck_cmd_to_universal(int argc, char **argv);
int zck_cmd_verify(int argc, char **argv);

#endif
