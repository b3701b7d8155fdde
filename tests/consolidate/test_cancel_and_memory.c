/* test_cancel_and_memory.c: the public API's progress cancellation, sized options and
 * in-memory state dict.
 *  - a progress callback returning non-zero stops consolidate, reshard, to-universal (both
 *    formats) and verify with ZCK_ERR_CANCELED, and nothing is left at or beside OUT;
 *  - option structs are read as far as their size field says;
 *  - zck_consolidate_open/read fill caller buffers with exactly the bytes of the tensors
 *    zck_consolidate writes (same names and dtypes), aliases sharing their source. */
#include <dirent.h>
#include <stddef.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"
#include "zck.h"

static int entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

typedef struct { int calls, stop_at; } counter;
static int stop_after(void *ctx, uint64_t done, uint64_t total) {
  counter *c = ctx;
  return ++c->calls >= c->stop_at;
}

/* The safetensors header's JSON and where data starts. */
static char *st_header(const unsigned char *f, size_t n, size_t *data_at) {
  ZT_ASSERT(n >= 8);
  uint64_t hl = 0;
  memcpy(&hl, f, 8);
  ZT_ASSERT(8 + hl <= n);
  char *h = malloc(hl + 1);
  memcpy(h, f + 8, hl);
  h[hl] = 0;
  *data_at = 8 + hl;
  return h;
}

int main(void) {
  char *src = zt_fixture("deepspeed/s3w2_bf16/ckpt");
  struct stat sb;
  if (stat(src, &sb) != 0) zt_skip("fixture deepspeed/s3w2_bf16 missing");
  char *tmp = zt_tmpdir();
  char out[4096];

  /* ---- cancel: every job, nothing left */
  for (int job = 0; job < 5; job++) {
    counter c = {0, 1};
    zck_status s;
    snprintf(out, sizeof out, "%s/out%d%s", tmp, job, job == 3 ? ".h5" : "");
    if (job == 0) {
      zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
      o.progress = stop_after;
      o.progress_ctx = &c;
      s = zck_consolidate(src, out, &o);
    } else if (job == 1) {
      zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
      o.to_world_size = 3;
      o.progress = stop_after;
      o.progress_ctx = &c;
      s = zck_reshard(src, out, &o);
    } else if (job == 2 || job == 3) {
      zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
      o.format = job == 3 ? ZCK_UNIVERSAL_HDF5 : ZCK_UNIVERSAL_DS;
      o.progress = stop_after;
      o.progress_ctx = &c;
      s = zck_to_universal(src, out, &o);
    } else {
      zck_verify_opts o = ZCK_VERIFY_OPTS_INIT;
      o.progress = stop_after;
      o.progress_ctx = &c;
      zck_verify_report *r = NULL;
      s = zck_verify(src, &o, &r);
      zck_verify_report_free(r);
    }
    if (s != ZCK_ERR_CANCELED)
      ZT_FAIL("job %d: expected canceled, got %s: %s", job, zck_status_name(s), zck_last_error());
    ZT_EQ_INT(c.calls, 1);
    ZT_EQ_INT(entries(tmp), 0);
  }

  /* ---- sized options: a caller's struct is read only as far as its size says (an older,
   * shorter one gets defaults for newer fields); one without its size is refused */
  {
    counter c = {0, 1};
    zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
    o.progress = stop_after; /* past the size below: must not be seen */
    o.progress_ctx = &c;
    o.size = offsetof(zck_consolidate_opts, progress);
    snprintf(out, sizeof out, "%s/sized.safetensors", tmp);
    ZT_OK(zck_consolidate(src, out, &o));
    ZT_EQ_INT(c.calls, 0);
    ZT_ASSERT(unlink(out) == 0);
    o.size = 0;
    ZT_ERR(zck_consolidate(src, out, &o), ZCK_ERR_INVALID_ARG, "_INIT");
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ro.size = 3;
    ZT_ERR(zck_reshard(src, out, &ro), ZCK_ERR_INVALID_ARG, "size");
    ZT_EQ_INT(entries(tmp), 0);
  }

  /* ---- the state dict in memory equals the consolidated file */
  snprintf(out, sizeof out, "%s/whole.safetensors", tmp);
  zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
  co.keep_tied = 1; /* every name in the file, aliases as copies */
  ZT_OK(zck_consolidate(src, out, &co));
  unsigned char *file = NULL;
  size_t fn = 0, data_at = 0;
  ZT_ASSERT(zt_read_file(out, &file, &fn) == 0);
  char *header = st_header(file, fn, &data_at);

  zck_state_dict *sd = NULL;
  ZT_OK(zck_consolidate_open(src, NULL, &sd));
  size_t n = zck_state_dict_count(sd);
  ZT_ASSERT(n > 0);
  ZT_ASSERT(zck_state_dict_tensor(sd, n) == NULL);
  void **bufs = calloc(n, sizeof *bufs);
  int aliases = 0;
  for (size_t i = 0; i < n; i++) {
    const zck_tensor_desc *d = zck_state_dict_tensor(sd, i);
    ZT_EQ_U64(d->nbytes, d->numel * zck_dtype_size(d->dtype));
    if (d->alias_of >= 0) { aliases++; continue; }
    bufs[i] = malloc(d->nbytes ? d->nbytes : 1);
    memset(bufs[i], 0xA5, d->nbytes);
  }
  ZT_ASSERT(aliases > 0); /* head.weight is tied to embed.weight */
  ZT_OK(zck_state_dict_read(sd, bufs));
  for (size_t i = 0; i < n; i++) {
    const zck_tensor_desc *d = zck_state_dict_tensor(sd, i);
    /* "name":{"dtype":"F32","shape":[..],"data_offsets":[a,b]} in the header */
    char key[512];
    snprintf(key, sizeof key, "\"%s\":{\"dtype\":\"%s\"", d->name, zck_dtype_safetensors_name(d->dtype));
    const char *at = strstr(header, key);
    if (!at) ZT_FAIL("%s (%s) not in the consolidated file's header", d->name, zck_dtype_name(d->dtype));
    const char *offs = strstr(at, "\"data_offsets\":[");
    unsigned long long a = 0, b = 0;
    ZT_ASSERT(offs && sscanf(offs, "\"data_offsets\":[%llu,%llu]", &a, &b) == 2);
    ZT_EQ_U64(b - a, d->nbytes);
    const void *mine = d->alias_of >= 0 ? bufs[d->alias_of] : bufs[i];
    if (d->nbytes) ZT_EQ_MEM(mine, file + data_at + a, d->nbytes);
  }
  /* cancel through the state dict's progress */
  zck_state_dict_free(sd);
  counter c = {0, 1};
  co = (zck_consolidate_opts)ZCK_CONSOLIDATE_OPTS_INIT;
  co.progress = stop_after;
  co.progress_ctx = &c;
  ZT_OK(zck_consolidate_open(src, &co, &sd));
  ZT_ERR(zck_state_dict_read(sd, bufs), ZCK_ERR_CANCELED, "canceled");
  zck_state_dict_free(sd);
  zck_state_dict_free(NULL);
  ZT_ASSERT(zck_consolidate_open(tmp, NULL, &sd) != ZCK_OK && sd == NULL); /* not a checkpoint */
  ZT_ASSERT(strstr(zck_last_error(), tmp));
  for (size_t i = 0; i < n; i++) free(bufs[i]);
  free(bufs);
  free(header);
  free(file);
  free(src);
  free(tmp);
  printf("cancel and in-memory state dict: ok\n");
  return 0;
}
