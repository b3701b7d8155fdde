/* ds_test_util.h: helpers shared by the DeepSpeed tests: fixture cases, expected.json,
 * materialising a param or buffer of an opened checkpoint through plan + exec. */
#ifndef ZT_DS_TEST_UTIL_H
#define ZT_DS_TEST_UTIL_H

#include "deepspeed/deepspeed.h"
#include "plan.h"
#include "test.h"

#include <cjson/cJSON.h>

/* Names of tests/fixtures/deepspeed/<case>/ folders holding expected.json, sorted. */
char **zt_ds_cases(size_t *n);
void zt_ds_free_cases(char **v, size_t n);
/* Parsed <case>/expected.json (NULL if unreadable). */
cJSON *zt_ds_expected(const char *casename);
/* <fixtures>/deepspeed/<case>/ckpt (malloc'd). */
char *zt_ds_ckpt_path(const char *casename);

/* Copies param p (whole tensor, param order) from view v into a fresh buffer of dtype
 * dt (numel elements). Returns NULL and sets the error on failure. */
void *zt_ds_read_param(const zck_ds_view *v, const zck_model *m, uint32_t p, zck_dtype dt);
/* Same for buffer b of the checkpoint's buffer view. */
void *zt_ds_read_buffer(const zck_ds_view *v, const zck_model *m, uint32_t b, zck_dtype dt);

/* cp -r src dst (dst must not exist). 0 on success. */
int zt_copy_tree(const char *src, const char *dst);

#endif
