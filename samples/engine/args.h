/* args.h: zckpt-train's command line, in Hugging Face TrainingArguments spelling
 * (--per-device-train-batch-size; --per_device_train_batch_size is accepted too). */
#ifndef ZE_ARGS_H
#define ZE_ARGS_H

#include "train.h"

#include <stdio.h>

enum { ZE_ARGS_OK = 0, ZE_ARGS_EXIT_OK = 1, ZE_ARGS_USAGE = 2 };

/* Parses argv[1..] into a (defaults first). Returns ZE_ARGS_OK, ZE_ARGS_EXIT_OK (--help or
 * --version printed to stdout), or ZE_ARGS_USAGE with a one-line reason in err. Strings in a
 * point into argv. */
int ze_args_parse(int argc, char **argv, ze_train_args *a, char *err, size_t cap);
void ze_args_usage(FILE *f);

#endif
