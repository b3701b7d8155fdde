/* ds_reshard_tool.c: a test helper: reshard a DeepSpeed checkpoint with the library
 * (zck_ds_open -> zck_ds_writer_create -> zck_ds_copy -> commit).
 *   ds_reshard_tool SRC DST STAGE WORLD [SUB_GROUP_SIZE] */
#include "deepspeed/deepspeed.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s SRC DST STAGE WORLD [SUB_GROUP_SIZE]\n", argv[0]);
    return 2;
  }
  zck_ds_ckpt *c = NULL;
  zck_ds_writer *w = NULL;
  if (zck_ds_open(argv[1], NULL, &c) != ZCK_OK) goto fail;
  zck_ds_write_opts o;
  zck_ds_write_opts_from(c, &o);
  o.stage = atoi(argv[3]);
  o.world_size = (uint32_t)atoi(argv[4]);
  o.sub_group_size = argc > 5 ? strtoull(argv[5], NULL, 10) : (o.stage == 3 ? o.sub_group_size : 0);
  if (o.stage != 3) o.sub_group_size = 0;
  if (o.stage == 3) o.param_align = 1, o.round_robin = false;
  if (zck_ds_writer_create(argv[2], zck_ds_model(c), &o, &w) != ZCK_OK) goto fail;
  if (zck_ds_copy(c, w, NULL) != ZCK_OK || zck_ds_writer_commit(w) != ZCK_OK) goto fail;
  zck_ds_writer_free(w);
  zck_ds_close(c);
  return 0;
fail:
  fprintf(stderr, "ds_reshard_tool: error: %s\n", zck_last_error());
  zck_ds_writer_free(w);
  zck_ds_close(c);
  return 1;
}
