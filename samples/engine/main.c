/* main.c: zckpt-train, the sample training engine (see train.h). */
#include "args.h"
#include "train.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  ze_train_args a;
  char err[512] = "";
  int rc = ze_args_parse(argc, argv, &a, err, sizeof err);
  if (rc == ZE_ARGS_EXIT_OK) return 0;
  if (rc == ZE_ARGS_USAGE) {
    fprintf(stderr, "zckpt-train: %s (see 'zckpt-train --help')\n", err);
    return 2;
  }
  if (ze_train_check_args(&a) != ZCK_OK) {
    fprintf(stderr, "zckpt-train: %s (see 'zckpt-train --help')\n", zck_last_error());
    return 2;
  }
  ze_train_result r;
  zck_status s = ze_train_run(&a, &r);
  if (s != ZCK_OK) {
    fprintf(stderr, "zckpt-train: error: %s\n", r.message ? r.message : zck_last_error());
    ze_train_result_free(&r);
    return 1;
  }
  for (int m = 0; m < 2; m++)
    if (r.generated[m]) {
      if (a.gather_for_generation == ZE_GATHER_BOTH)
        printf("[gather_for_generation=%s] ", m == 0 ? "on" : "off");
      printf("%s%s\n", a.prompt, r.generated[m]);
    }
  if (r.generated[0] && r.generated[1] && strcmp(r.generated[0], r.generated[1])) {
    fprintf(stderr, "zckpt-train: error: the two generation modes produced different text\n");
    ze_train_result_free(&r);
    return 1;
  }
  ze_train_result_free(&r);
  return 0;
}
